"""What a chat-completions or Messages request asks of the model, read as the real API reads it.

The schema an answer must conform to comes from ``response_format`` (json_schema), a called
function's ``parameters``, a called tool's ``input_schema`` or Anthropic's
``output_config.format``; the output limit from ``max_completion_tokens``/``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._providers._http import WRAPPED_VALUE
from ._ratelimits import content_text


@dataclass(frozen=True)
class Ask:
    """One request's question: the text, the schema and form of the answer, its token limit."""

    model: str
    system: str
    user: str
    schema: Mapping[str, Any] = field(default_factory=dict)
    wrapped: bool = False  # a value-mode scalar travels as {"value": ...}
    tool: str | None = None  # the function/tool the model calls; None: it answers in text
    offered: str | None = None  # what a tool call nobody asked for is named (fault tool_call)
    limit: int | None = None  # max output tokens


def _last_user(messages: Sequence[Any]) -> str:
    return next((content_text(m.get("content")) for m in reversed(messages)
                 if isinstance(m, dict) and m.get("role") == "user"), "")


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def openai_ask(data: Mapping[str, Any], default_model: str) -> Ask:
    messages = [m for m in data.get("messages") or [] if isinstance(m, dict)]
    system = "\n".join(content_text(m.get("content")) for m in messages
                       if m.get("role") in ("system", "developer"))
    fmt = data.get("response_format") or {}
    spec = (fmt.get("json_schema") or {}) if fmt.get("type") == "json_schema" else {}
    functions = {f["function"]["name"]: f["function"] for f in data.get("tools") or []
                 if isinstance(f, dict) and isinstance(f.get("function"), dict)
                 and isinstance(f["function"].get("name"), str)}
    choice = data.get("tool_choice")
    if isinstance(choice, dict):
        called = (choice.get("function") or {}).get("name")
    elif choice == "none" or not functions:
        called = None
    else:  # "auto" or "required": a model offered tools calls the first one
        called = next(iter(functions))
    function = functions.get(called) if called else None
    schema = (function or {}).get("parameters") if function else spec.get("schema")
    limit = _whole(data.get("max_completion_tokens")) or _whole(data.get("max_tokens"))
    return Ask(str(data.get("model") or default_model), system, _last_user(messages),
               schema or {}, spec.get("name") == WRAPPED_VALUE and function is None,
               called if function else None,
               next(iter(functions), None) or spec.get("name") or "answer", limit)


def anthropic_ask(data: Mapping[str, Any], default_model: str) -> Ask:
    system = data.get("system") or ""
    system = system if isinstance(system, str) else content_text(system)
    tools = {t["name"]: t for t in data.get("tools") or []
             if isinstance(t, dict) and isinstance(t.get("name"), str)}
    choice = data.get("tool_choice") or {}
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        called = choice.get("name")
    elif kind == "none" or not tools:
        called = None
    else:  # "any", "auto" or no choice: a model offered tools calls the first one
        called = next(iter(tools))
    tool = tools.get(called) if called else None
    fmt = ((data.get("output_config") or {}).get("format") or {})
    schema = (tool or {}).get("input_schema") if tool else (
        fmt.get("schema") if fmt.get("type") == "json_schema" else None)
    return Ask(str(data.get("model") or default_model), system,
               _last_user(data.get("messages") or []), schema or {},
               tool is not None and tool.get("name") == WRAPPED_VALUE,
               called if tool else None, next(iter(tools), None) or "answer",
               _whole(data.get("max_tokens")))


def refusal_of(protocol: str, data: dict[str, Any] | None) -> str | None:
    """What the real API refuses before answering: no model, no messages, no max_tokens
    (Anthropic), a streamed answer (this server answers whole bodies only)."""
    if data is None:
        return None
    if not data.get("model"):
        return ("model: Field required" if protocol == "anthropic"
                else "you must provide a model parameter")
    if not isinstance(data.get("messages"), list):
        return ("messages: Field required" if protocol == "anthropic"
                else "Missing required parameter: 'messages'.")
    if protocol == "anthropic" and "max_tokens" not in data:
        return "max_tokens: Field required"
    if data.get("stream"):
        return "loopback: streaming is not supported; send stream=false"
    return None
