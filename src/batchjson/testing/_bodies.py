"""Successful response bodies as the OpenAI OpenAPI document and Anthropic's types define them.

The simulated model's text becomes what the real API would have sent: a message or a tool call,
cut at the output limit with the provider's stop reason, a refusal, and usage with cached and
reasoning token details. Ids have the providers' prefixes and lengths and are derived from the
request number, so a run is reproducible.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from .._providers.base import estimate_tokens
from ._requests import Ask

REFUSAL_TEXT = "I'm sorry, but I can't assist with that request."
_BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
CHARS_PER_TOKEN = 4  # the simulated model's token estimate (base.estimate_tokens)


def token(seed: str, length: int, alphabet: str = _BASE62) -> str:
    """``length`` (at most 32) characters of ``alphabet`` drawn from ``seed`` (reproducible
    ids)."""
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(alphabet[byte % len(alphabet)] for byte in digest[:length])


def request_id(protocol: str, number: int) -> str:
    """``req_`` + 32 hex (OpenAI's ``x-request-id``) or ``req_011C`` + 20 base58 (Anthropic)."""
    if protocol == "anthropic":
        return "req_011C" + token(f"request:{number}", 20, _BASE58)
    return "req_" + hashlib.sha256(f"request:{number}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Answer:
    """What the model sent: text (or a call's arguments), how it stopped, what it spent."""

    text: str
    tool: str | None  # the function/tool called, or None for a text answer
    stop: str  # "end", "length", "refusal"
    output_tokens: int
    reasoning_tokens: int = 0


def shape(ask: Ask, text: str, output_tokens: int, fault: str | None) -> Answer:
    """The simulated model's full text as the real model would have ended it under ``fault``
    and the request's output limit."""
    if fault == "refusal":
        return Answer(REFUSAL_TEXT, None, "refusal", estimate_tokens(REFUSAL_TEXT))
    tool = ask.tool
    if fault == "tool_call" and tool is None:
        tool = ask.offered
    elif fault == "text_reply":
        tool = None
    reasoning = 8 * output_tokens if fault == "reasoning" else 0
    limit = ask.limit
    if fault == "length":
        limit = max(1, min(limit or output_tokens, output_tokens // 2))
    if fault == "length_parses":
        return Answer(text, tool, "length", output_tokens)
    if limit is not None and output_tokens + reasoning > limit:
        kept = max(0, limit - reasoning)
        return Answer(text[: kept * CHARS_PER_TOKEN], tool, "length", limit,
                      min(reasoning, limit))
    return Answer(text, tool, "end", output_tokens + reasoning, reasoning)


def cache_split(input_tokens: int, fault: str | None,
                cache: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """(read from the cache, written to it): three quarters of the input under the fault,
    else what the simulated prompt cache found (``cache``)."""
    part = input_tokens * 3 // 4
    return (part, 0) if fault == "cached" else (0, part) if fault == "cache_write" else cache


def openai_completion(ask: Ask, answer: Answer, input_tokens: int, number: int,
                      fault: str | None, cache: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """A ``CreateChatCompletionResponse``: every field the spec requires (``logprobs``,
    ``message.refusal``) and those the API sends today (``annotations``, ``service_tier``,
    ``system_fingerprint``, usage details)."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None,
                               "annotations": []}
    finish = "length" if answer.stop == "length" else "stop"
    if answer.stop == "refusal":
        message.update(content=None, refusal=answer.text)
    elif answer.tool is not None:
        message["content"] = None
        message["tool_calls"] = [{"id": "call_" + token(f"call:{number}", 24), "type": "function",
                                  "function": {"name": answer.tool, "arguments": answer.text}}]
        finish = "length" if answer.stop == "length" else "tool_calls"
    cached, written = cache_split(input_tokens, fault, cache)
    prompt_details = {"cached_tokens": cached, "audio_tokens": 0}
    if written:
        prompt_details["cache_write_tokens"] = written
    return {
        "id": "chatcmpl-" + token(f"chatcmpl:{number}", 29), "object": "chat.completion",
        "created": int(time.time()), "model": ask.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": answer.output_tokens,
                  "total_tokens": input_tokens + answer.output_tokens,
                  "prompt_tokens_details": prompt_details,
                  "completion_tokens_details": {"reasoning_tokens": answer.reasoning_tokens,
                                                "audio_tokens": 0,
                                                "accepted_prediction_tokens": 0,
                                                "rejected_prediction_tokens": 0}},
        "service_tier": "default",
        "system_fingerprint": "fp_" + hashlib.sha256(ask.model.encode()).hexdigest()[:10],
    }


def anthropic_message(ask: Ask, answer: Answer, input_tokens: int, number: int,
                      fault: str | None, cache: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """A ``Message``: content blocks, ``stop_reason`` (``end_turn``, ``tool_use``,
    ``max_tokens``, ``refusal``), ``stop_sequence`` and usage whose ``input_tokens`` excludes
    cache reads and writes, as the API counts them."""
    block: dict[str, Any] = {"type": "text", "text": answer.text}
    stop = {"end": "end_turn", "length": "max_tokens", "refusal": "refusal"}[answer.stop]
    if answer.tool is not None and answer.stop != "refusal":
        tool_input = tool_input_of(answer.text, whole=answer.stop != "length")
        if tool_input is not None:
            block = {"type": "tool_use", "id": "toolu_01" + token(f"toolu:{number}", 22, _BASE58),
                     "name": answer.tool, "input": tool_input, "caller": {"type": "direct"}}
            stop = "tool_use" if answer.stop == "end" else stop
    read, written = cache_split(input_tokens, fault, cache)
    return {
        "id": "msg_01" + token(f"msg:{number}", 22, _BASE58), "type": "message",
        "role": "assistant", "model": ask.model, "content": [block], "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens - read - written,
                  "cache_creation_input_tokens": written, "cache_read_input_tokens": read,
                  "cache_creation": {"ephemeral_5m_input_tokens": written,
                                     "ephemeral_1h_input_tokens": 0},
                  "output_tokens": answer.output_tokens, "service_tier": "standard",
                  "inference_geo": "not_available"},
    }


def tool_input_of(text: str, whole: bool) -> dict[str, Any] | None:
    """A tool call's input: the answer's JSON object; for a call cut short, what a partial-JSON
    parser makes of the text so far (``{}`` at worst). None when a whole answer is not a JSON
    object: such an answer cannot be a tool call and arrives as text."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None if whole else closed_prefix(text)
    if isinstance(value, dict):
        return value
    return None if whole else {}


def closed_prefix(text: str) -> Any:
    """The longest prefix of ``text`` that parses once its open strings, arrays and objects are
    closed (dropping a dangling key, comma or partial literal), or None."""
    for end in range(len(text), 0, -1):
        candidate = text[:end].rstrip().rstrip(",:").rstrip()
        closers = _closers(candidate)
        if closers is None:
            continue
        try:
            return json.loads(candidate + closers)
        except ValueError:
            continue
    return None


def _closers(prefix: str) -> str | None:
    """The brackets (and quote) that close ``prefix``, or None when it ends mid-escape."""
    stack: list[str] = []
    in_string = escaped = False
    for char in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            stack.append("]" if char == "[" else "}")
        elif char in "]}" and stack:
            stack.pop()
    if escaped:
        return None
    return ('"' if in_string else "") + "".join(reversed(stack))
