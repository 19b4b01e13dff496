"""HTTP plumbing shared by the API providers (sessions per loop, error mapping, key secrecy);
nothing here retries or validates."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunparse, urlunsplit

import aiohttp
import pydantic_core

from .._canon import read_json
from .._checks import seconds, whole
from .._errors import ConfigError, ProviderError, ProviderSetupError
from .._secrets import (
    Secret,
    Secrets,
    check_name,
    key_digest,
    looks_like_key,
    masked,
    provider_text_masked,
    public_query,
    public_url,
)
from .._sources import Digest
from .base import Call, OneService
from .pricing import cost_of, normalize_prices, price_for
from .ratelimits import report_headers, retry_after, retry_wait
from .reply import Reply
from .settings import checked_extra_body, checked_key

# OS errors that mean no server can be reached at that address at all, as a message says them.
_UNREACHABLE = {errno.ECONNREFUSED: "connection refused", **{
    code: os.strerror(code).lower() for code in (errno.ENETUNREACH, errno.EHOSTUNREACH,
                                                 errno.EADDRNOTAVAIL)}}


def display_url(url: str) -> str:
    """A URL without user, password or query string (either may carry a credential)."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parsed.port}" if parsed.port else host
    return urlunparse((parsed.scheme, netloc, parsed.path, "", "", ""))


def _unreachable(exc: aiohttp.ClientConnectorError) -> str | None:
    """Why no server can be reached (DNS, refused, no route), or None for other failures."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or isinstance(exc.os_error,
                                                                         socket.gaierror):
        return "the host name does not resolve"
    if isinstance(exc, (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError)):
        return None
    if isinstance(exc.os_error, ConnectionRefusedError):
        return _UNREACHABLE[errno.ECONNREFUSED]
    return _UNREACHABLE.get(getattr(exc.os_error, "errno", None) or getattr(exc, "errno", None))


def encode_body(body: Mapping[str, Any]) -> bytes:
    """UTF-8 JSON by pydantic-core's fast encoder, or (a lone surrogate) the stdlib's escapes."""
    try:
        return pydantic_core.to_json(body)
    except (pydantic_core.PydanticSerializationError, ValueError):
        return json.dumps(body).encode("ascii")


class LoopSessions:
    """One aiohttp.ClientSession per event loop: batches may run in a worker thread's loop."""

    def __init__(self, timeout: float, max_connections: int) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._limit = max_connections
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._lock = threading.Lock()

    def get(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            with self._lock:
                self._drop_closed()
                session = self._sessions[loop] = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=self._limit, limit_per_host=0,
                                                   ttl_dns_cache=300), timeout=self._timeout)
        return session

    async def aclose(self) -> None:
        """Close this loop's session and those of closed loops; another live loop closes its own."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = self._sessions.pop(loop, None)
            self._drop_closed()
        if mine is not None:
            await mine.close()

    def _drop_closed(self) -> None:
        """Drop the sessions whose loop is closed: nothing can be awaited there any more."""
        for loop in [lp for lp in self._sessions if lp.is_closed()]:
            session = self._sessions.pop(loop)
            if session.connector is not None:
                with contextlib.suppress(Exception):  # best effort on a dead loop
                    session.connector._close()  # on a closed loop this only marks it closed
            session.detach()


ITEMS_NAME = "batchjson_items"  # schema / tool name for items mode
WRAPPED_VALUE = "batchjson_value"  # value mode, scalar wrapped as {"value": ...}
OBJECT_VALUE = "batchjson_answer"  # value mode whose schema is already an object
TOOL_NAMES = (ITEMS_NAME, WRAPPED_VALUE, OBJECT_VALUE)


def object_schema(call_schema: Mapping[str, Any],
                  mode: str) -> tuple[dict[str, Any], str, bool]:
    """A call's schema with an object root (a scalar as ``{"value": ...}``), its name, wrapped?"""
    schema = dict(call_schema)
    if mode != "value":
        return schema, ITEMS_NAME, False
    if schema.get("type") == "object":
        return schema, OBJECT_VALUE, False
    defs = schema.pop("$defs", None)
    return {"type": "object", "properties": {"value": schema}, "required": ["value"],
            "additionalProperties": False, **({"$defs": defs} if defs else {})}, WRAPPED_VALUE, True


def with_path(url: str, edit: Callable[[str], str]) -> str:
    """``url`` with ``edit`` applied to its path only, before any query (``?api-version=...``)."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return url.strip()
    return urlunsplit(parts._replace(path=edit(parts.path)))


# A reply's extra facts are kept when set, these (how it ended, its id) even when None.
ALWAYS_SHOWN = frozenset(("finish_reason", "stop_reason", "id"))


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class HttpProvider(OneService):
    """Model, endpoint, key (never out of its Secret), checked settings, a pool per loop."""

    name = "http"
    enforces_timeout = True  # every request is bounded by ``timeout`` (aiohttp ClientTimeout)
    key_env = ""
    base_env = ""
    default_base = ""
    official_domain = ""
    example_model = ""
    keyless_hint = ""
    path = ""
    version = ""  # the head of ``path`` a pasted base may end in too (trimmed)
    setting = ""  # the provider's own option shown in its repr
    body_keys: frozenset[str] = frozenset()  # request fields batchjson sets; extra_body may not
    auth_header = "Authorization"
    auth_prefix = "Bearer "
    static_headers: Mapping[str, str] = {"Content-Type": "application/json"}
    # each protocol's own: a call's body and whether a scalar was wrapped; a body as a Reply;
    # the input tokens the provider documents adding to every request
    request_body: Callable[[Call], tuple[dict[str, Any], bool]]
    read_reply: Callable[..., Reply]
    overhead_tokens: Callable[[Call], int]

    def _setup(self, model: str | None, base_url: str | None, api_key: str | None,
               timeout: float, prices: Mapping[str, Any] | None,
               extra_body: Mapping[str, Any] | None, max_connections: int) -> None:
        kind = type(self).__name__
        self.model = check_name(model or os.environ.get("BATCHJSON_MODEL") or None,
                                f"{kind} model", f"pass the key as api_key=... (or set "
                                f"{self.key_env}) and the model's name as model=")
        if not self.model:
            raise ProviderSetupError(f"{kind} needs a model name: pass "
                                     f"model={self.example_model!r} or set BATCHJSON_MODEL.")
        base = self._base_url(base_url)
        endpoint = with_path(base, lambda path: path + self.path)
        self._key = Secret(checked_key(kind, api_key, self.key_env))
        # the URL requests go to is held like the key; base_url and url are what may be shown
        self._secrets = Secrets([self._key.get()], urls=[base, endpoint])
        self._endpoint = Secret(endpoint)
        self.base_url, self.url = public_url(base), public_url(endpoint)
        if self._key and self.auth_header == "Authorization" and "@" in urlsplit(base).netloc:
            raise ProviderSetupError(
                f"{kind}: the base URL {self.base_url} carries a user and password and an API "
                "key is set too, but both would go in the one Authorization header; keep the "
                "key (api_key= or the environment) and drop user:password@ from the URL, or "
                "pass api_key='' to authenticate with the URL alone")
        host = "." + (urlparse(self.base_url).hostname or "").lower()
        # the vendor's own API (its domain or a subdomain), not a compatible server
        self.official = bool(self.official_domain) and host.endswith("." + self.official_domain)
        if not self._key and self.official:
            raise ProviderSetupError(
                f"{kind} has no API key for {display_url(self.base_url)}: set {self.key_env} in "
                f"the environment or pass api_key=...{self.keyless_hint}")
        self.timeout = seconds(f"{kind}: timeout", timeout, ProviderSetupError, positive=True)
        try:
            self.prices = normalize_prices(prices)
        except ConfigError as exc:  # named as this provider's setting
            raise ProviderSetupError(f"{kind}: {exc}") from None
        self.extra_body = checked_extra_body(kind, extra_body, self.body_keys)
        whole(f"{kind}: max_connections (0 for no limit)", max_connections, 0,
              ProviderSetupError)
        self._sessions = LoopSessions(self.timeout, max_connections)

    def _base_url(self, base_url: str | None) -> str:
        """The endpoint's base, checked now; a pasted full endpoint is trimmed to its base."""
        if base_url is not None and not isinstance(base_url, str):
            raise ProviderSetupError(f"{type(self).__name__}: base_url must be a string such as "
                                     f"{self.default_base!r}, got {type(base_url).__name__}")
        source = "base_url" if base_url else self.base_env
        base = with_path(base_url or os.environ.get(self.base_env) or self.default_base,
                         lambda path: path.rstrip("/"))
        try:
            parsed = urlparse(base)
            scheme, host = parsed.scheme, parsed.hostname
        except ValueError:  # a bad bracket
            scheme = host = None
        if scheme not in ("http", "https") or not host:
            shown = masked(base) if looks_like_key(base) else repr(public_url(base))
            raise ProviderSetupError(
                f"{type(self).__name__}: {source} {shown} is not an http(s) URL; give the "
                f"scheme and host, e.g. {self.default_base!r} or 'http://localhost:8000/v1'")
        return with_path(base, lambda path: path.removesuffix(self.path).removesuffix(self.version))

    def __repr__(self) -> str:
        extra = f", {self.setting}={getattr(self, self.setting)!r}" if self.setting else ""
        return (f"{type(self).__name__}(model={self.model!r}, "
                f"base_url={display_url(self.base_url)!r}"
                f"{extra}, api_key={'<set>' if self._key else '<unset>'})")

    def _headers(self) -> dict[str, str]:
        """Built per request: the key lives in no long-lived object but its Secret."""
        headers = dict(self.static_headers)
        key = self._key.get()
        if key:
            headers[self.auth_header] = self.auth_prefix + key
        return headers

    def _priced(self, reply: Reply, data: Mapping[str, Any], written: int, factor: float) -> Reply:
        """``reply`` priced by the model that answered (else the one asked), secrets masked."""
        model = data.get("model") or self.model
        inp, out, read = reply.input_tokens, reply.output_tokens, reply.cached_tokens or 0
        cost = cost_of(model, inp, out, read, self.prices, cache_write_tokens=written)
        if cost is None and model != self.model:
            cost = cost_of(self.model, inp, out, read, self.prices, cache_write_tokens=written)
        mask = self._secrets.mask
        reply.cost = cost and cost * factor
        reply.model = mask(model) if isinstance(model, str) else model
        reply.extra = {k: mask(v) if isinstance(v, str) else v for k, v in reply.extra.items()
                       if v or k in ALWAYS_SHOWN}
        return reply

    def input_bound(self, call: Call) -> int:
        """A sound bound on the input tokens ``call`` is billed for: body bytes plus overhead."""
        return len(encode_body(self.request_body(call)[0])) + self.overhead_tokens(call)

    def settings(self) -> dict[str, Any]:
        """Every setting sent with a request besides model and URL (subclasses add theirs)."""
        return {"extra_body": self.extra_body}

    def account(self) -> str:
        """Whose rate limits a call spends: protocol, public base URL, a digest of the key."""
        return f"{self.name} {display_url(self.base_url)} {key_digest(self._key.get())}".rstrip()

    def source_key(self) -> tuple[Any, ...]:
        """What decides its answers: protocol, URL, model, settings sent; never a credential."""
        where = display_url(self.base_url)
        # a query's API version decides answers; a credential in it does not (keys rotate)
        query = public_query(urlsplit(self.url).query)
        config = {"protocol": self.name, "url": display_url(self.url), "query": query,
                  "model": self.model, **self.settings()}
        return (f"{self.name}:{self.model}@{where}#",
                Digest(config, fallback=lambda: encode_body(config)))

    def price_for_budget(self) -> Any:
        """The asked-for model's price, for cost budgets."""
        return price_for(self.model, self.prices)

    async def _request(self, method: str, url: str, body: Any,
                       headers: Callable[[], Mapping[str, str]] | None = None
                       ) -> tuple[int, bytes, Mapping[str, str]]:
        """One request: (status, body, headers) of a success, else a masked ProviderError raised
        outside ``except`` (no exception holding the key's headers rides along)."""
        failure: ProviderError | None = None
        name, session = self.name, self._sessions.get()
        try:
            async with session.request(method, url, data=body,
                                       headers=(headers or self._headers)()) as resp:
                status, resp_headers, raw = resp.status, resp.headers, await resp.read()
                report_headers(resp_headers)  # the pacer's view of the rate limits
        except TimeoutError:
            failure = ProviderError(f"{name}: no complete answer within the {self.timeout:g}s "
                                    "client timeout", retryable=True)
        except aiohttp.ClientPayloadError as exc:
            failure = ProviderError(f"{name}: response body was cut off ({exc})", retryable=True)
        except aiohttp.ClientResponseError as exc:
            failure = ProviderError(f"{name}: bad HTTP response ({exc.status}: {exc.message})",
                                    status=exc.status or None, retryable=True)
        except (aiohttp.ClientError, OSError) as exc:
            why = _unreachable(exc) if isinstance(exc, aiohttp.ClientConnectorError) else None
            failure = ProviderError(
                f"{name}: cannot reach {display_url(url)} ({why}); is the server running? Check "
                "the base URL." if why else f"{name}: connection failed ({type(exc).__name__}: "
                f"{exc})", retryable=True, unreachable=why is not None)
        except ValueError as exc:  # aiohttp refusing the request itself (a URL it cannot send)
            failure = ProviderError(f"{name}: the request could not be sent "
                                    f"({type(exc).__name__}: {exc}); check the base URL",
                                    retryable=False)
        if failure is not None:
            failure.args = (self._secrets.mask(str(failure)),)
            raise failure
        if status >= 400:
            raise http_error(self.name, status, resp_headers, raw, self._secrets, self.key_env)
        return status, raw, resp_headers

    async def complete(self, call: Call) -> Reply:
        body, wrapped = self.request_body(call)
        data, text = await self._post(body)
        return self.read_reply(data, text, wrapped)

    async def _post(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """A success's JSON object and its exact text (None if not UTF-8); any other body a
        ProviderError."""
        status, raw, resp_headers = await self._request(
            "POST", self._endpoint.get() or self.url, encode_body(body))
        name = self.name
        try:
            text: str | None = raw.decode("utf-8-sig")  # a byte-order mark is not the document
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data":  # a cut inside a character: cut off, below
                raise ProviderError(f"{name}: HTTP {status} body is not valid UTF-8 (byte "
                                    f"{exc.start}); refused, never read as an answer",
                                    status=status, retryable=True) from None
            text = None
        try:
            data = read_json(raw if text is None else text)
        except (ValueError, UnicodeDecodeError, RecursionError):
            data = None
        if not isinstance(data, dict):
            head = self._secrets.mask(raw[:4096].decode("utf-8", "replace"))
            snippet = provider_text_masked(head)[:120]
            if raw.lstrip()[:1] == b"{":  # JSON that stops short: the connection cut it off
                raise ProviderError(f"{name}: HTTP {status} body is not a JSON object "
                                    f"({len(raw)} bytes, starts {snippet!r}); likely truncated",
                                    status=status, retryable=True)
            kind = resp_headers.get("Content-Type", "no content type")
            raise ProviderError(f"{name}: HTTP {status} answered with {kind}, not a JSON API "
                                f"response (starts {snippet!r}); check the base URL",
                                status=status, retryable=False)  # retrying a web page cannot help
        return data, text

    async def aclose(self) -> None:
        await self._sessions.aclose()


QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_error",
                         "enforced_spend_limit_reached"})
QUOTA_WORDS = ("credit balance", "exceeded your current quota")
WAITABLE = (408, 409, 425, 429)  # statuses that can pass by waiting (and 5xx)
BILLING_PAGES = {"openai": "https://platform.openai.com/settings/organization/billing",
                 "anthropic": "https://console.anthropic.com/settings/billing"}


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """The server's own retry advice (``x-should-retry``), or None when it gives none."""
    value = (headers.get("x-should-retry") or "").strip().lower()
    return {"true": True, "false": False}.get(value)


def run_stop(provider: str, status: int, code: str | None, message: str,
             headers: Mapping[str, str]) -> str | None:
    """Why no request of this run can succeed, with the fix (the error is then ``fatal``: the
    run stops, docs/providers.md); None for one request's error."""
    page = BILLING_PAGES.get(provider, "the provider's console")
    if (code in QUOTA_CODES or status == 402
            or any(words in message.lower() for words in QUOTA_WORDS)):
        return (f"the account cannot pay for requests (out of credit, or over its spending "
                f"limit): check its plan and billing at {page}. The run stopped: no further "
                "request was sent and none is retried, since waiting cannot help. Re-run once "
                "billing is fixed; what was accepted is kept")
    if status in WAITABLE and should_retry(headers) is False:
        return (f"the server says not to retry (x-should-retry: false), so this limit will not "
                f"pass by waiting: check the account's limits, plan and billing at {page}. The "
                "run stopped: no further request was sent and none is retried")
    return None


def is_retryable_status(status: int) -> bool:
    return status in WAITABLE or status >= 500


def _error_words(raw: bytes) -> tuple[str, str | None, int]:
    """An error body's own message, its code or type, and how much of the message to keep."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw[:65536].decode("utf-8", "replace").strip() or "<empty body>", None, 300
    if isinstance(data, Mapping):
        err = data.get("error", data)
        if isinstance(err, Mapping):
            msg = err.get("message") or err.get("detail") or data.get("message")
            details = err.get("details")  # Anthropic names a spend limit in details
            code = ((details.get("error_code") if isinstance(details, Mapping) else None)
                    or err.get("code") or err.get("type"))
            if msg:
                return str(msg), (str(code) if code else None), 500
        elif isinstance(err, str):
            return err, None, 500
        if data.get("detail"):
            return str(data["detail"]), None, 500
    return json.dumps(data, ensure_ascii=False), None, 300


_STATUS_HINTS = {
    401: "the API key was rejected; check {key_env}",
    403: "the key may not use this model or endpoint",
    404: "check the model name and the base URL",
    413: "the request is too large; pack fewer tasks per call",
}


def http_error(provider: str, status: int, headers: Mapping[str, str], raw: bytes,
               secrets: Secrets | None, key_env: str) -> ProviderError:
    """An HTTP error response as a ProviderError, in the provider's own words."""
    message, code, cut = _error_words(raw)
    message = provider_text_masked(message)[:cut]
    code = provider_text_masked(code) if code else None
    advice = should_retry(headers)  # the server's word wins, as in the official SDKs
    retryable = is_retryable_status(status) if advice is None else advice
    stop = run_stop(provider, status, code, message, headers)  # out of credit: stop the run
    hint = _STATUS_HINTS.get(status, "")
    text = f"{provider} HTTP {status}: {message}" + (f" [{code}]" if code else "")
    if stop or hint:
        text += f" ({stop or hint.format(key_env=key_env)})"
    return ProviderError(secrets.mask(text) if secrets else text, status=status,
                         retryable=retryable and not stop, fatal=stop is not None,
                         retry_after=retry_wait(headers) if status == 429 else
                         retry_after(headers))
