"""The words a provider describes its answer source in (``_content/keys.py`` keys them), and
those it says an answer ended in (:data:`STOPS`). ``source_key()`` returns a string or a sequence
of parts: text, :class:`Code`, :class:`Digest` (setting values) and :class:`Hashed`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Code:
    """Code that decides answers (``whole``: with its configuration); ``owner``: the provider
    refused when the code reads what no fingerprint sees; ``length``: of the digest."""

    obj: Any
    owner: str | None = None
    length: int | None = 24
    whole: bool = True
    fingerprint: Any = field(default=None, repr=False)  # kept: identity-compared objects live on


@dataclass(frozen=True, eq=False)
class Digest:
    """Setting values by a 16-character digest of their content, else of ``fallback()``'s bytes."""

    value: Any
    fallback: Callable[[], bytes] | None = None


@dataclass(frozen=True, eq=False)
class Hashed:
    """A JSON list, parts resolved (:class:`Code`, :class:`Hashed`), as its text's SHA-256."""

    items: list[Any]


# Why a return cannot be an answer whatever its text says, as its provider reported it;
# acceptance rejects it under the same name.
TRUNCATED = "truncated"  # cut off at the output ceiling (length, max_tokens)
REFUSED = "refused"  # the model declined (OpenAI message.refusal, Anthropic stop_reason refusal)
TOOL_CALL = "tool_call"  # a tool call came where text was asked
NO_TOOL_CALL = "no_tool_call"  # text came where the answer tool was to be called
NOT_TEXT = "not_text"  # the provider's text was not a str (set by the boundary, reply.received)
STOPS = (TRUNCATED, REFUSED, TOOL_CALL, NO_TOOL_CALL, NOT_TEXT)
# The error types a return is rejected under on its provider's word (NOT_TEXT is a json error).
STOP_ERRORS = frozenset({TRUNCATED, REFUSED, TOOL_CALL, NO_TOOL_CALL})


def stop_types(errors: Any) -> set[str]:
    """The provider's words a receipt's errors (JSON text, or a list) were rejected on."""
    try:
        listed = json.loads(errors or "[]") if isinstance(errors, (str, type(None))) else errors
    except ValueError:
        return set()
    if not isinstance(listed, list):
        return set()
    return {e.get("type") for e in listed if isinstance(e, dict)} & STOP_ERRORS
