"""The provider's side of the contract: a reply with the types the ledger and accounts need.

A provider is any object with an async ``complete(call)``; what it hands back is mended here so
an odd reply (text that is not a str, token counts as strings) is judged and kept as a receipt
instead of crashing a run that has already paid for the call.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from .._errors import ProviderError
from .._providers.base import Reply
from .._providers.masking import shown_name

ODD_TEXT = "batchjson_odd_text"  # Reply.extra marker: the provider's text was not a str


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
    """A token count as a whole number >= 0, or None ("12" from a sloppy provider is 12)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _whole(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 0)


def sane_reply(reply: Any) -> Any:
    """A :class:`~batchjson._providers.base.Reply` whose fields have the types the ledger and
    the accounts need, whatever the provider built: text that is not a str is kept as text and
    marked so acceptance rejects it; bad token counts and costs become unknown (None)."""
    if isinstance(reply, str):
        return Reply(text=reply)
    if (type(reply) is Reply and isinstance(reply.text, str) and _whole(reply.input_tokens)
            and _whole(reply.output_tokens) and _whole(reply.cached_tokens) and (
            reply.cost is None or (type(reply.cost) is float and math.isfinite(reply.cost)
                                   and reply.cost >= 0))
            and (reply.model is None or shown_name(reply.model) == reply.model)):
        return reply  # the common case: nothing to mend
    if not hasattr(reply, "text"):
        raise ProviderError(f"provider returned a {type(reply).__name__}, not a Reply: return "
                            "Reply(text=...) or the raw text as a str", retryable=False)
    extra = getattr(reply, "extra", None)
    extra = dict(extra) if isinstance(extra, Mapping) else {}
    text = reply.text
    if not isinstance(text, str):
        extra[ODD_TEXT] = type(text).__name__
        text = text_of(text)
    cost = getattr(reply, "cost", None)
    ok_cost = (isinstance(cost, (int, float)) and not isinstance(cost, bool)
               and math.isfinite(cost) and cost >= 0)
    model = getattr(reply, "model", None)
    return Reply(text=text, input_tokens=_count(getattr(reply, "input_tokens", None)),
                 output_tokens=_count(getattr(reply, "output_tokens", None)),
                 cached_tokens=_count(getattr(reply, "cached_tokens", None)),
                 cost=float(cost) if ok_cost else None,
                 model=shown_name(model) if isinstance(model, str) else None, extra=extra)


def provider_names(provider: Any) -> tuple[Any, Any]:
    """A provider's name and model as receipts and results record them: a custom provider
    whose ``name`` or ``model`` is a pasted key has it masked (the one masking rule)."""
    return (shown_name(getattr(provider, "name", type(provider).__name__)),
            shown_name(getattr(provider, "model", None)))


class GuardedProvider:
    """The provider as the replay loop sees it: every reply passes :func:`sane_reply`, so an
    odd Reply is judged (and kept) instead of crashing the run, and its name and model are
    shown as :func:`provider_names` says. Everything else is the provider's own (timeout,
    aclose, ...)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.model = provider_names(inner)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    async def complete(self, call: Any) -> Any:
        return sane_reply(await self.inner.complete(call))
