"""Anthropic Messages API over aiohttp (a forced tool carries the wire schema, or plain text), and
Message Batches as a transport, whose ``upload`` only stages the requests. A tool call's input is
kept as its exact text (:func:`value_span`): re-serialised, spacing, order and numbers change."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from .._canon import show_as
from .._checks import whole
from .._errors import ProviderError, ProviderSetupError
from .._sources import NO_TOOL_CALL, REFUSED, TOOL_CALL, TRUNCATED
from ._http import TOOL_NAMES, HttpProvider, as_int, object_schema
from .base import CACHE_CONTROL, Call, prefix_cacheable
from .batch_client import BatchClient, OutputLines, Upload
from .reply import Reply
from .settings import UNBOUNDED_ANSWER_TOKENS, sized_output_cap

ANTHROPIC_VERSION = "2023-06-01"
AnthropicMode = Literal["tool", "text"]
MODES: tuple[str, ...] = get_args(AnthropicMode)
# The tool-use system prompt of a forced tool: the largest in Anthropic's pricing table, any model.
FORCED_TOOL_SYSTEM_TOKENS = 340


class AnthropicProvider(HttpProvider):
    """Claude via the Messages API; ``mode="tool"`` forces a tool whose input is the answer."""

    name = "anthropic"
    key_env = "ANTHROPIC_API_KEY"
    base_env = "ANTHROPIC_BASE_URL"
    default_base = "https://api.anthropic.com"
    official_domain = "anthropic.com"
    example_model = "claude-haiku-4-5"
    path = "/v1/messages"
    version = "/v1"
    setting = "mode"
    body_keys = frozenset(("model", "messages", "system", "max_tokens", "tools", "tool_choice"))
    auth_header = "x-api-key"
    auth_prefix = ""
    static_headers = {"Content-Type": "application/json", "anthropic-version": ANTHROPIC_VERSION}

    def __init__(self, model: str | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, mode: AnthropicMode = "tool",
                 max_tokens: int | None = None,
                 timeout: float = 60.0, prices: Mapping[str, Any] | None = None,
                 max_connections: int = 0, extra_body: Mapping[str, Any] | None = None) -> None:
        self._setup(model, base_url, api_key, timeout, prices, extra_body, max_connections)
        if mode not in MODES:
            raise ProviderSetupError(f"mode must be 'tool' or 'text', got {mode!r}")
        self.mode = mode
        # unset: sized per call within the default; a thinking budget needs the default whole
        self._sizes_output = max_tokens is None and "thinking" not in self.extra_body
        self.max_tokens = UNBOUNDED_ANSWER_TOKENS if max_tokens is None else whole(
            "max_tokens", max_tokens, 1, ProviderSetupError)

    def batch_api(self) -> AnthropicBatches:
        return AnthropicBatches(self)

    def request_body(self, call: Call) -> tuple[dict[str, Any], bool]:
        """The JSON body and whether a scalar was wrapped (tool mode)."""
        body: dict[str, Any] = {"model": self.model,
                                "max_tokens": self.sized_output(call.answer_chars),
                                "messages": [{"role": "user", "content": call.prompt}],
                                **self.extra_body}
        if call.system:
            body["system"] = call.system
        if prefix_cacheable(self, call.system, call.shared):
            mark_cache_prefix(body, call)
        if self.mode != "tool":
            return body, False
        schema, tool, wrapped = object_schema(call.schema, call.mode)
        what = ("the answer value" if call.mode == "value"
                else "the answers, one object per task in items")
        body["tools"] = [{"name": tool, "description": f"Record {what}.",
                          "input_schema": schema}]
        body["tool_choice"] = {"type": "tool", "name": tool}
        return body, wrapped

    def sized_output(self, answer_chars: int | None) -> int:
        """The ``max_tokens`` a call sends: the user's own, else sized within the default."""
        if not self._sizes_output:
            return self.max_tokens
        return min(self.max_tokens, sized_output_cap(answer_chars))

    def overhead_tokens(self, call: Call) -> int:
        """The tool-use system prompt of a forced tool; text mode adds none."""
        return FORCED_TOOL_SYSTEM_TOKENS if self.mode == "tool" else 0

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "mode": self.mode, "max_tokens": self.max_tokens,
                "anthropic_version": ANTHROPIC_VERSION}

    def read_reply(self, data: Mapping[str, Any], body_text: str | None, wrapped: bool, *,
                   at: tuple[str | int, ...] = (), price_factor: float = 1.0) -> Reply:
        """A Message's reply; ``body_text`` holds it at path ``at``; ``price_factor``: batch."""
        content = data.get("content")
        if not isinstance(content, list):
            raise ProviderError("anthropic: response has no content list", status=200,
                                retryable=True)
        tool = self.mode == "tool"
        found = _tool_text(content, body_text, at) if tool else None
        text = found[0] if found else "".join(b.get("text", "") for b in content
                                              if isinstance(b, dict) and b.get("type") == "text")
        called = _tool_text(content, body_text, at) if not tool and not text else None
        text = called[0] if called else text  # a tool call where text was asked: its input
        envelope = None if found is None else "tool_input/value" if wrapped else "tool_input"
        usage = data.get("usage") or {}
        fresh = as_int(usage.get("input_tokens"))
        read = as_int(usage.get("cache_read_input_tokens")) or 0
        written = as_int(usage.get("cache_creation_input_tokens")) or 0
        inp = None if fresh is None else fresh + read + written
        out = as_int(usage.get("output_tokens"))
        extra = {"stop_reason": data.get("stop_reason"), "id": data.get("id"),
                 "raw_reserialised": found is not None and not found[1],  # no exact text found
                 "cache_creation_input_tokens": written}
        reply = Reply(text, inp, out, read if "cache_read_input_tokens" in usage else None,
                      extra=extra, envelope=envelope,
                      stop=_stop(data.get("stop_reason"), tool, found is not None, content))
        return self._priced(reply, data, written, price_factor)


def _stop(reason: Any, tool: bool, called: bool, content: list[Any]) -> str | None:
    """How the message ended, as acceptance judges it; None for an answer that ended on its own."""
    if reason in ("max_tokens", "model_context_window_exceeded"):
        return TRUNCATED
    if reason == "refusal":
        return REFUSED
    if tool and not called:
        return NO_TOOL_CALL
    if not tool and any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content):
        return TOOL_CALL
    return None


def mark_cache_prefix(body: dict[str, Any], call: Call) -> None:
    """Put the cache breakpoint after the shared instructions, else the system text (unchanged)."""
    shared = call.shared
    if shared and call.prompt.startswith(shared) and len(call.prompt) > len(shared):
        body["messages"] = [{"role": "user", "content": [
            {"type": "text", "text": shared, "cache_control": dict(CACHE_CONTROL)},
            {"type": "text", "text": call.prompt[len(shared):]}]}]
    elif call.system:
        body["system"] = [{"type": "text", "text": call.system,
                           "cache_control": dict(CACHE_CONTROL)}]


def _tool_text(content: list[Any], body: str | None,
               at: tuple[str | int, ...] = ()) -> tuple[str, bool] | None:
    """Our tool's input (else the first tool's) as the body's exact JSON text, and whether exact;
    None: no call."""
    calls = [(i, b) for i, b in enumerate(content)
             if isinstance(b, dict) and b.get("type") == "tool_use"]
    chosen = next((c for c in calls if c[1].get("name") in TOOL_NAMES),
                  calls[0] if calls else None)
    if chosen is None:
        return None
    index, block = chosen
    span = value_span(body, [*at, "content", index, "input"]) if body is not None else None
    if span is not None:
        return body[span[0]:span[1]], True  # type: ignore[index]
    return json.dumps(block.get("input"), ensure_ascii=False), False


# Anthropic error types and the HTTP status each stands for on the live endpoint.
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529}


class AnthropicBatches(BatchClient):
    """The Message Batches endpoints of an AnthropicProvider's base URL."""

    protocol = "anthropic-batch"
    max_requests = 100_000
    max_bytes = 256 * 1024 * 1024
    running = frozenset(("in_progress", "canceling"))
    jobs_path = "/v1/messages/batches"
    frame = (b'{"requests":[', b",", b"", b"]}")
    body_field = "params"
    reply_at = ("result", "message")  # a tool input is read as the line's own text there

    def __init__(self, provider: Any) -> None:
        super().__init__(provider)
        self._staged: dict[str, Upload] = {}  # a creation's body, by its upload token

    async def upload(self, upload: Upload) -> str:
        """Stage the requests (the job's file on disk), streamed as the creation's body."""
        self.finished(upload)
        token = uuid.uuid4().hex
        self._staged[token] = upload
        return token

    async def create(self, staged: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        return await self._json("POST", self.jobs_path, self._staged.pop(staged).finish())

    @staticmethod
    def status(batch: Mapping[str, Any]) -> str:
        status = str(batch.get("processing_status"))
        if status == "ended":
            return "cancelled" if batch.get("cancel_initiated_at") else "completed"
        return status

    def progress(self, batch: Mapping[str, Any]) -> tuple[int, int] | None:
        """Every request not ``processing`` has ended (succeeded, errored, canceled, expired)."""
        counts = {k: v for k, v in self.counts(batch).items() if isinstance(v, int)}
        total = sum(counts.values())
        return (total - counts.get("processing", 0), total) if total > 0 else None

    async def results(self, batch: Mapping[str, Any]) -> OutputLines:
        return OutputLines([await self._call("GET", f"{self.jobs_path}/{batch['id']}/results")])

    def answer(self, line: Mapping[str, Any]) -> tuple[int, Any] | ProviderError:
        """A ``succeeded`` line's message, an ``errored`` one's error at its live status."""
        result = line.get("result") if isinstance(line.get("result"), dict) else {}
        kind = result.get("type")
        if kind == "succeeded" and isinstance(result.get("message"), dict):
            return 200, result["message"]
        if kind == "errored":
            error = result.get("error") or {}
            return ERROR_STATUS.get((error.get("error") or {}).get("type"), 500), error
        owed = (f"{kind} before it was answered" if kind in ("canceled", "expired")
                else f"of unknown result type {kind!r}")
        return ProviderError(f"anthropic batch line {owed}", retryable=True,
                             never_ran=kind in ("canceled", "expired"))  # not billed


_SPACE = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def value_span(text: str, path: Sequence[str | int]) -> tuple[int, int] | None:
    """``(start, end)`` of the value at ``path`` in the JSON ``text``, or ``None`` when it is not
    there; a key named twice resolves to its last occurrence, as ``json.loads`` does."""
    try:
        pos = _skip(text, 0)
        for want in path:
            if text[pos] not in "{[":
                return None
            pos = dict(_children(text, pos))[want]  # a key's last occurrence
        return pos, _decoder.raw_decode(text, pos)[1]  # the C scanner finds its end
    except (ValueError, IndexError, KeyError, RecursionError):
        return None


def _skip(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def _children(text: str, pos: int) -> list[tuple[str | int, int]]:
    """(key or index, value start) of each member of the object or array at ``pos``."""
    out: list[tuple[str | int, int]] = []
    close = "}" if text[pos] == "{" else "]"
    pos = _skip(text, pos + 1)
    if text[pos] == close:
        return out
    while True:
        key: str | int = len(out)
        if close == "}":
            key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
            pos = _skip(text, pos)
            if text[pos] != ":":
                raise ValueError("expected ':'")
            pos = _skip(text, pos + 1)
        out.append((key, pos))
        pos = _skip(text, _decoder.raw_decode(text, pos)[1])
        if text[pos] == close:
            return out
        if text[pos] != ",":
            raise ValueError(f"expected ',' or '{close}'")
        pos = _skip(text, pos + 1)


show_as("batchjson", AnthropicProvider)  # loaded on first use of batchjson.AnthropicProvider
