"""Provider settings are refused before anything is spent, as ConfigErrors that never echo a
pasted key; a blocking provider returns at its timeout without holding the run."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from batchjson import CallableProvider, Session, SimulatedModel
from batchjson._errors import ConfigError, ProviderError, ProviderSetupError
from batchjson._providers.anthropic import AnthropicProvider
from batchjson._providers.base import Call, Reply
from batchjson._providers.openai import OpenAIProvider
from batchjson._providers.reply import received
from batchjson._providers.select import make_provider, provider_label
from batchjson.testing import LoopbackServer
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

KEYS = ("sk-proj-Q1w2E3r4T5y6U7i8O9p0AsDfGhJkL", "sk-ant-api03-abcdefghijklmnop0123456789",
        "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "4f9a8c7b6e5d4c3b2a1f0e9d8c7b6a5f")


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BATCHJSON_PROVIDER", "BATCHJSON_MODEL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _shown(exc: BaseException) -> str:
    return f"{exc} {exc!r}"


@pytest.mark.parametrize("key", KEYS)
def test_a_key_pasted_as_provider_is_shown_by_its_first_four_characters(key, tmp_path):
    with pytest.raises(ConfigError) as info:
        make_provider(key)
    assert key not in _shown(info.value) and repr(key[:4]) in str(info.value)
    assert key not in provider_label(key)
    ledger = tmp_path / "l.sqlite"
    session = Session(key, ledger=ledger)
    assert key not in repr(session)
    with pytest.raises(ConfigError) as info:
        session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert key not in _shown(info.value)
    session.close()
    for path in tmp_path.iterdir():  # nothing of the key reached the ledger's files
        assert key.encode() not in path.read_bytes()


@pytest.mark.parametrize("key", KEYS)
def test_a_key_pasted_as_model_is_refused_at_construction_without_echo(key):
    attempts = [
        lambda: OpenAIProvider(key, base_url="http://127.0.0.1:9/v1"),
        lambda: AnthropicProvider(key, base_url="http://127.0.0.1:9"),
        lambda: SimulatedModel(model=key),
        lambda: CallableProvider(items_reply, model=key),
        lambda: CallableProvider(items_reply, source=key),
        lambda: make_provider("simulated", model=key),
        lambda: Session("simulated", model=key).provider,
    ]
    for attempt in attempts:
        with pytest.raises(ProviderSetupError, match="looks like an API key") as info:
            attempt()
        assert key not in _shown(info.value) and repr(key[:4]) in str(info.value)


def test_ordinary_model_names_are_accepted():
    for name in ("gpt-4o-mini", "llama3:8b", "meta-llama/Llama-3.1-8B-Instruct",
                 "Qwen2.5-72B-Instruct", "claude-sonnet-4-5-20250929", "my-local-llama"):
        assert OpenAIProvider(name, base_url="http://127.0.0.1:9/v1").model == name


def test_a_key_pasted_as_base_url_is_not_echoed():
    key = KEYS[0]
    with pytest.raises(ProviderSetupError, match="is not an http") as info:
        OpenAIProvider("m", base_url=key)
    assert key not in _shown(info.value)


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"timeout": -5}, {"timeout": float("nan")},
                                    {"timeout": float("inf")}, {"response_format": "xml"},
                                    {"prices": {"m": {"input": -1, "output": 1}}},
                                    {"extra_body": {"model": "other"}}])
def test_bad_provider_settings_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        OpenAIProvider("m", base_url="http://127.0.0.1:9/v1", **kwargs)


def test_bad_anthropic_and_simulated_settings_are_config_errors():
    from batchjson import FaultPlan

    for make in (lambda: AnthropicProvider("m", base_url="http://x:9", mode="json"),
                 lambda: AnthropicProvider("m", base_url="http://x:9", max_tokens=True),
                 lambda: FaultPlan(malformed_json=2.0),
                 lambda: FaultPlan(script={0: "gremlins"}),
                 lambda: CallableProvider("not callable"),
                 lambda: CallableProvider(items_reply, timeout=0)):
        with pytest.raises(ProviderSetupError):
            make()


def test_a_provider_whose_complete_is_not_async_is_refused_before_any_call():
    class SyncProvider:
        name = "sync"
        calls = 0

        def complete(self, call):
            self.calls += 1
            return items_reply(call)

    provider = SyncProvider()
    session = Session(provider)
    with pytest.raises(ProviderSetupError, match="complete is not async"):
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert provider.calls == 0 and session.ledger.attempts("r") == []


def test_an_object_with_an_async_call_method_as_complete_is_a_provider():
    class Complete:
        async def __call__(self, call):
            return items_reply(call)

    class Wrapped:
        name = "wrapped"
        complete = Complete()

    provider = Wrapped()
    assert make_provider(provider) is provider


def _hanging(release: threading.Event, started: threading.Event, box: dict[str, Any]):
    def fn(call: Call) -> str:
        box["thread"] = threading.current_thread()
        started.set()
        release.wait(20)  # an SDK call that hangs for 20 s
        return items_reply(call)

    fn.blocking = True  # type: ignore[attr-defined]
    return fn


def test_a_blocking_provider_returns_at_the_session_timeout_leaving_its_thread_behind():
    release, started, box = threading.Event(), threading.Event(), {}
    session = Session(CallableProvider(_hanging(release, started, box)), timeout=1,
                      transport_retries=0, repairs=0, replays=0)
    try:
        result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, on_exhausted="return")
        # the run is back while the 20 s call is still blocked in its own thread
        assert started.is_set() and box["thread"].is_alive() and not release.is_set()
        assert not result.resolved
        messages = " ".join(e["message"] for e in result.errors)
        assert "within 1s" in messages
        assert [a.status for a in session.ledger.attempts("r")] == ["provider_error"]
    finally:
        release.set()
    box["thread"].join(10)
    assert not box["thread"].is_alive()


def test_a_blocking_provider_with_its_own_timeout_says_timeout():
    release, started, box = threading.Event(), threading.Event(), {}
    provider = CallableProvider(_hanging(release, started, box), timeout=0.2)
    call = Call(tasks=tuple(review_tasks(1)), prompt="p", system="", schema={}, attempt=0,
                kind="answer", request_key="k")
    try:
        with pytest.raises(ProviderError, match="timeout") as info:
            asyncio.run(provider.complete(call))
        assert info.value.retryable
        assert box["thread"].is_alive() and not release.is_set()
    finally:
        release.set()
    box["thread"].join(10)


def test_a_blocking_provider_still_answers_and_raises_through_its_thread():
    def fine(call):
        return items_reply(call)

    def broken(call):
        raise RuntimeError("SDK exploded")

    fine.blocking = broken.blocking = True  # type: ignore[attr-defined]
    call = Call(tasks=tuple(review_tasks(1)), prompt="p", system="", schema={}, attempt=0,
                kind="answer", request_key="k", identity=("task_id", "case_id", "candidate_id"))
    assert asyncio.run(CallableProvider(fine).complete(call)).text == items_reply(call)
    with pytest.raises(RuntimeError, match="SDK exploded"):
        asyncio.run(CallableProvider(broken).complete(call))


def test_odd_usage_in_a_reply_is_read_or_recorded_as_unknown_never_a_crash():
    """The one boundary (received) reads what a provider's Reply carries."""
    reply = received(Reply("{}", input_tokens="12", output_tokens=3.0, cached_tokens=-1,
                           cost="0.5"))
    assert (reply.input_tokens, reply.output_tokens, reply.cached_tokens) == (12, 3, None)
    assert reply.cost == 0.5 and reply.extra["unreadable_usage"] == {"cached_tokens": "-1"}
    odd = received(Reply("{}", input_tokens=True, output_tokens="many", cost=float("nan")))
    assert (odd.input_tokens, odd.output_tokens, odd.cost) == (None, None, None)
    assert set(odd.extra["unreadable_usage"]) == {"input_tokens", "output_tokens", "cost"}
    assert odd.tokens == 0


def test_a_provider_reporting_string_token_counts_still_commits_its_answer():
    def model(call):
        return Reply(items_reply(call), input_tokens="10", output_tokens="lots")

    session = Session(CallableProvider(model))
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert result.resolved and len(result.values) == 2
    assert [a.input_tokens for a in session.ledger.attempts("r")] == [10, 10]


# -- a usage no call can have ----------------------------------------------------------------
ABSURD = 10**30


class AbsurdUsage(SimulatedModel):
    """The loopback server's model, reporting 10^30 input tokens for every answer (live and
    in batch output lines alike)."""

    def reply(self, call: Any, text: str) -> Any:
        out = super().reply(call, text)
        out.input_tokens = ABSURD
        return out


def settled_with_usage_unknown(session: Session, result: Any, name: str,
                               output_known: bool = True) -> None:
    assert result.status == "resolved"
    receipts = session.ledger.attempts(name)
    assert receipts and {r.status for r in receipts} == {"accepted"}  # none left in flight
    assert {r.input_tokens for r in receipts} == {None}
    assert all(r.output_tokens for r in receipts) == output_known  # what is known is kept
    assert any("usage no call can have" in note for note in result.notes)


@pytest.mark.parametrize("protocol", ["openai", "anthropic", "callable"])
def test_a_usage_of_10_to_the_30_tokens_settles_the_receipt_with_usage_unknown(protocol: str):
    """SQLite cannot hold 10^30: the run stopped with a LedgerError and the paid call's
    receipt stayed open. An impossible count is the provider's error, read as unknown."""
    from batchjson.testing import LoopbackServer
    from tests.helpers import anthropic, openai

    if protocol == "callable":
        session = Session(CallableProvider(lambda call: Reply(
            items_reply(call), input_tokens=ABSURD, output_tokens=float(ABSURD))))
        result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
        return settled_with_usage_unknown(session, result, "r", output_known=False)
    with LoopbackServer(AbsurdUsage()) as srv:
        session = Session((openai if protocol == "openai" else anthropic)(srv))
        result = session.run_batch("r", review_tasks(4), LABEL_SCHEMA, pack=2)
    settled_with_usage_unknown(session, result, "r")


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_batch_output_line_with_an_absurd_usage_is_collected_with_usage_unknown(protocol: str):
    from batchjson.testing import LoopbackServer
    from tests.helpers import anthropic, openai

    with LoopbackServer(AbsurdUsage()) as srv:
        srv.batches.delay = 0.05
        session = Session((openai if protocol == "openai" else anthropic)(srv))
        session.job_poll = 0.05
        result = session.run_batch("b", review_tasks(4), LABEL_SCHEMA, pack=2,
                                   transport="batch", wait=True)
    settled_with_usage_unknown(session, result, "b")


def test_a_token_count_is_a_whole_number_up_to_a_billion():
    for odd in (10**9 + 1, float(ABSURD), "1" * 5000, "\u00b2", str(ABSURD), -1):
        assert received(Reply("{}", input_tokens=odd)).input_tokens is None, odd
    assert received(Reply("{}", input_tokens=10**9, output_tokens="7")).tokens == 10**9 + 7


class ImpossibleCacheRead(LoopbackServer):
    """OpenAI answers saying 10^9 of a few hundred prompt tokens were read from the cache."""

    async def _send(self, request: Any, payload: dict[str, Any], fault: Any) -> Any:
        payload["usage"]["prompt_tokens_details"]["cached_tokens"] = 10**9
        return await super()._send(request, payload, fault)


@pytest.mark.parametrize("protocol", ["openai", "callable"])
def test_more_cached_tokens_than_prompt_tokens_are_unknown_and_noted(protocol: str):
    """``cached_tokens`` 10^9 against 236 prompt tokens was stored as reported, in silence,
    and the call priced as if its whole prompt came from the cache."""
    from batchjson._providers.pricing import cost_of
    from tests.helpers import openai

    if protocol == "callable":
        session = Session(CallableProvider(lambda call: Reply(
            items_reply(call), input_tokens=236, output_tokens=9, cached_tokens=10**9)))
        result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    else:
        with ImpossibleCacheRead() as srv:
            session = Session(openai(srv))
            result = session.run_batch("r", review_tasks(4), LABEL_SCHEMA, pack=2)
    assert result.status == "resolved"
    receipts = session.ledger.attempts("r")
    assert {r.cached_tokens for r in receipts} == {None}
    assert all(r.input_tokens and r.output_tokens for r in receipts)  # what is known is kept
    assert any("usage no call can have" in note for note in result.notes)
    assert cost_of("gpt-4o-mini", 236, 9, 10**9) == cost_of("gpt-4o-mini", 236, 9, 0)
