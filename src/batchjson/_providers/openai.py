"""OpenAI-compatible chat completions over aiohttp (OpenAI, vLLM, Ollama, llama.cpp server), and
the Batch API as a transport, whose ``completed`` says only that a batch stopped."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields, replace
from typing import Any, Literal, get_args
from urllib.parse import quote

import aiohttp

from .._canon import show_as
from .._checks import Flag, options
from .._errors import ProviderError, ProviderSetupError
from .._secrets import provider_text_masked
from .._sources import REFUSED, TOOL_CALL, TRUNCATED
from ._http import HttpProvider, as_int, object_schema
from .base import Call, prefix_cacheable, prompt_cache_key
from .batch_client import WINDOW_HOURS, BatchClient, OutputLines, Upload
from .reply import Reply
from .settings import declared_output_cap, sized_output_cap
from .strict import strict_form

ResponseFormat = Literal["auto", "json_schema", "json_object", "text"]
RESPONSE_FORMATS: tuple[str, ...] = get_args(ResponseFormat)


class OpenAIProvider(HttpProvider):
    """Chat completions against OpenAI or any compatible server (a custom base_url may be keyless);
    ``response_format="auto"`` sends strict json_schema when it can express the schema."""

    name = "openai"
    key_env = "OPENAI_API_KEY"
    base_env = "OPENAI_BASE_URL"
    default_base = "https://api.openai.com/v1"
    official_domain = "openai.com"
    example_model = "gpt-4o-mini"
    keyless_hint = ("; a local OpenAI-compatible server (vLLM, Ollama, llama.cpp) can run "
                    "keyless via base_url=...")
    path = "/chat/completions"
    setting = "response_format"
    body_keys = frozenset(("model", "messages", "response_format"))

    def __init__(self, model: str | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, response_format: ResponseFormat = "auto",
                 timeout: float = 60.0, prices: Mapping[str, Any] | None = None,
                 max_connections: int = 0, extra_body: Mapping[str, Any] | None = None,
                 capabilities: Mapping[str, Any] | Capabilities | None = None) -> None:
        self._setup(model, base_url, api_key, timeout, prices, extra_body, max_connections)
        if response_format not in RESPONSE_FORMATS:
            raise ProviderSetupError(f"response_format must be one of "
                                     f"{', '.join(RESPONSE_FORMATS)}; got {response_format!r}")
        self.response_format = response_format
        self.capabilities = capabilities_for(self.model, capabilities)
        if not self.capabilities.response_format and response_format in ("json_schema",
                                                                          "json_object"):
            raise ProviderSetupError(
                f"OpenAIProvider: {self.model} takes no response_format, so "
                f"response_format={response_format!r} would be refused on every call; use "
                "'auto' (the prompt asks for JSON, and acceptance judges it against your "
                "schema), or pass capabilities={'response_format': True} if this deployment "
                "takes one")
        self.extra_body = shaped_extra_body(self.model, self.capabilities, self.extra_body)
        self._sizes_output = declared_output_cap(self) is None
        # OpenAI deprecated max_tokens; compatible servers know it unless the model needs the other
        self._cap_field = ("max_completion_tokens" if self.official
                           or self.capabilities.max_completion_tokens else "max_tokens")

    def batch_api(self) -> OpenAIBatches:
        return OpenAIBatches(self)

    def request_body(self, call: Call) -> tuple[dict[str, Any], bool]:
        prompt = {"role": "user", "content": call.prompt}  # the system text in the model's role
        messages = ([{"role": self.capabilities.system_role, "content": call.system}, prompt]
                    if call.system else [prompt])
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        if self._sizes_output and (cap := self.sized_output(call.answer_chars)) is not None:
            body[self._cap_field] = cap
        fmt, wrapped, problems = self._format(
            call.schema, call.mode, call.schema_shape,
            call.identity if call.mode == "items" and call.schema_shape else ())
        if problems and self.response_format == "json_schema":  # the run's check refuses it first
            raise ProviderError(self._inexpressible(problems, call.mode), retryable=False,
                                fatal=True)
        if fmt is not None:
            body["response_format"] = fmt
        if prefix_cacheable(self, call.system, call.shared):  # routed to one prompt cache
            body.setdefault("prompt_cache_key", prompt_cache_key(call.system, call.shared))
        if "prompt_cache_key" in body and body["prompt_cache_key"] is None:
            del body["prompt_cache_key"]  # extra_body's None: a server that refuses the field
        return body, wrapped

    def sized_output(self, answer_chars: int | None) -> int | None:
        """The output ceiling a call sends: the user's, else sized (none unbounded off OpenAI)."""
        if not self._sizes_output:
            return declared_output_cap(self)
        if answer_chars is None and not self.official:
            return None
        return sized_output_cap(answer_chars, reasoning=not self.capabilities.temperature)

    def _format(self, schema: Mapping[str, Any], mode: str, shape: str = "",
                pinned: Sequence[str] = ()) -> tuple[dict[str, Any] | None, bool, Sequence[str]]:
        """The ``response_format`` a call sends, whether a scalar was wrapped for it, and what
        keeps strict mode from the schema (``shape``, ``pinned``: see :func:`strict_form`)."""
        if self.response_format == "text" or not self.capabilities.response_format:
            return None, False, ()
        if self.response_format == "json_object":
            return {"type": "json_object"}, False, ()
        root, name, wrapped = object_schema(schema, mode)
        form = strict_form(root, shape, pinned)
        if form.schema is not None:
            return {"type": "json_schema", "json_schema": {
                "name": name, "schema": form.schema, "strict": True}}, wrapped, ()
        # JSON mode answers objects only: a scalar value goes without a format
        return None if wrapped else {"type": "json_object"}, False, form.problems

    def check_schema(self, schema: Mapping[str, Any], mode: str) -> str | None:
        """None when calls send the schema as asked, else a note for the result (strict mode
        cannot express it), or ProviderSetupError when ``json_schema`` was asked for."""
        if not self.capabilities.response_format:
            return (f"{self.model} takes no response_format: its calls ask for JSON in the "
                    "prompt only, and acceptance judges every answer against your schema")
        fmt, _, problems = self._format(schema, mode)
        if not problems:
            return None
        if self.response_format == "json_schema":
            raise ProviderSetupError(self._inexpressible(problems, mode))
        how = ("send no response_format" if fmt is None else
               "ask for a JSON object (response_format json_object)")
        return (f"OpenAI's strict mode cannot express this schema ({_listed(problems, mode)}), "
                f"so its calls {how}, and acceptance judges every answer against your schema; "
                "to have the API hold the model to it, declare the fields of free-form objects "
                "and dicts and leave out the keywords named (a validator can check them)")

    def _inexpressible(self, problems: Sequence[str], mode: str) -> str:
        return (f"OpenAIProvider(response_format='json_schema') was asked for, but OpenAI's "
                f"strict mode cannot express this schema ({_listed(problems, mode)}), and the "
                "API would refuse every call with a 400; nothing was sent. Use "
                "response_format='auto' (such a schema then goes as a JSON object, and "
                "acceptance still judges every answer against it), or declare the fields of "
                "free-form objects and dicts and leave out the keywords named")

    def overhead_tokens(self, call: Call) -> int:
        """OpenAI's documented count: 3 tokens framing each message, 3 priming the reply."""
        return 3 * (2 if call.system else 1) + 3

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "response_format": self.response_format,
                "capabilities": asdict(self.capabilities)}

    def read_reply(self, data: Mapping[str, Any], body_text: str | None, wrapped: bool, *,
                   at: tuple[str | int, ...] = (), price_factor: float = 1.0) -> Reply:
        """A chat completion's reply (or a batch line's body); ``price_factor`` scales its cost."""
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            detail = json.dumps(data, ensure_ascii=False)
            detail = provider_text_masked(self._secrets.mask(detail))[:200]
            raise ProviderError(f"openai: response has no choices: {detail}", status=200,
                                retryable=True)
        message, finish = choices[0].get("message") or {}, choices[0].get("finish_reason")
        content, refusal = message.get("content"), message.get("refusal")
        answered = isinstance(content, str)
        arguments = None if answered else _tool_arguments(message)  # a text answer: unread
        text = content if answered else (refusal or arguments or "")
        usage = data.get("usage") or {}
        inp = as_int(usage.get("prompt_tokens"))  # cache reads and writes included
        out = as_int(usage.get("completion_tokens"))  # reasoning tokens included: billed
        prompt_details = usage.get("prompt_tokens_details") or {}
        cached = as_int(prompt_details.get("cached_tokens"))
        written = as_int(prompt_details.get("cache_write_tokens")) or 0
        reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
        extra = {"finish_reason": finish, "id": data.get("id"), "refusal": refusal,
                 "reasoning_tokens": as_int(reasoning), "cache_write_tokens": written}
        stop = _stop(finish, refusal, answered, arguments)
        reply = Reply(text, inp, out, cached, extra=extra, stop=stop,
                      envelope="value" if wrapped and answered else None)  # acceptance unwraps
        return self._priced(reply, data, written, price_factor)


def _tool_arguments(message: Mapping[str, Any]) -> str | None:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls or not isinstance(calls[0], Mapping):
        return None
    function = calls[0].get("function")
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _stop(finish: Any, refusal: Any, answered: bool, arguments: str | None) -> str | None:
    """How the choice ended, as acceptance judges it; None for a text answer that ended well."""
    if finish == "length":
        return TRUNCATED
    if refusal or finish == "content_filter":
        return REFUSED
    if (arguments is not None and not answered) or finish in ("tool_calls", "function_call"):
        return TOOL_CALL
    return None


def _listed(problems: Sequence[str], mode: str) -> str:
    """The first problems, named by the answer's own fields (batchjson's wrapper left out)."""
    prefix = "items[]." if mode == "items" else "value."
    shown = [p.removeprefix(prefix) for p in problems[:3]]
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    return "; ".join(shown) + more


class OpenAIBatches(BatchClient):
    """The Files and Batches endpoints of the provider's base URL, with its key and pool."""

    protocol = "openai-batch"
    max_requests = 50_000
    max_bytes = 200 * 1024 * 1024
    url = "/v1/chat/completions"
    line_head = {"method": "POST", "url": url}
    running = frozenset(("validating", "in_progress", "finalizing", "cancelling"))
    jobs_path = "/batches"

    async def upload(self, upload: Upload) -> str:
        """Upload the input file, streamed from disk; its id."""
        data = self.finished(upload)
        form = aiohttp.FormData({"purpose": "batch"})
        form.add_field("file", data, filename="batchjson.jsonl",
                       content_type="application/jsonl")
        return str((await self._json("POST", "/files", form))["id"])

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        return await self._json("POST", "/batches", {
            "input_file_id": file_id, "endpoint": self.url, "completion_window": f"{WINDOW_HOURS}h",
            "metadata": dict(metadata)})

    async def find(self, uid: str, since: float) -> dict[str, Any] | None:
        """The batch whose metadata names ``uid``, listed newest first, back to ``since``."""
        after = ""
        while True:
            page = await self._json("GET", f"/batches?limit=100{after}")
            data = [b for b in page.get("data") or () if isinstance(b, dict)]
            for batch in data:
                if (batch.get("metadata") or {}).get("batchjson_job") == uid:
                    return batch
            oldest = data[-1].get("created_at") if data else None
            if not page.get("has_more") or not data or (
                    isinstance(oldest, (int, float)) and oldest < since):
                return None
            after = f"&after={quote(str(data[-1].get('id')), safe='')}"

    @staticmethod
    def status(batch: Mapping[str, Any]) -> str:
        return str(batch.get("status"))

    @staticmethod
    def whole_failure(batch: Mapping[str, Any]) -> str | None:
        if batch.get("status") != "failed":
            return None
        return provider_text_masked("; ".join(f"{e.get('code')}: {e.get('message')}"
                                              for e in _errors(batch)) or "no reason given")

    @staticmethod
    def too_large(batch: Mapping[str, Any]) -> bool:
        return any(e.get("code") == "token_limit_exceeded" for e in _errors(batch))

    async def results(self, batch: Mapping[str, Any]) -> OutputLines:
        """The lines of the output and error files (either may be absent)."""
        return OutputLines([await self._call("GET", f"/files/{batch[field]}/content")
                            for field in ("output_file_id", "error_file_id") if batch.get(field)])

    def answer(self, line: Mapping[str, Any]) -> tuple[int, Any] | ProviderError:
        """A line's ``response`` status and body; neither 2xx nor an HTTP error: a ProviderError."""
        response = line.get("response") if isinstance(line.get("response"), dict) else {}
        status, body, error = response.get("status_code"), response.get("body"), line.get("error")
        if isinstance(status, int) and status >= 400:
            return status, body
        if error or not isinstance(status, int) or not 200 <= status < 300:
            what = error if isinstance(error, dict) else {"message": str(error)} if error else {}
            said = f"{what.get('code') or ''} {what.get('message') or 'no response'}"
            return ProviderError(f"openai batch line failed: {provider_text_masked(said.strip())}",
                                 status=status, retryable=True, never_ran=what.get("code") in (
                                     "batch_expired", "batch_cancelled"))  # not billed
        if not isinstance(body, dict):
            return ProviderError("openai batch line has no response body", status=status,
                                 retryable=True)
        return status, body


def _errors(batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Why a batch failed as a whole: validation, token_limit_exceeded."""
    return [e for e in (batch.get("errors") or {}).get("data") or [] if isinstance(e, dict)]


# Sampling settings the reasoning models refuse (OpenAI: "not supported with reasoning models").
SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "logprobs",
            "top_logprobs", "logit_bias")


@options(ProviderSetupError, "OpenAIProvider: capabilities ")
class Capabilities:
    """How a request to one model must be shaped (``temperature``: the ``SAMPLING`` settings)."""

    system_role: Literal["system", "developer", "user"] = "system"
    response_format: Flag = True
    max_completion_tokens: Flag = False
    temperature: Flag = True


CHAT = Capabilities()
REASONING = Capabilities("developer", True, True, False)
EARLY_REASONING = Capabilities("user", False, True, False)  # o1-mini, o1-preview

# (pattern matched at the start of the model's name, capabilities); the first match wins.
KNOWN: tuple[tuple[re.Pattern[str], Capabilities], ...] = (
    (re.compile(r"o1-(mini|preview)(-|$)"), EARLY_REASONING),
    (re.compile(r"gpt-5(\.\d+)?-chat(-|$)"), replace(CHAT, max_completion_tokens=True)),
    (re.compile(r"o\d+(-|$)"), REASONING),  # o1, o3, o3-mini, o4-mini, their snapshots
    (re.compile(r"gpt-5(\.\d+)?(-|$)"), REASONING),  # gpt-5, -mini, -nano, gpt-5.1, ...
)


def capabilities_for(model: str, override: Any = None) -> Capabilities:
    """The table's capabilities for ``model``, ``override`` laid over; a bad override is refused."""
    name = model.rsplit("/", 1)[-1].removeprefix("ft:").lower()
    found = next((caps for pattern, caps in KNOWN if pattern.match(name)), CHAT)
    if override is None or isinstance(override, Capabilities):
        return override or found
    if not isinstance(override, Mapping):
        raise ProviderSetupError(f"OpenAIProvider: capabilities must be a dict such as "
                                 f"{{'system_role': 'developer'}}, got {type(override).__name__}")
    known = [f.name for f in fields(Capabilities)]
    unknown = sorted(str(k) for k in override if k not in known)
    if unknown:
        raise ProviderSetupError(f"OpenAIProvider: capabilities has no {', '.join(unknown)}; "
                                 f"its fields are {', '.join(known)}")
    return replace(found, **dict(override))


def shaped_extra_body(model: str, caps: Capabilities, extra: dict[str, Any]) -> dict[str, Any]:
    """``extra_body`` as this model takes it; a sampling setting it refuses is refused now."""
    refused = [] if caps.temperature else [k for k in SAMPLING if k in extra]
    if refused:
        raise ProviderSetupError(
            f"OpenAIProvider: {model} refuses {', '.join(map(repr, refused))} (a reasoning "
            f"model samples at its own settings); drop {'it' if len(refused) == 1 else 'them'}"
            " from extra_body, or pass capabilities={'temperature': True} if this "
            "deployment accepts them")
    if caps.max_completion_tokens and "max_tokens" in extra:
        if "max_completion_tokens" in extra:
            raise ProviderSetupError(
                f"OpenAIProvider: extra_body sets both max_tokens and max_completion_tokens, "
                f"and {model} takes only max_completion_tokens (reasoning tokens included); "
                "keep one")
        extra = {("max_completion_tokens" if k == "max_tokens" else k): v
                 for k, v in extra.items()}
    return extra


show_as("batchjson", OpenAIProvider)  # loaded on first use of batchjson.OpenAIProvider
