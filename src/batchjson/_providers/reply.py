"""The one boundary (:func:`received`) where whatever a provider's ``complete(call)`` hands back
becomes a :class:`Reply` acceptance trusts; nothing downstream cleans a reply again."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._checks import is_amount, is_whole
from .._errors import ProviderError
from .._secrets import shown_name
from .._sources import NOT_TEXT, STOPS
from .settings import declared_output_cap

ENVELOPES = (None, "value", "tool_input", "tool_input/value")
MOST_TOKENS = 10**9  # no call reads or writes more: a count above it is the provider's error


@dataclass
class Reply:
    """The text the model sent, byte for byte, with usage and how it ended (``stop``: None, or one
    of :data:`STOPS`). ``envelope`` says how the answer sits in the text: itself (None), in a
    ``{"value": ...}`` object, a tool call's input object, or both (:data:`ENVELOPES`)."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost: float | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    envelope: str | None = None
    stop: str | None = None

    @property
    def tokens(self) -> int:
        return (self.input_tokens or 0) + (self.output_tokens or 0)


def received(out: Any, output_cap: int | None = None) -> Reply:
    """What ``provider.complete`` returned, as a trusted :class:`Reply`: an unreadable count is
    unknown (a paid-for return is never lost to it), non-``str`` text gets :data:`NOT_TEXT`, and
    a reply using all of ``output_cap`` is marked ``extra["cut_at"]``."""
    if isinstance(out, str):
        return Reply(text=str.__getitem__(out, slice(None)))
    if not hasattr(out, "text"):
        raise ProviderError(f"provider returned a {type(out).__name__}, not a Reply: return "
                            "Reply(text=...) or the raw text as a str", retryable=False)
    given = getattr(out, "extra", None)
    extra, odd = (dict(given), {}) if isinstance(given, dict) else ({}, {"extra": repr(given)[:80]})
    counts = _usage(lambda name: getattr(out, name, None), odd)
    cost = counts.pop("cost")
    if odd:
        extra["unreadable_usage"] = odd
    text, stop = out.text, getattr(out, "stop", None)
    if stop is not None and stop not in STOPS:
        extra["unknown_stop"], stop = repr(stop)[:80], None
    out_tokens = counts["output_tokens"]
    if stop is None and output_cap is not None and (out_tokens or 0) >= output_cap:
        extra["cut_at"] = f"all {out_tokens} output tokens of max_tokens={output_cap} used"
    if isinstance(text, str):
        text = str.__getitem__(text, slice(None))  # a subclass's own methods could lie
    else:
        extra["text_type"] = type(text).__name__
        text, stop = text_of(text), NOT_TEXT
    envelope = getattr(out, "envelope", None)
    model = getattr(out, "model", None)
    return Reply(text=text, cost=cost, model=shown_name(model) if isinstance(model, str) else None,
                 extra=extra, envelope=envelope if envelope in ENVELOPES else None, stop=stop,
                 **counts)


def failure_usage(usage: Any) -> dict[str, Any]:
    """A ``ProviderError``'s ``usage`` as trusted numbers, as :func:`received` reads a reply's:
    an unreadable count or cost is left out (unknown); a pasted key in its model is masked."""
    if not isinstance(usage, Mapping):
        return {}
    read: dict[str, Any] = _usage(usage.get, {})
    model = usage.get("model")
    read["model"] = shown_name(model) if isinstance(model, str) else None
    return {name: value for name, value in read.items() if value is not None}


def text_of(value: Any) -> str:
    """A str for storage, whatever a provider put in ``Reply.text``."""
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    try:
        return json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:100_000]


def _count(value: Any) -> int | None:
    if isinstance(value, str):
        text = value.strip()
        value = int(text) if text.isascii() and text.isdigit() and len(text) < 20 else None
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return int(value) if is_whole(value) and value <= MOST_TOKENS else None


def _money(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if is_amount(value) else None


def _usage(given: Callable[[str], Any], odd: dict[str, str]) -> dict[str, Any]:
    """Each usage figure :data:`_USAGE` reads, from ``given(name)``: None where unreadable (its
    text then in ``odd``), and cached tokens beyond the input, which no call can have."""
    counts = {}
    for name, reader in _USAGE:
        value = given(name)
        counts[name] = reader(value)
        if counts[name] is None and value is not None:
            odd[name] = repr(value)[:80]
    cached, sent = counts["cached_tokens"], counts["input_tokens"]
    if cached is not None and sent is not None and cached > sent:  # more read than was sent
        odd["cached_tokens"], counts["cached_tokens"] = f"{cached} > input_tokens {sent}", None
    return counts


_USAGE = (("input_tokens", _count), ("output_tokens", _count), ("cached_tokens", _count),
          ("cost", _money))


def provider_names(provider: Any) -> tuple[Any, Any]:
    """A provider's name and model as receipts and results record them, a pasted key masked."""
    return (shown_name(getattr(provider, "name", type(provider).__name__)),
            shown_name(getattr(provider, "model", None)))


class GuardedProvider:
    """The provider as the replay loop sees it: replies pass :func:`received`, names are masked."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.model = provider_names(inner)
        self._cap = declared_output_cap(inner)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def complete(self, call: Any) -> Reply:
        return received(await self.inner.complete(call), self._cap)
