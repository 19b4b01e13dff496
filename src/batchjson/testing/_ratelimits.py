"""Rate-limit state and the headers OpenAI and Anthropic report it in.

Each limit is a bucket that drains continuously over a minute, so ``remaining`` falls as requests
arrive and ``reset`` is the time until the bucket is full again. OpenAI writes resets as Go
durations (``"0s"``, ``"12ms"``, ``"1.235s"``, ``"6m0s"``); Anthropic as RFC 3339 instants
(``"2025-08-21T12:40:59Z"``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Bucket:
    """``limit`` units per ``per`` seconds, spent by requests and refilled continuously.

    ``capacity`` (default ``limit``) is how much may arrive at once: a limit applied over short
    slices, as OpenAI may ("60,000 requests/minute may be enforced as 1,000 requests/second"),
    holds ``limit * slice / per``. A request larger than that passes only into an empty bucket,
    and one larger than ``limit`` never passes.
    """

    limit: int
    per: float = 60.0
    level: float = 0.0
    at: float = field(default_factory=time.time)
    capacity: float | None = None

    def refusal(self, amount: float, now: float) -> float | None:
        """Seconds until ``amount`` fits (0 when it fits now, None when it never can)."""
        if amount > self.limit:
            return None
        drained = self._drained(now)
        room = max(self.capacity or self.limit, amount)
        over = drained + amount - room
        return max(0.0, over) * self.per / self.limit

    def _drained(self, now: float) -> float:
        return max(0.0, self.level - (now - self.at) * self.limit / self.per)

    def spend(self, amount: float, now: float) -> None:
        self.level = min(float(self.limit), self._drained(now) + amount)
        self.at = now

    def remaining(self, now: float) -> int:
        return max(0, self.limit - math.ceil(self._drained(now)))

    def reset_seconds(self, now: float) -> float:
        return self._drained(now) * self.per / self.limit


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration`` prints it (to the millisecond), as OpenAI sends."""
    millis = max(0, round(seconds * 1000))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def rfc3339(epoch: float) -> str:
    """An instant as Anthropic's reset headers write it: UTC, whole seconds, ``Z``."""
    return datetime.fromtimestamp(math.ceil(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Limits:
    """The server's request and token buckets, and the headers each protocol reports.

    By default they only report; :meth:`enforced` makes a server refuse (429) what arrives
    beyond them, counting tokens when a request arrives as OpenAI documents (see
    :func:`counted_tokens`).
    """

    enforcing = False
    slice_seconds = 60.0

    @classmethod
    def enforced(cls, requests_per_minute: int, tokens_per_minute: int,
                 slice_seconds: float = 1.0) -> Limits:
        """Limits the server enforces, each applied over ``slice_seconds`` of the minute."""
        limits = cls(requests_per_minute, tokens_per_minute, tokens_per_minute)
        limits.tokens = Bucket(tokens_per_minute)
        for bucket in (limits.requests, limits.tokens):
            bucket.capacity = bucket.limit * slice_seconds / bucket.per
        limits.enforcing, limits.slice_seconds = True, slice_seconds
        return limits

    def admit(self, tokens: int, now: float | None = None) -> tuple[str, float | None] | None:
        """Spend one request of ``tokens`` if both buckets have room; else the exhausted
        bucket ("requests" or "tokens") and the seconds until it would fit (None: never)."""
        now = time.time() if now is None else now
        for name, bucket, amount in (("requests", self.requests, 1),
                                     ("tokens", self.tokens, tokens)):
            wait = bucket.refusal(amount, now)
            if wait is None or wait > 0:
                return name, wait
        self.requests.spend(1, now)
        self.tokens.spend(tokens, now)
        return None

    def __init__(self, requests: int = 10_000, input_tokens: int = 2_000_000,
                 output_tokens: int = 400_000) -> None:
        self.requests = Bucket(requests)
        self.input = Bucket(input_tokens)
        self.output = Bucket(output_tokens)
        self.tokens = Bucket(input_tokens + output_tokens)

    def spend(self, input_tokens: int, output_tokens: int, now: float | None = None) -> None:
        """Usage after an answer (only reported: enforcing limits spend on arrival)."""
        if self.enforcing:
            return
        now = time.time() if now is None else now
        self.requests.spend(1, now)
        self.input.spend(input_tokens, now)
        self.output.spend(output_tokens, now)
        self.tokens.spend(input_tokens + output_tokens, now)

    def openai_headers(self, now: float, exhausted: str | None = None,
                       wait: float | None = None) -> dict[str, str]:
        """``x-ratelimit-*``; the ``exhausted`` bucket ("requests" or "tokens") shows 0 left
        and resets after ``wait`` seconds."""
        headers: dict[str, str] = {}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            left, reset = bucket.remaining(now), bucket.reset_seconds(now)
            if name == exhausted:
                left, reset = 0, (wait if wait is not None else bucket.per)
            headers[f"x-ratelimit-limit-{name}"] = str(bucket.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(left)
            headers[f"x-ratelimit-reset-{name}"] = go_duration(reset)
        return headers

    def anthropic_headers(self, now: float, exhausted: bool = False,
                          wait: float | None = None) -> dict[str, str]:
        """``anthropic-ratelimit-*`` for requests, tokens, input and output tokens; when
        ``exhausted`` the requests bucket shows 0 left, resetting after ``wait`` seconds."""
        headers: dict[str, str] = {}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens),
                             ("input-tokens", self.input), ("output-tokens", self.output)):
            left, reset = bucket.remaining(now), bucket.reset_seconds(now)
            if exhausted and name == "requests":
                left, reset = 0, (wait if wait is not None else bucket.per)
            headers[f"anthropic-ratelimit-{name}-limit"] = str(bucket.limit)
            headers[f"anthropic-ratelimit-{name}-remaining"] = str(left)
            headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(now + reset)
        return headers


# What a request asking for no output ceiling is counted for: OpenAI says the ceiling counts
# but names no default for a request without one (its cookbook's parallel processor assumes 15,
# the legacy completions' default); a chat model's own ceiling is far larger, so a limiter must
# assume something: this server, a modest 256.
UNASKED_OUTPUT_TOKENS = 256


def counted_tokens(body: Mapping[str, Any]) -> int:
    """A request's tokens as OpenAI's limiter counts them on arrival: the characters of its
    messages (and Anthropic's ``system``) / 4, plus ``max_completion_tokens`` or ``max_tokens``,
    else :data:`UNASKED_OUTPUT_TOKENS`."""
    chars = len(content_text(body.get("system")))
    for message in body.get("messages") or []:
        if isinstance(message, Mapping):
            chars += len(content_text(message.get("content")))
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    return max(1, chars // 4) + (cap if isinstance(cap, int) else UNASKED_OUTPUT_TOKENS)


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
