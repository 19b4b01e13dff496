"""Rate limits as the providers state them: recorded real headers read right, and the loopback
server's enforced limits answered as the official SDKs expect a 429 to look."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from batchjson._providers._http import http_error
from batchjson._providers.ratelimits import (
    RETRY_AFTER_MAX,
    go_seconds,
    reported,
    reset_seconds,
    retry_wait,
)
from batchjson.testing import Limits, LoopbackServer
from batchjson.testing._ratelimits import counted_tokens
from tests.protocol import GO_DURATION, OPENAI_LIMIT_HEADERS

RECORDED = Path(__file__).parent / "fixtures" / "recorded"


def recorded_headers(path: str) -> dict[str, str]:
    return dict(json.loads((RECORDED / path).read_text())["headers"])


@pytest.mark.parametrize(("text", "seconds"), [
    ("0s", 0.0), ("1ms", 0.001), ("12ms", 0.012), ("3.89s", 3.89), ("1.235s", 1.235),
    ("1m30s", 90.0), ("6m0s", 360.0), ("114h18m0s", 114 * 3600 + 18 * 60), ("2", 2.0),
])
def test_go_durations_as_openai_writes_them_are_read_in_seconds(text: str,
                                                                seconds: float) -> None:
    assert go_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "1x", "m30s", "3s4"])
def test_an_unreadable_duration_is_none_not_a_guess(text: str) -> None:
    assert go_seconds(text) is None


def test_recorded_openai_headers_give_the_limits_what_is_left_and_the_resets() -> None:
    seen = reported(recorded_headers("openai/oa_chat_json_schema_headers.json"))
    assert (seen.requests.limit, seen.requests.remaining) == (5000, 4999)
    assert (seen.tokens.limit, seen.tokens.remaining) == (800_000, 799_976)
    assert seen.requests.reset == pytest.approx(0.012)
    assert seen.tokens.reset == pytest.approx(0.001)
    other = reported(recorded_headers("openai/oa_chat_reasoning_tokens_headers.json"))
    assert (other.tokens.limit, other.tokens.reset) == (150_000_000, 0.0)


def test_recorded_anthropic_headers_give_the_limits_and_resets_as_instants() -> None:
    headers = recorded_headers("anthropic/an_text_headers.json")
    now = datetime.fromisoformat("2025-08-21T12:40:57+00:00").timestamp()
    seen = reported(headers, now)
    assert (seen.requests.limit, seen.requests.remaining) == (1000, 999)
    assert seen.tokens.limit == 96_000  # the combined limit, when it is sent
    assert seen.requests.reset == pytest.approx(2.0)
    assert reset_seconds("2025-08-21T12:40:59Z", now + 10) == 0.0  # never negative


def test_anthropic_limits_are_read_whatever_the_case_of_their_header_names() -> None:
    """A plain mapping of headers (a recording, a test double) is read in any case; without
    the combined tokens limit, the input-tokens limit is the one paced to."""
    seen = reported({"Anthropic-RateLimit-Requests-Limit": "50",
                     "ANTHROPIC-RATELIMIT-INPUT-TOKENS-LIMIT": "40000",
                     "anthropic-ratelimit-input-tokens-remaining": "39000",
                     "x-ratelimit-limit-tokens": "7"})  # not OpenAI's: Anthropic's are sent
    assert (seen.requests.limit, seen.tokens.limit, seen.tokens.remaining) == (50, 40000, 39000)
    assert reported({"x-anthropic-ratelimit-requests-limit": "50"}).any is False


def test_a_429_without_retry_after_waits_for_the_exhausted_limits_reset() -> None:
    headers = {"x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "0",
               "x-ratelimit-reset-tokens": "3.89s", "x-ratelimit-limit-requests": "500",
               "x-ratelimit-remaining-requests": "499", "x-ratelimit-reset-requests": "120ms"}
    assert retry_wait(headers) == pytest.approx(3.89)
    body = json.dumps({"error": {"message": "Rate limit reached", "type": "tokens",
                                 "code": "rate_limit_exceeded"}}).encode()
    error = http_error("openai", 429, headers, body, None, "OPENAI_API_KEY")
    assert error.retryable and error.retry_after == pytest.approx(3.89)
    minutes = {**headers, "x-ratelimit-reset-tokens": "1m30s"}
    assert http_error("openai", 429, minutes, body, None, "K").retry_after == 90.0


def test_retry_after_ms_wins_over_retry_after_and_over_the_resets() -> None:
    headers = {"retry-after-ms": "250", "retry-after": "2", "x-ratelimit-remaining-tokens": "0",
               "x-ratelimit-reset-tokens": "9s"}
    assert retry_wait(headers) == 0.25
    assert retry_wait({"retry-after": "2", "x-ratelimit-reset-tokens": "9s"}) == 2.0


def test_the_server_counts_a_requests_tokens_on_arrival_as_openai_documents() -> None:
    body = {"model": "m", "max_completion_tokens": 50, "messages": [
        {"role": "system", "content": "s" * 40}, {"role": "user", "content": "u" * 360}]}
    assert counted_tokens(body) == 400 // 4 + 50
    block = [{"type": "text", "text": "y" * 8}]
    anthropic_body = {"model": "m", "max_tokens": 7, "system": [{"type": "text", "text": "x" * 8}],
                      "messages": [{"role": "user", "content": block}]}
    assert counted_tokens(anthropic_body) == 4 + 7


def test_limits_are_applied_over_short_slices_of_the_minute() -> None:
    limits = Limits.enforced(600, 1_000_000, slice_seconds=1.0)  # 10 requests a second
    start = limits.requests.at
    admitted = [limits.admit(1, now=start) is None for _ in range(15)]
    assert admitted.count(True) == 10
    assert limits.admit(1, now=start) == ("requests", pytest.approx(0.1))
    assert limits.admit(1, now=start + 0.2) is None  # the slice drains continuously


def test_the_official_openai_sdk_parses_the_servers_rate_limit_429() -> None:
    with LoopbackServer(rate_limits=Limits.enforced(6000, 400, slice_seconds=60)) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        ask = {"model": "gpt-4o-mini", "max_completion_tokens": 100,
               "messages": [{"role": "user", "content": "x" * 800}]}
        client.chat.completions.create(**ask)  # 300 of the minute's 400 tokens
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(**ask)
        with pytest.raises(openai.RateLimitError) as too_large:
            client.chat.completions.create(**{**ask, "max_completion_tokens": 1000})
    error, response = refused.value, refused.value.response
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert error.type == "tokens"
    assert "on tokens per min (TPM): Limit 400, Used 300, Requested 300" in error.message
    assert "retry-after" not in response.headers  # as OpenAI's own 429s: only the resets
    assert all(name in response.headers for name in OPENAI_LIMIT_HEADERS)
    assert response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert GO_DURATION.fullmatch(response.headers["x-ratelimit-reset-tokens"])
    assert retry_wait(response.headers) == pytest.approx(30.0, abs=1.0)  # 200 over, 400/min
    assert "Request too large" in too_large.value.message


def test_the_official_anthropic_sdk_parses_the_servers_rate_limit_429() -> None:
    with LoopbackServer(rate_limits=Limits.enforced(1, 100_000, slice_seconds=60)) as srv:
        client = anthropic.Anthropic(base_url=srv.anthropic_base_url, api_key="k",
                                     max_retries=0)
        ask = {"model": "claude-haiku-4-5", "max_tokens": 50,
               "messages": [{"role": "user", "content": "hi"}]}
        client.messages.create(**ask)
        with pytest.raises(anthropic.RateLimitError) as refused:
            client.messages.create(**ask)
    error = refused.value
    assert error.status_code == 429
    assert error.body["error"]["type"] == "rate_limit_error"
    assert float(error.response.headers["retry-after"]) > 0
    assert error.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert retry_wait(error.response.headers) == min(  # honoured up to 20 s, then retried
        float(error.response.headers["retry-after"]), RETRY_AFTER_MAX)


def test_a_429_from_the_server_reaches_the_replay_loop_with_the_reset_as_its_wait() -> None:
    from tests.helpers import items_call
    from tests.helpers import openai as openai_provider

    async def go() -> float | None:
        async with LoopbackServer(rate_limits=Limits.enforced(1, 10**6, 60)) as srv:
            provider = openai_provider(srv)
            await provider.complete(items_call())
            try:
                await provider.complete(items_call())
            except Exception as exc:  # noqa: BLE001 - the ProviderError is what is checked
                return getattr(exc, "retry_after", None)
            finally:
                await provider.aclose()
        return None

    wait = asyncio.run(go())
    assert wait is not None and 55 < wait <= 60  # the request bucket's reset, not a guess


class UnreadableLimitsServer(LoopbackServer):
    """Every answer (a 429 too) carries rate-limit headers no one can read: ``²`` passes
    ``str.isdigit`` but not ``int``, 5000 digits exceed ``int``'s conversion limit."""

    def __init__(self, value: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value = value

    def _stamp(self, request: Any, response: Any) -> None:
        for family in ("x-ratelimit-{}-requests", "x-ratelimit-{}-tokens",
                       "anthropic-ratelimit-requests-{}", "anthropic-ratelimit-tokens-{}"):
            for part in ("limit", "remaining", "reset"):
                response.headers[family.format(part)] = self.value
        response.headers["retry-after"] = response.headers["retry-after-ms"] = self.value
        super()._stamp(request, response)


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "\u0661\u0662s"])
def test_an_unreadable_rate_limit_header_is_unknown_and_the_paid_answer_is_used(
        protocol: str, value: str) -> None:
    """Such a header raised ValueError inside the HTTP exchange: the billed 200 answer was
    discarded as "the request could not be sent", and a 429 carrying it ended the run."""
    from batchjson import Session
    from batchjson.testing import HttpFaults
    from tests.helpers import LABEL_SCHEMA, anthropic, review_tasks
    from tests.helpers import openai as openai_provider

    make = openai_provider if protocol == "openai" else anthropic
    with UnreadableLimitsServer(value, faults=HttpFaults(script={1: "429"},
                                                         retry_after=None)) as srv:
        session = Session(make(srv), ledger=":memory:", max_rate_wait=2.0)
        result = session.run_batch("b", review_tasks(2), LABEL_SCHEMA, pack=2,
                                   on_exhausted="return")
    assert (srv.responses[429], srv.responses[200]) == (1, 1)
    assert result.status == "resolved" and len(result.values) == 2
    assert [r.status for r in session.ledger.attempts("b")][-1] == "accepted"
    assert reported({"x-ratelimit-limit-tokens": value}) == reported({})
    assert retry_wait({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": value,
                       "retry-after": value}) is None
