"""The providers' prompt caches as the loopback server simulates them, so cache reads, writes
and their prices can be tested and measured offline.

Anthropic caches what comes before a ``cache_control`` breakpoint (tools, system, messages, in
that order) once it reaches the model's minimum: the first request writes it, later ones read
it. OpenAI caches automatically: a request that shares at least 1,024 tokens of prefix with the
previous one of the same ``prompt_cache_key`` reads that prefix, in 128-token steps.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from .._providers.base import OPENAI_CACHE_MINIMUM, anthropic_cache_minimum
from ._ratelimits import content_text

CHARS_PER_TOKEN = 4
OPENAI_CACHE_STEP = 128


class PromptCache:
    """(read, written) prompt tokens of each request, as each provider reports them."""

    def __init__(self) -> None:
        self._written: set[str] = set()
        self._last: dict[str, str] = {}

    def anthropic(self, data: Mapping[str, Any], input_tokens: int) -> tuple[int, int]:
        prefix = _marked_prefix(data)
        if prefix is None:
            return 0, 0
        tokens = min(len(prefix) // CHARS_PER_TOKEN, input_tokens)
        if tokens < anthropic_cache_minimum(str(data.get("model"))):
            return 0, 0
        key = hashlib.sha256(prefix.encode()).hexdigest()
        if key in self._written:
            return tokens, 0
        self._written.add(key)
        return 0, tokens

    def openai(self, data: Mapping[str, Any], input_tokens: int) -> tuple[int, int]:
        text = json.dumps([data.get("response_format"), data.get("tools")]) + "".join(
            content_text(m.get("content")) for m in data.get("messages") or []
            if isinstance(m, Mapping))
        key = f"{data.get('model')}\x00{data.get('prompt_cache_key') or ''}"
        before, self._last[key] = self._last.get(key), text
        if before is None:
            return 0, 0
        tokens = min(len(os.path.commonprefix([before, text])) // CHARS_PER_TOKEN, input_tokens)
        if tokens < OPENAI_CACHE_MINIMUM:
            return 0, 0
        return tokens - (tokens - OPENAI_CACHE_MINIMUM) % OPENAI_CACHE_STEP, 0


def _marked_prefix(data: Mapping[str, Any]) -> str | None:
    """Everything up to the last block marked ``cache_control``, or None when none is."""
    parts = [json.dumps(data.get("tools"))]
    marked = None
    system = data.get("system")
    blocks = system if isinstance(system, list) else [{"text": system or ""}]
    for message in [{"content": blocks}, *(data.get("messages") or [])]:
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in content if isinstance(content, list) else [{"text": content or ""}]:
            if not isinstance(block, Mapping):
                continue
            parts.append(str(block.get("text") or ""))
            if block.get("cache_control"):
                marked = "".join(parts)
    return marked
