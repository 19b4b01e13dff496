"""Protocol details of the loopback server: injectable HTTP faults and provider-shaped bodies.

Kept apart from the server so the request path stays short to read.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .._errors import ConfigError

HTTP_FAULTS = ("429", "500", "503", "529", "400", "401", "404", "timeout", "truncate", "cut_json")
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class HttpFaults:
    """HTTP-level faults, drawn per request number (1 = first request this server saw).

    ``script`` maps a request number to one of HTTP_FAULTS and wins over the rates; rates are
    seeded by (seed, request number) so a run is reproducible. ``timeout`` holds the request for
    ``hold`` seconds (longer than the client's timeout); ``truncate`` promises more bytes in
    Content-Length than it sends and closes the connection; ``cut_json`` sends half a JSON body
    with a matching length. ``retry_after`` is sent on 429/503/529: seconds, or a string sent
    verbatim (e.g. an HTTP-date).
    """

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_timeout: float = 0.0
    rate_truncate: float = 0.0
    script: Mapping[int, str] = field(default_factory=dict)
    retry_after: float | str | None = 1.0
    hold: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        for number, name in self.script.items():
            if name not in HTTP_FAULTS:
                raise ConfigError(f"HttpFaults.script[{number}] = {name!r}; choose from "
                                 f"{', '.join(HTTP_FAULTS)}")
        for name in ("rate_429", "rate_500", "rate_timeout", "rate_truncate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"HttpFaults.{name} must be a probability in [0, 1]")

    def draw(self, number: int) -> str | None:
        if number in self.script:
            return self.script[number]
        rates = (("429", self.rate_429), ("500", self.rate_500),
                 ("timeout", self.rate_timeout), ("truncate", self.rate_truncate))
        if not any(rate for _, rate in rates):
            return None
        rng = random.Random(f"{self.seed}:{number}")
        for name, rate in rates:
            if rng.random() < rate:
                return name
        return None


STATUS_TEXT = {400: "Invalid request (loopback fault)",
               404: "The model does not exist (loopback fault)",
               429: "Rate limit reached (loopback fault)",
               500: "The server had an error while processing your request (loopback fault)",
               503: "The engine is currently overloaded (loopback fault)",
               529: "Overloaded (loopback fault)"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    404: "not_found_error", 429: "rate_limit_error", 500: "api_error",
                    503: "api_error", 504: "api_error", 529: "overloaded_error"}


def error_response(protocol: str, status: int, message: str,
                   code: str | None = None) -> web.Response:
    """An error body shaped like the real provider's, so providers parse it as in production."""
    if protocol == "anthropic":
        body = {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"),
                                           "message": message}}
    else:
        body = {"error": {"message": message, "type": "loopback_error", "param": None,
                          "code": code}}
    return web.Response(status=status, body=json.dumps(body).encode(), headers=JSON_HEADERS)


def unauthorized(protocol: str, key: str | None) -> web.Response:
    """Like OpenAI, echo a masked key: the client must still keep it out of its errors."""
    if protocol == "anthropic":
        return error_response(protocol, 401, "invalid x-api-key")
    if not key:
        return error_response(protocol, 401, "You didn't provide an API key.", "invalid_api_key")
    masked = f"{key[:3]}{'*' * 8}{key[-4:]}" if len(key) > 8 else "****"
    return error_response(protocol, 401, f"Incorrect API key provided: {masked}. You can find "
                          "your API key at https://platform.openai.com/account/api-keys.",
                          "invalid_api_key")


async def read_body(request: web.Request) -> dict[str, Any] | None:
    """The request's JSON object, or None (answered as a 400) when it is not one."""
    try:
        data = json.loads(await request.read())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


ANSWER_ONLY = frozenset(("prompt", "context"))  # task fields that are content, never echoed


def identity_fields(schema: Mapping[str, Any],
                    tasks: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The fields the fake model copies from each task, read from structured parts of the
    request only, never from the prompt's wording (so rewording a prompt cannot change it).

    With a wire schema (json_schema / tool mode): the item schema's ``required`` fields that
    every task carries, which is where batchjson pins identity. Without one (json_object or
    text mode): every field the tasks carry except ``prompt`` and ``context``, as a model told
    to echo task fields would. ``task_id`` always comes first.
    """
    item = (((schema.get("properties") or {}).get("items") or {}).get("items") or {})
    required = item.get("required") if isinstance(item, Mapping) else None
    if isinstance(required, list) and required:
        names = [n for n in required if isinstance(n, str)]
    else:
        names = [n for task in tasks for n in task if n not in ANSWER_ONLY]
    names = [n for n in dict.fromkeys(names) if n not in ANSWER_ONLY and all(n in t for t in tasks)]
    return tuple(dict.fromkeys(["task_id", *names]))
