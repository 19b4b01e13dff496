"""Error responses as OpenAI and Anthropic send them, and the parts of a request the server reads.

Kept apart from the server so the request path stays short to read. Error types, codes and
messages are the providers' own (see tests/fixtures/recorded/ for recorded ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from ._faults import HttpFaults
from ._ratelimits import Limits, go_duration

JSON_HEADERS = {"Content-Type": "application/json"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 503: "api_error",
                    504: "timeout_error", 529: "overloaded_error"}
_OPENAI_TYPES = {400: "invalid_request_error", 401: "invalid_request_error",
                 404: "invalid_request_error", 429: "requests"}
RATE_LIMIT_DOCS = ("Visit https://platform.openai.com/account/rate-limits to learn more.")
QUOTA_MESSAGE = ("You exceeded your current quota, please check your plan and billing details. "
                 "For more information on this error, read the docs: "
                 "https://platform.openai.com/docs/guides/error-codes/api-errors.")
CREDIT_MESSAGE = ("Your credit balance is too low to access the Anthropic API. Please go to "
                  "Plans & Billing to upgrade or purchase credits.")
ANTHROPIC_LIMIT_TAIL = (
    "For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the "
    "response headers for current usage. Please reduce the prompt length or the maximum tokens "
    "requested, or try again later. You may also contact sales at "
    "https://www.anthropic.com/contact-sales to discuss your options for a rate limit increase.")
STATUS_TEXT = {
    ("openai", 400): "Invalid request: injected by the loopback server's HttpFaults.",
    ("anthropic", 400): "Invalid request: injected by the loopback server's HttpFaults.",
    ("openai", 500): "The server had an error while processing your request. Sorry about that!",
    ("anthropic", 500): "Internal server error",
    ("openai", 503): "The engine is currently overloaded, please try again later.",
    ("anthropic", 503): "Service unavailable",
    ("openai", 529): "Overloaded",
    ("anthropic", 529): "Overloaded",
}


def error_response(protocol: str, status: int, message: str, code: str | None = None, *,
                   kind: str | None = None, param: str | None = None,
                   request_id: str | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    """An error shaped as the provider's: OpenAI ``{"error": {message, type, param, code}}``,
    Anthropic ``{"type": "error", "error": {type, message}, "request_id"}``. ``kind`` is the
    error type (default: the provider's type for ``status``). Anthropic errors say
    ``x-should-retry`` as the real API does."""
    out = {**JSON_HEADERS, **(headers or {})}
    if protocol == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {
            "type": kind or _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
        if request_id:
            body["request_id"] = request_id
        out.setdefault("x-should-retry", "true" if status in (408, 409, 429) or status >= 500
                       else "false")
    else:
        body = {"error": {"message": message,
                          "type": kind or _OPENAI_TYPES.get(status, "server_error"),
                          "param": param, "code": code}}
    compact = (",", ":") if protocol == "anthropic" else None  # as each API writes it
    return web.Response(status=status, body=json.dumps(body, separators=compact).encode(),
                        headers=out)


def unauthorized(protocol: str, key: str | None, request_id: str | None = None) -> web.Response:
    """Like OpenAI, echo a masked key: the client must still keep it out of its errors."""
    if protocol == "anthropic":
        return error_response(protocol, 401, "invalid x-api-key", request_id=request_id)
    if not key:
        return error_response(protocol, 401, "You didn't provide an API key. You need to provide "
                              "your API key in an Authorization header using Bearer auth (i.e. "
                              "Authorization: Bearer YOUR_KEY).", "invalid_api_key")
    masked = f"{key[:3]}{'*' * 8}{key[-4:]}" if len(key) > 8 else "****"
    return error_response(protocol, 401, f"Incorrect API key provided: {masked}. You can find "
                          "your API key at https://platform.openai.com/account/api-keys.",
                          "invalid_api_key")


def fault_response(protocol: str, fault: str, faults: HttpFaults | None, model: str,
                   limits: Limits, now: float, request_id: str) -> web.Response:
    """The error an injected status fault answers with: the provider's body, its rate-limit
    headers and its retry advice (``retry-after``, ``x-should-retry``)."""
    faults = faults or HttpFaults()
    wait = faults.retry_after if isinstance(faults.retry_after, (int, float)) else None
    retry = faults.retry_header()
    if fault == "insufficient_quota":
        stop = {"x-should-retry": "false"}
        if protocol == "anthropic":
            return error_response(protocol, 400, CREDIT_MESSAGE, request_id=request_id,
                                  headers=stop)
        return error_response(protocol, 429, QUOTA_MESSAGE, "insufficient_quota",
                              kind="insufficient_quota", headers=stop)
    if fault in ("429", "429_tokens"):
        bucket = "tokens" if fault == "429_tokens" else "requests"
        used = limits.tokens.limit - 1 if bucket == "tokens" else limits.requests.limit
        return rate_limited(protocol, bucket, model, limits, now, 60.0 if wait is None else wait,
                            used, 1000 if bucket == "tokens" else 1, request_id, retry)
    if fault == "404":
        if protocol == "anthropic":
            return error_response(protocol, 404, f"model: {model}", request_id=request_id)
        return error_response(protocol, 404, f"The model `{model}` does not exist or you do "
                              "not have access to it.", "model_not_found")
    status = int(fault)
    headers = retry if status in (503, 529) else {}
    return error_response(protocol, status, STATUS_TEXT[(protocol, status)],
                          request_id=request_id, headers=headers)


def rate_limited(protocol: str, bucket: str, model: str, limits: Limits, now: float,
                 wait: float | None, used: int, requested: int, request_id: str,
                 retry: Mapping[str, str] | None = None) -> web.Response:
    """A 429 as each provider sends it for an exhausted ``bucket`` ("requests" or "tokens"):
    OpenAI's ``rate_limit_exceeded`` body naming the limit, what was used and requested and the
    wait, with ``x-ratelimit-*`` headers (the exhausted one at 0, resetting after the wait);
    Anthropic's ``rate_limit_error`` with ``anthropic-ratelimit-*``. ``wait`` None is a request
    larger than the whole limit, which no wait cures."""
    retry = dict(retry or {})
    limit = limits.tokens.limit if bucket == "tokens" else limits.requests.limit
    if protocol == "anthropic":
        unit = "tokens" if bucket == "tokens" else "requests"
        message = (f"This request would exceed the rate limit for your organization "
                   f"(org-loopback) of {limit:,} {unit} per minute. {ANTHROPIC_LIMIT_TAIL}")
        headers = {**limits.anthropic_headers(now, exhausted=True, wait=wait), **retry}
        return error_response(protocol, 429, message, request_id=request_id, headers=headers)
    unit = "tokens per min (TPM)" if bucket == "tokens" else "requests per min (RPM)"
    if wait is None:
        message = (f"Request too large for {model} in organization org-loopback on {unit}: "
                   f"Limit {limit}, Requested {requested}. The input or output tokens must be "
                   f"reduced in order to run successfully. {RATE_LIMIT_DOCS}")
    else:
        message = (f"Rate limit reached for {model} in organization org-loopback on {unit}: "
                   f"Limit {limit}, Used {used}, Requested {requested}. Please try again in "
                   f"{go_duration(wait)}. {RATE_LIMIT_DOCS}")
    headers = {**limits.openai_headers(now, exhausted=bucket, wait=wait), **retry}
    return error_response(protocol, 429, message, "rate_limit_exceeded", kind=bucket,
                          headers=headers)


def enforced_429(protocol: str, bucket: str, model: str, limits: Limits, now: float,
                 wait: float | None, requested: int, request_id: str) -> web.Response:
    """The 429 of an enforced limit: what was used of the exhausted bucket, and the wait as
    each provider says it (Anthropic's ``retry-after`` in whole seconds; OpenAI only in its
    reset headers and message)."""
    held = limits.tokens if bucket == "tokens" else limits.requests
    retry = ({"retry-after": str(math.ceil(wait))}
             if protocol == "anthropic" and wait is not None else {})
    return rate_limited(protocol, bucket, model, limits, now, wait,
                        held.limit - held.remaining(now), requested, request_id, retry)


async def read_body(request: web.Request) -> dict[str, Any] | None:
    """The request's JSON object, or None (answered as a 400) when it is not one."""
    try:
        data = json.loads(await request.read())
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


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
