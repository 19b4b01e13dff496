"""The one boundary where what a provider hands back becomes a :class:`Reply` acceptance trusts.

A provider is any object with an async ``complete(call)``, so what comes back may be a bare ``str``,
counts as strings, text as bytes. :func:`received` coerces it once, for every provider: text an
exact ``str``, counts whole or unknown, the model name masked, ``stop`` one of :data:`STOPS`.
Nothing downstream cleans a reply again (docs/providers.md, "One boundary")."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .._checks import is_amount
from .._errors import ProviderError
from .._secrets import shown_name
from .._sources import NOT_TEXT, STOPS
from .settings import declared_output_cap

ENVELOPES = (None, "value", "tool_input", "tool_input/value")
MOST_TOKENS = 10**9  # no call reads or writes more: a count above it is the provider's error


@dataclass
class Reply:
    """The raw text a provider returned, with usage and how it ended as the provider reported.

    ``text`` is what the model sent, byte for byte; ``envelope`` says how the answer sits in it:
    ``None`` (the text is the answer), ``"value"`` (a ``{"value": ...}`` object, as strict JSON mode
    needs an object root), ``"tool_input"`` (a tool call's input object), ``"tool_input/value"``
    (both). ``stop`` is None for a return that ended as an answer may, else one of :data:`STOPS`."""

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
    """What ``provider.complete`` returned, as the :class:`Reply` the rest of batchjson trusts.
    Usage never costs a paid-for return: an unreadable count is unknown (kept in
    ``extra["unreadable_usage"]``); non-``str`` text gets ``stop`` :data:`NOT_TEXT`; a reply using
    all of ``output_cap`` is marked ``extra["cut_at"]``, so unfinished JSON is judged cut off."""
    if isinstance(out, str):
        return Reply(text=str.__getitem__(out, slice(None)))
    if not hasattr(out, "text"):
        raise ProviderError(f"provider returned a {type(out).__name__}, not a Reply: return "
                            "Reply(text=...) or the raw text as a str", retryable=False)
    extra = getattr(out, "extra", None)
    extra = dict(extra) if isinstance(extra, dict) else {}
    odd: dict[str, Any] = {} if isinstance(getattr(out, "extra", None), dict) else {
        "extra": repr(getattr(out, "extra", None))[:80]}
    counts = {}
    for name in ("input_tokens", "output_tokens", "cached_tokens"):
        value = getattr(out, name, None)
        counts[name] = _count(value)
        if counts[name] is None and value is not None:
            odd[name] = repr(value)[:80]
    cached, sent = counts["cached_tokens"], counts["input_tokens"]
    if cached is not None and sent is not None and cached > sent:  # more read than was sent
        odd["cached_tokens"], counts["cached_tokens"] = f"{cached} > input_tokens {sent}", None
    cost = _money(getattr(out, "cost", None))
    if cost is None and getattr(out, "cost", None) is not None:
        odd["cost"] = repr(out.cost)[:80]
    if odd:
        extra["unreadable_usage"] = odd
    text, stop = out.text, getattr(out, "stop", None)
    if stop not in STOPS:
        if stop is not None:
            extra["unknown_stop"] = repr(stop)[:80]
        stop = None
    out_tokens = counts["output_tokens"]
    if stop is None and output_cap is not None and out_tokens is not None and (
            out_tokens >= output_cap):  # a sign of a cut, for acceptance to weigh
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
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_TOKENS:
        return None
    return int(value)


def _money(value: Any) -> float | None:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if is_amount(value) else None


def provider_names(provider: Any) -> tuple[Any, Any]:
    """A provider's name and model as receipts and results record them: a custom provider
    whose ``name`` or ``model`` is a pasted key has it masked (the one masking rule)."""
    return (shown_name(getattr(provider, "name", type(provider).__name__)),
            shown_name(getattr(provider, "model", None)))


class GuardedProvider:
    """The provider as the replay loop sees it: every reply passes :func:`received` and its names
    are masked; everything else is the provider's own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.model = provider_names(inner)
        self._cap = declared_output_cap(inner)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def complete(self, call: Any) -> Reply:
        return received(await self.inner.complete(call), self._cap)
