"""Faults the loopback server injects per request, named for what the real API does.

Three kinds: an error status answered before the model runs (with the body, headers and retry
advice the real provider sends), a broken HTTP response (a held request, a body cut short), and
an answer the real model may give: a refusal, a truncation, a tool call where text was asked,
cached or reasoning tokens in the usage.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from .._errors import ConfigError

STATUS_FAULTS = ("400", "401", "404", "429", "429_tokens", "insufficient_quota", "500", "503",
                 "529")
TRANSPORT_FAULTS = ("timeout", "truncate", "cut_json")
ANSWER_FAULTS = ("refusal", "length", "length_parses", "tool_call", "text_reply", "cached",
                 "cache_write", "reasoning")
HTTP_FAULTS = STATUS_FAULTS + TRANSPORT_FAULTS + ANSWER_FAULTS
RATE_FAULTS = (("429", "rate_429"), ("500", "rate_500"), ("timeout", "rate_timeout"),
               ("truncate", "rate_truncate"))


@dataclass(frozen=True)
class HttpFaults:
    """Faults drawn per request number (1 = first request this server saw).

    ``script`` maps a request number to one of HTTP_FAULTS and wins over the rates; rates are
    seeded by (seed, request number) so a run is reproducible.

    Statuses: ``429`` (requests per minute) and ``429_tokens`` (tokens per minute) carry the
    provider's rate-limit body and headers and ``retry-after``; ``insufficient_quota`` is
    OpenAI's 429 (Anthropic's out-of-credit 400) with ``x-should-retry: false``; ``400``,
    ``401``, ``404``, ``500``, ``503``, ``529`` carry the provider's error types. ``retry_after``
    is sent on 429/503/529: seconds (also as ``retry-after-ms``), or a string sent verbatim
    (an HTTP-date, say), or a mapping of headers sent verbatim over the server's own
    (``{"retry-after-ms": "inf"}``, ``{"x-ratelimit-reset-tokens": "114h18m0s"}``), or None for
    no header.

    Transport: ``timeout`` holds the request for ``hold`` seconds (longer than the client's
    timeout); ``truncate`` promises more bytes in Content-Length than it sends and closes the
    connection; ``cut_json`` sends half a JSON body with a matching length.

    Answers: ``refusal`` (OpenAI ``message.refusal`` with ``content: null``; Anthropic
    ``stop_reason: "refusal"``); ``length`` (cut at half its tokens: OpenAI
    ``finish_reason: "length"``, Anthropic ``stop_reason: "max_tokens"``, inside a tool call
    too, whose partial input is closed as the API closes it); ``length_parses`` (the same stop
    reason on an answer whose text is whole, so it still parses); ``tool_call`` (a tool call
    where text was asked); ``text_reply`` (text where a tool call was asked); ``cached`` and
    ``cache_write`` (three quarters of the input read from, or written to, the prompt cache);
    ``reasoning`` (OpenAI reasoning tokens, counted inside ``completion_tokens``).
    """

    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_timeout: float = 0.0
    rate_truncate: float = 0.0
    script: Mapping[int, str] = field(default_factory=dict)
    retry_after: float | str | Mapping[str, str] | None = 1.0
    hold: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        for number, name in self.script.items():
            if name not in HTTP_FAULTS:
                raise ConfigError(f"HttpFaults.script[{number}] = {name!r}; choose from "
                                  f"{', '.join(HTTP_FAULTS)}")
        for _, name in RATE_FAULTS:
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"HttpFaults.{name} must be a probability in [0, 1]")

    def draw(self, number: int) -> str | None:
        if number in self.script:
            return self.script[number]
        rates = [(fault, getattr(self, name)) for fault, name in RATE_FAULTS]
        if not any(rate for _, rate in rates):
            return None
        rng = random.Random(f"{self.seed}:{number}")
        for fault, rate in rates:
            if rng.random() < rate:
                return fault
        return None

    def retry_header(self) -> dict[str, str]:
        """``retry-after`` (and ``retry-after-ms`` for a number of seconds), the headers
        given, or nothing."""
        value = self.retry_after
        if value is None or isinstance(value, Mapping):
            return dict(value or {})
        if isinstance(value, str):
            return {"retry-after": value}
        return {"retry-after": f"{max(0, round(value))}", "retry-after-ms": f"{value * 1000:g}"}
