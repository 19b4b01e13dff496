"""OpenAI-compatible chat completions over aiohttp (OpenAI, vLLM, Ollama, llama.cpp server).

The provider only transports: it never validates and never retries. Every failure becomes a
:class:`~batchjson._errors.ProviderError` whose ``retryable``/``retry_after`` tell the replay loop
what to do, so each attempt gets its own receipt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._errors import ProviderError, ProviderSetupError
from ._http import HttpProvider, as_int, object_schema
from .base import Call, Reply

__all__ = ["DEFAULT_OPENAI_BASE_URL", "OpenAIProvider", "strict_schema"]

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
RESPONSE_FORMATS = ("json_schema", "json_object", "text")


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Make object nodes strict-mode legal: additionalProperties false, every property required.

    A stricter schema accepts a subset of what the original accepts, so answers still pass
    the caller's own validation. Returns a copy; the call's schema is left untouched.
    """
    return _strict(schema, True)


_SCHEMA_LISTS = frozenset(("anyOf", "oneOf", "allOf", "prefixItems"))
_SCHEMA_MAPS = frozenset(("properties", "$defs", "definitions"))
_SCHEMA_ONE = frozenset(("items", "not", "additionalProperties"))
_SCHEMA_KEYS = _SCHEMA_LISTS | _SCHEMA_MAPS | _SCHEMA_ONE


def _strict(node: Any, is_schema: bool) -> Any:
    """Tighten object nodes; everything else is shared, not copied (bodies are only serialised).

    Payloads (enum/const/default values) are never walked: they are data, not schemas.
    """
    if not is_schema:
        return node
    if isinstance(node, list):
        return [_strict(item, True) for item in node]
    if not isinstance(node, Mapping) or not (node.keys() & _SCHEMA_KEYS):
        return node  # a leaf schema ({"type": "string"}, {"enum": [...]}): nothing to tighten
    return _strict_object(node)


def _strict_object(node: Mapping[str, Any]) -> Mapping[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _strict(sub, True) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS or key in _SCHEMA_ONE:
            out[key] = _strict(value, True)
        else:
            out[key] = value
    props = out.get("properties")
    if isinstance(props, dict):
        out.setdefault("additionalProperties", False)
        required = list(out.get("required") or [])
        out["required"] = required + [name for name in props if name not in required]
    return out


class OpenAIProvider(HttpProvider):
    """Chat completions against OpenAI or any compatible server; a custom base_url may be keyless.

    ``response_format``: ``"json_schema"`` sends the call's wire schema with ``strict: true``,
    ``"json_object"`` asks for any JSON object, ``"text"`` sends no format at all.
    """

    name = "openai"
    key_env = "OPENAI_API_KEY"
    base_env = "OPENAI_BASE_URL"
    default_base = DEFAULT_OPENAI_BASE_URL
    official_domain = "openai.com"
    example_model = "gpt-4o-mini"
    keyless_hint = ("; a local OpenAI-compatible server (vLLM, Ollama, llama.cpp) can run "
                    "keyless via base_url=...")
    path = "/chat/completions"
    setting = "response_format"
    body_keys = frozenset(("model", "messages", "response_format"))

    def __init__(self, model: str | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, response_format: str = "json_schema",
                 timeout: float = 60.0, prices: Mapping[str, Any] | None = None,
                 max_connections: int = 0, extra_body: Mapping[str, Any] | None = None) -> None:
        self._setup(model, base_url, api_key, timeout, prices, extra_body, max_connections)
        if response_format not in RESPONSE_FORMATS:
            raise ProviderSetupError(f"response_format must be one of "
                                     f"{', '.join(RESPONSE_FORMATS)}; got {response_format!r}")
        self.response_format = response_format

    def request_body(self, call: Call) -> tuple[dict[str, Any], bool]:
        """The JSON body for a call, and whether a value-mode scalar was wrapped."""
        messages = []
        if call.system:
            messages.append({"role": "system", "content": call.system})
        messages.append({"role": "user", "content": call.prompt})
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        wrapped = False
        if self.response_format == "json_schema":
            schema, name, wrapped = object_schema(call)
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": name, "schema": strict_schema(schema), "strict": True}}
        elif self.response_format == "json_object":
            body["response_format"] = {"type": "json_object"}
        return body, wrapped

    def overhead_tokens(self, call: Call) -> int:
        """OpenAI's documented count for chat models: 3 tokens framing each message, 3
        priming the reply (already far below the JSON the body spends on the same framing)."""
        return 3 * (2 if call.system else 1) + 3

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "response_format": self.response_format}

    async def complete(self, call: Call) -> Reply:
        body, wrapped = self.request_body(call)
        return self.read_reply((await self._post(body)).data, wrapped)

    def read_reply(self, data: Mapping[str, Any], wrapped: bool, *,
                   price_factor: float = 1.0) -> Reply:
        """A chat completion's reply (a batch job's output line carries the same body);
        ``price_factor`` scales its cost (batch prices)."""
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            detail = self._secrets.mask(json.dumps(data)[:200])
            raise ProviderError(f"openai: response has no choices: {detail}", status=200,
                                retryable=True)
        message = choices[0].get("message") or {}
        content = message.get("content")
        refusal = message.get("refusal")
        answered = isinstance(content, str)
        text = content if answered else (refusal or "")
        # The content string is the model's own text; a wrapped scalar stays wrapped and says
        # so, for acceptance to unwrap (the ledger keeps what the model sent).
        envelope = "value" if wrapped and answered else None
        usage = data.get("usage") or {}
        inp = as_int(usage.get("prompt_tokens"))
        out = as_int(usage.get("completion_tokens"))
        cached = as_int((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        model = data.get("model") or self.model
        cost = self._cost(model, inp, out, cached or 0)
        if cost is not None:
            cost *= price_factor
        extra = {"finish_reason": choices[0].get("finish_reason"), "id": data.get("id")}
        if refusal:
            extra["refusal"] = refusal
        model, extra = self._shown(model, extra)
        return Reply(text=text, input_tokens=inp, output_tokens=out, cached_tokens=cached,
                     cost=cost, model=model, extra=extra, envelope=envelope)
