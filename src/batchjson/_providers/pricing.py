"""Token prices in USD per million tokens: a user's (``prices=``, :func:`set_prices`) first, then
genai-prices' data for OpenAI's and Anthropic's models; an unknown model costs None, not a guess."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from importlib.metadata import version
from typing import Annotated, Any

from pydantic import Field

from .._checks import options
from .._errors import ConfigError
from .._secrets import looks_like_key, masked

# The price data's release: genai-prices' own (never its UpdatePrices download).
PRICES_AS_OF = f"genai-prices {version('genai-prices')}"

# What a provider batch job bills of the live price when no price says: half, as both publish.
BATCH_PRICE_FACTOR = 0.5

# A model is priced among these hosts' own only: a local "llama-3" is never another's model.
DATA_PROVIDERS = ("openai", "anthropic")

PerMillion = Annotated[float, Field(ge=0, allow_inf_nan=False,
                                    description="a number >= 0 (USD per million tokens)")]
PerMillionOrNone = Annotated[float | None, Field(ge=0, allow_inf_nan=False, description=(
    "a number >= 0 (USD per million tokens), or None to bill as plain input"))]


@options(ConfigError)
class Price:
    """USD per million tokens for one model, checked when made. Beyond ``max_input_tokens`` (a
    long-context tier) :func:`cost_of` returns ``None`` rather than a wrong number."""

    input: PerMillion
    output: PerMillion
    cached_input: PerMillionOrNone = None
    cache_write: PerMillionOrNone = None
    max_input_tokens: Annotated[int | None, Field(ge=1, description=(
        "a whole number of tokens or None"))] = None
    batch: Annotated[float, Field(ge=0, allow_inf_nan=False, description=(
        "the share of the live price a batch job bills, a number >= 0 (0.5: half)"))
    ] = BATCH_PRICE_FACTOR


_lock = threading.Lock()
_user_prices: dict[str, Price] = {}


def as_price(value: Any) -> Price:
    """Accept a Price, a mapping with input/output[/cached_input/cache_write], or a tuple."""
    if isinstance(value, Price):
        return value
    if isinstance(value, Mapping):
        if not {"input", "output"} <= set(value) <= set(Price.__dataclass_fields__):
            raise ConfigError(f"a price mapping needs 'input' and 'output' (USD per million "
                             f"tokens) and may add cached_input, cache_write, max_input_tokens, "
                             f"batch; got {dict(value)!r}")
        return Price(**{field: _number(v) for field, v in value.items()})
    if isinstance(value, (tuple, list)) and 2 <= len(value) <= 4:
        return Price(*(_number(v) for v in value))
    raise ConfigError(f"cannot read a price from {value!r}; use Price(input, output, "
                     "cached_input) or {'input': ..., 'output': ...} in USD per million tokens")


def _number(value: Any) -> Any:
    """A numeric string (from a config file) as a float; anything else for Price to check."""
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
        return value


def normalize_prices(mapping: Mapping[str, Any] | None) -> dict[str, Price]:
    """Check a user's price mapping up front, so a typo fails at setup rather than mid-batch."""
    if not mapping:
        return {}
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"prices must map model names to prices, e.g. {{'my-model': "
                           f"{{'input': 0.15, 'output': 0.60}}}}; got {type(mapping).__name__}")
    out = {}
    for model, value in mapping.items():
        try:
            out[str(model)] = as_price(value)
        except ValueError as exc:
            name = masked(str(model)) if looks_like_key(str(model)) else repr(model)
            raise ConfigError(f"price for model {name}: {exc}") from None
    return out


def set_prices(mapping: Mapping[str, Any] | None, *, replace: bool = False) -> None:
    """Override or extend the process-wide table (``replace=True`` drops earlier overrides)."""
    checked = normalize_prices(mapping)
    with _lock:
        if replace:
            _user_prices.clear()
        _user_prices.update(checked)


def price_for(model: str | None, overrides: Mapping[str, Any] | None = None) -> Price | None:
    """The user's price for ``model`` (or for a name the data gives the same model: a dated
    snapshot bills like its alias), else the data's; ``None`` when neither knows it."""
    if not model:
        return None
    with _lock:
        for table in (overrides or {}, _user_prices):
            name = model if model in table else next(
                (name for name in table if _same_model(model, name)), None)
            if name is not None:
                return as_price(table[name])
    listed = _listed(model)
    return None if listed is None else listed[1]


@lru_cache(maxsize=4096)
def _same_model(model: str, name: str) -> bool:
    """Whether the data takes ``name`` for ``model`` (a dated snapshot and its alias)."""
    listed = _listed(model)
    return listed is not None and listed[0].is_match(name)


@lru_cache(maxsize=1024)
def _listed(model: str) -> tuple[Any, Price] | None:
    """``model``'s entry in the price data with its price, or None; cached (a miss scans all)."""
    from genai_prices.data_snapshot import get_snapshot  # loads on first use, not on import

    for provider in DATA_PROVIDERS:
        try:
            info = get_snapshot().find_provider_model(model, None, provider, None)[1]
        except LookupError:
            continue
        price = _from_data(info)
        return None if price is None else (info, price)
    return None


def _from_data(info: Any) -> Price | None:
    """A data entry as a Price: its rates below any tier, its batch price as a share."""
    now = datetime.now(UTC)
    live, batch = info.get_prices(now), info.get_prices(now, {"processing": "batch"})
    kinds = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")
    rates = [_base(getattr(live, kind)) for kind in kinds]
    if rates[0] is None or rates[1] is None:
        return None
    tier = min((t.start for kind in kinds for t in getattr(getattr(live, kind), "tiers", ())),
               default=None)
    share = _base(batch.input_mtok) / rates[0] if batch != live and rates[0] else None
    return Price(*rates, tier, BATCH_PRICE_FACTOR if share is None else share)


def _base(rate: Any) -> float | None:
    """A data rate (a Decimal, or tiered prices) in USD per million tokens below its first tier."""
    return None if rate is None else float(getattr(rate, "base", rate))


def cost_of(model: str | None, input_tokens: int | None, output_tokens: int | None,
            cached_tokens: int | None = 0, overrides: Mapping[str, Any] | None = None, *,
            cache_write_tokens: int | None = 0) -> float | None:
    """USD for one call (``input_tokens`` counting cached ones), or ``None`` when no price knows
    the model or its tier; an impossible cache read is priced as plain input."""
    price = price_for(model, overrides)
    if (price is None or input_tokens is None or output_tokens is None
            or input_tokens > (price.max_input_tokens or input_tokens)):
        return None
    cached = cached_tokens or 0
    cached = cached if 0 <= cached <= input_tokens else 0  # an impossible read: unknown
    written = min(max(cache_write_tokens or 0, 0), input_tokens - cached)
    plain = input_tokens - cached - written
    read_rate = price.input if price.cached_input is None else price.cached_input
    write_rate = price.input if price.cache_write is None else price.cache_write
    return (plain * price.input + cached * read_rate + written * write_rate
            + output_tokens * price.output) / 1_000_000


def batch_share(model: str | None, overrides: Mapping[str, Any] | None = None) -> float:
    """The share of ``model``'s live price a provider batch job bills (unknown: half)."""
    price = price_for(model, overrides)
    return BATCH_PRICE_FACTOR if price is None else price.batch
