"""Dated default token prices in USD per million tokens, so a ledger can show spend; unknown models
cost None, not a guess. Override with ``prices=`` on a provider or :func:`set_prices`."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field

from .._checks import options
from .._errors import ConfigError
from .._secrets import looks_like_key, masked

# The day this table was compiled from the providers' published price pages. Re-check before
# relying on costs for billing; override with set_prices() or a provider's prices= argument.
PRICES_AS_OF = "2026-11-30"

# What a provider batch job (OpenAI Batch, Anthropic Message Batches) bills of the live price,
# for input, output and cache tokens alike, as both providers publish it; a model's price may
# say otherwise (``Price.batch``).
BATCH_PRICE_FACTOR = 0.5


PerMillion = Annotated[float, Field(ge=0, allow_inf_nan=False,
                                    description="a number >= 0 (USD per million tokens)")]
PerMillionOrNone = Annotated[float | None, Field(ge=0, allow_inf_nan=False, description=(
    "a number >= 0 (USD per million tokens), or None to bill as plain input"))]


@options(ConfigError)
class Price:
    """USD per million tokens for one model, checked when made, not after a call was paid for.

    ``cached_input``/``cache_write``: prompt-cache reads and writes (``None``: plain input). Beyond
    ``max_input_tokens`` (a long-context tier) :func:`cost_of` returns ``None`` rather than a wrong
    number. ``batch``: the share a provider batch job bills (half by default)."""

    input: PerMillion
    output: PerMillion
    cached_input: PerMillionOrNone = None
    cache_write: PerMillionOrNone = None
    max_input_tokens: Annotated[int | None, Field(ge=1, description=(
        "a whole number of tokens or None"))] = None
    batch: Annotated[float, Field(ge=0, allow_inf_nan=False, description=(
        "the share of the live price a batch job bills, a number >= 0 (0.5: half)"))
    ] = BATCH_PRICE_FACTOR


def _p(inp: float, out: float, cached: float | None = None, write: float | None = None,
       max_input: int | None = None) -> Price:
    return Price(inp, out, cached, write, max_input)


_SONNET = _p(3.00, 15.00, 0.30, 3.75)
_SONNET_200K = _p(3.00, 15.00, 0.30, 3.75, 200_000)  # > 200k input is billed at a higher tier
_OPUS_OLD = _p(15.00, 75.00, 1.50, 18.75)
_OPUS_NEW = _p(5.00, 25.00, 0.50, 6.25)

DEFAULT_PRICES: dict[str, Price] = {
    # OpenAI (standard tier; cached_input = prompt-cache hits)
    "gpt-5": _p(1.25, 10.00, 0.125),
    "gpt-5-mini": _p(0.25, 2.00, 0.025),
    "gpt-5-nano": _p(0.05, 0.40, 0.005),
    "gpt-4.1": _p(2.00, 8.00, 0.50),
    "gpt-4.1-mini": _p(0.40, 1.60, 0.10),
    "gpt-4.1-nano": _p(0.10, 0.40, 0.025),
    "gpt-4o": _p(2.50, 10.00, 1.25),
    "gpt-4o-2024-05-13": _p(5.00, 15.00),
    "gpt-4o-mini": _p(0.15, 0.60, 0.075),
    "o3": _p(2.00, 8.00, 0.50),
    "o4-mini": _p(1.10, 4.40, 0.275),
    # Anthropic (cached_input = cache hits, cache_write = 5-minute cache writes)
    "claude-opus-4-6": _OPUS_NEW,
    "claude-opus-4-5": _OPUS_NEW,
    "claude-opus-4-1": _OPUS_OLD,
    "claude-opus-4": _OPUS_OLD,
    "claude-opus-4-0": _OPUS_OLD,
    "claude-sonnet-4-6": _SONNET,
    "claude-sonnet-4-5": _SONNET_200K,
    "claude-sonnet-4": _SONNET_200K,
    "claude-sonnet-4-0": _SONNET_200K,
    "claude-haiku-4-5": _p(1.00, 5.00, 0.10, 1.25),
    "claude-3-5-haiku": _p(0.80, 4.00, 0.08, 1.00),
}

_lock = threading.Lock()
_user_prices: dict[str, Price] = {}

# Dated snapshot ids bill like their alias: gpt-4o-mini-2024-07-18, claude-sonnet-4-5-20250929.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def as_price(value: Any) -> Price:
    """Accept a Price, a mapping with input/output[/cached_input/cache_write], or a tuple."""
    if isinstance(value, Price):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"input", "output", "cached_input", "cache_write",
                                "max_input_tokens", "batch"}
        if unknown or "input" not in value or "output" not in value:
            raise ConfigError(f"a price mapping needs 'input' and 'output' (USD per million "
                             f"tokens) and may add cached_input, cache_write, max_input_tokens, "
                             f"batch; got {dict(value)!r}")
        return Price(_number(value["input"]), _number(value["output"]),
                     _number(value.get("cached_input")), _number(value.get("cache_write")),
                     value.get("max_input_tokens"),
                     _number(value.get("batch", BATCH_PRICE_FACTOR)))
    if isinstance(value, (tuple, list)) and 2 <= len(value) <= 4:
        return Price(*(_number(v) for v in value))
    raise ConfigError(f"cannot read a price from {value!r}; use Price(input, output, "
                     "cached_input) or {'input': ..., 'output': ...} in USD per million tokens")


def _number(value: Any) -> Any:
    """A numeric string ("0.15", from a config file) as a float; anything else for Price to
    check, so its message names the field."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
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
    """Look a model up (exact id first, then its undated alias); ``None`` when unknown."""
    if not model:
        return None
    with _lock:
        tables = (overrides or {}, _user_prices, DEFAULT_PRICES)
        for table in tables:
            if model in table:
                return as_price(table[model])
        alias = _SNAPSHOT.sub("", model)
        for table in tables:
            if alias in table:
                return as_price(table[alias])
    return None


def cost_of(model: str | None, input_tokens: int | None, output_tokens: int | None,
            cached_tokens: int | None = 0, overrides: Mapping[str, Any] | None = None, *,
            cache_write_tokens: int | None = 0) -> float | None:
    """USD for one call, or ``None`` when the model or its tier is not in the table.
    ``input_tokens`` counts cached ones too (OpenAI's convention); an impossible cache read (above
    ``input_tokens``) is priced at the full input price, never the cheapest guess."""
    price = price_for(model, overrides)
    if price is None or input_tokens is None or output_tokens is None:
        return None
    cached = cached_tokens or 0
    cached = cached if 0 <= cached <= input_tokens else 0  # an impossible read: unknown
    written = min(max(cache_write_tokens or 0, 0), input_tokens - cached)
    if price.max_input_tokens is not None and input_tokens > price.max_input_tokens:
        return None
    plain = input_tokens - cached - written
    read_rate = price.input if price.cached_input is None else price.cached_input
    write_rate = price.input if price.cache_write is None else price.cache_write
    total = (plain * price.input + cached * read_rate + written * write_rate
             + output_tokens * price.output)
    return total / 1_000_000


def batch_share(model: str | None, overrides: Mapping[str, Any] | None = None) -> float:
    """The share of ``model``'s live price a provider batch job bills: its price's ``batch``,
    else half."""
    price = price_for(model, overrides)
    return BATCH_PRICE_FACTOR if price is None else price.batch
