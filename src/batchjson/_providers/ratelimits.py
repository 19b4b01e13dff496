"""Rate limits as response headers state them (``x-ratelimit-*``, ``anthropic-ratelimit-*``,
``retry-after[-ms]``), read for the pacer; a value not a finite number of seconds is unknown."""

from __future__ import annotations

import contextvars
import email.utils
import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple

from .base import chars_tokens

_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|us|µs|ns|m|s)")
_GO_DURATION = re.compile(f"(?:{_GO_PART.pattern})+")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
RETRY_AFTER_MAX = 20.0  # seconds of a Retry-After honoured before the call is retried


def _finite(seconds: float) -> float | None:
    """Seconds, never negative; ``inf``, ``nan`` or an overflow say nothing: unknown."""
    return max(0.0, seconds) if math.isfinite(seconds) else None


@lru_cache(maxsize=1024)  # read from every response: the same few durations come back
def go_seconds(text: str) -> float | None:
    """Seconds in a Go duration (``"1m30s"``, ``"3.89s"``, ``"12ms"``, ``"0s"``), or None."""
    text = text.strip()
    if _GO_DURATION.fullmatch(text):
        return _finite(sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_PART.findall(text)))
    try:
        return _finite(float(text))  # a bare number of seconds
    except ValueError:
        return None


def reset_seconds(text: str, now: float | None = None) -> float | None:
    """Seconds until a reset header's Go duration (OpenAI) or RFC 3339 instant (Anthropic)."""
    seconds = go_seconds(text)
    if seconds is not None:
        return seconds
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:  # no moment without a zone
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds (at most :data:`RETRY_AFTER_MAX`) of ``retry-after-ms``, else ``retry-after``."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = _header(headers, name)
        try:
            wait = _finite(float(value) / scale) if value else None
        except ValueError:
            wait = None if scale > 1 else _http_date(value)
        if wait is not None:
            return min(wait, RETRY_AFTER_MAX)
    return None


def _http_date(value: str) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return _finite(when.timestamp() - time.time())


class LimitState(NamedTuple):
    """One limit as a response reported it: size per minute, what is left, seconds until full."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None


_UNSAID = LimitState()


class Reported(NamedTuple):
    """The request and token limits one response reported."""

    requests: LimitState
    tokens: LimitState

    @property
    def any(self) -> bool:
        return self.requests != _UNSAID or self.tokens != _UNSAID


def reported(headers: Mapping[str, str], now: float | None = None) -> Reported:
    """The limits in OpenAI's or Anthropic's headers (its ``tokens`` limit, else input-tokens)."""
    requests, *tokens = _ANTHROPIC_NAMES if any(map(_ANTHROPIC.match, headers)) else _OPENAI_NAMES
    said = next((names for names in tokens if _header(headers, names[0])), tokens[-1])
    return Reported(_state(headers, requests, now), _state(headers, said, now))


def _fields(name: str) -> tuple[str, ...]:
    return tuple(name.format(field) for field in ("limit", "remaining", "reset"))


# Each API's header names of (limit, remaining, reset): requests, then its tokens limits
_OPENAI_NAMES = tuple(map(_fields, ("x-ratelimit-{}-requests", "x-ratelimit-{}-tokens")))
_ANTHROPIC_NAMES = tuple(map(_fields, ("anthropic-ratelimit-requests-{}",
                                       "anthropic-ratelimit-tokens-{}",
                                       "anthropic-ratelimit-input-tokens-{}")))
# ASCII only: a header name equal to the prefix in any case, as ``name.lower()`` finds it
_ANTHROPIC = re.compile("anthropic-ratelimit-", re.IGNORECASE | re.ASCII)


def _state(headers: Mapping[str, str], names: tuple[str, ...], now: float | None) -> LimitState:
    limit, left, reset = (_header(headers, name) for name in names)
    return LimitState(_whole(limit), _whole(left),
                      None if reset is None else reset_seconds(reset, now))


def retry_wait(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """How long a refused request should wait: its Retry-After, else the exhausted limit's reset."""
    wait = retry_after(headers)
    if wait is not None:
        return wait
    seen = reported(headers, now)
    exhausted = [s for s in seen if s.remaining == 0]
    # the later reset is safe for both; an exhausted limit's unreadable reset stays unknown
    return max((s.reset for s in exhausted or seen if s.reset is not None), default=None)


def limits_account(provider: Any) -> tuple[str, str] | None:
    """(account, model) whose limits ``provider``'s calls spend, when its API reports them."""
    inner = getattr(provider, "inner", provider)
    if getattr(inner, "name", None) not in ("openai", "anthropic"):
        return None
    return inner.account(), inner.model


def request_tokens(system: str, prompt: str, output_cap: int | None) -> int:
    """What a rate limiter counts for a request on arrival: prompt characters / 4 + max_tokens."""
    return request_tokens_of(len(system) + len(prompt), output_cap)


def request_tokens_of(prompt_chars: int, output_cap: int | None) -> int:
    """:func:`request_tokens` of a request whose system text and prompt hold ``prompt_chars``."""
    return chars_tokens(prompt_chars) + (output_cap or 0)


# Set by the replay loop around each call: HTTP providers report every response's headers here.
HEADER_LISTENER: contextvars.ContextVar[Callable[[Mapping[str, str]], None] | None] = (
    contextvars.ContextVar("batchjson_header_listener", default=None))


def report_headers(headers: Mapping[str, str]) -> None:
    listener = HEADER_LISTENER.get()
    if listener is not None:
        listener(headers)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and not hasattr(headers, "getall"):  # a plain dict: any case
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    # a header is ASCII; any other text (``²``, ``١``) is unknown, never an exception
    return value.strip() if isinstance(value, str) and value.isascii() else None


def _whole(value: Any) -> int | None:
    """A count of sane length (5000 digits overflow ``int``: unknown)."""
    return int(value) if isinstance(value, str) and value.isdigit() and len(value) <= 18 else None
