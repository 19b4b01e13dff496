"""Pacing: a session's runs stay under the provider's requests and tokens per minute, learn the
limits from its headers, and a 429 holds every call for the reset instead of retrying into it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchjson import ConfigError, InvalidBatch, RateLimits, RunSpec, Session
from batchjson._providers.ratelimits import request_tokens
from batchjson._replay.pacing import Pacer
from batchjson.testing import HttpFaults, Limits, LoopbackServer
from batchjson.testing._ratelimits import counted_tokens
from tests.helpers import LABEL_SCHEMA, openai, review_tasks
from tests.helpers import anthropic as anthropic_provider

CAP = {"max_completion_tokens": 60}


def refused_share(srv: LoopbackServer) -> float:
    return srv.responses[429] / max(1, srv.requests)


def test_a_run_stays_under_the_limits_it_learns_with_under_one_percent_429s() -> None:
    # 2,400 requests and 600,000 tokens a minute over one-second slices: 40 calls (about
    # 10,000 tokens) a second, both near binding, far below what 32 workers send unpaced.
    with LoopbackServer(rate_limits=Limits.enforced(2400, 600_000, 1.0)) as srv:
        session = Session(openai(srv, extra_body=CAP), ledger=":memory:", concurrency=32)
        result = session.run_batch("paced", review_tasks(60), LABEL_SCHEMA)
    assert result.status == "resolved"
    assert refused_share(srv) < 0.01
    assert session.pacer.learnt == RateLimits(2400, 600_000)  # from the first answer's headers


def test_the_call_sent_alone_to_learn_the_limits_counts_against_the_first_burst() -> None:
    """A fresh ledger's first call goes alone, with no bucket; the provider counted its tokens,
    so the first paced call waits for them to drain. Each call here is over half of what a
    one-second slice passes (1,000 tokens), so counting it twice is what keeps them apart."""
    with LoopbackServer(rate_limits=Limits.enforced(6000, 60_000, 1.0)) as srv:
        session = Session(openai(srv, extra_body={"max_completion_tokens": 600}),
                          ledger=":memory:", concurrency=8)
        result = session.run_batch("large", review_tasks(3), LABEL_SCHEMA, pack=1)
    assert result.status == "resolved"
    assert srv.responses[429] == 0 and srv.responses[200] == 3


def test_limits_the_user_sets_pace_the_first_calls_too() -> None:
    with LoopbackServer(rate_limits=Limits.enforced(1200, 1_000_000, 1.0)) as srv:
        session = Session(openai(srv, extra_body=CAP), ledger=":memory:", concurrency=32,
                          rate_limits={"rpm": 1200})
        result = session.run_batch("set", review_tasks(40), LABEL_SCHEMA)
    assert result.status == "resolved" and srv.responses[429] == 0
    assert session.rate_limits == RateLimits(requests_per_minute=1200)


def test_limits_set_from_another_thread_during_a_run_change_on_the_runs_loop() -> None:
    """A notebook's ``session.rate_limits = ...`` while a run paces in another thread: the
    buckets the run's calls wait on are rebuilt between their steps, never under them."""
    with LoopbackServer(rate_limits=Limits.enforced(1200, 1_000_000, 1.0)) as srv:
        session = Session(openai(srv, extra_body=CAP), ledger=":memory:", concurrency=16,
                          rate_limits={"rpm": 1200})
        rebuilt_on, set_limits = [], session.pacer.set_limits

        def recorded(limits: RateLimits) -> None:
            rebuilt_on.append(threading.current_thread().name)
            set_limits(limits)

        session.pacer.set_limits = recorded  # type: ignore[method-assign]
        results = []
        run = threading.Thread(target=lambda: results.append(
            session.run_batch("changing", review_tasks(30), LABEL_SCHEMA)))
        run.start()
        while not srv.requests and run.is_alive():  # the run's loop is pacing its calls
            time.sleep(0.005)
        while run.is_alive():  # as a person would: a few changes, a moment apart
            session.rate_limits = {"rpm": 1200 if len(rebuilt_on) % 2 else 1100}
            time.sleep(0.25)
        run.join()
    assert results[0].status == "resolved" and srv.responses[429] == 0
    assert rebuilt_on and set(rebuilt_on) == {f"batchjson-{session.id}"}


def test_new_limits_count_what_the_bucket_they_replace_had_just_spent() -> None:
    """A burst spent, then limits set again: the provider counted that burst, so the next call
    waits for it to drain rather than opening a second burst at once."""
    async def go() -> float:
        pacer = Pacer(RateLimits(requests_per_minute=600), concurrency=64, slice_seconds=10)
        loop = asyncio.get_running_loop()
        burst = 0
        while True:  # the whole burst, taken at once
            start = loop.time()
            await pacer.acquire(1, 0)
            pacer.release()
            if loop.time() - start > 0.05:
                break
            burst += 1
        pacer.set_limits(RateLimits(requests_per_minute=660))
        start = loop.time()
        for _ in range(10):  # the new burst is 10% larger: five fit, five wait
            await pacer.acquire(1, 0)
            pacer.release()
        return loop.time() - start

    waited = asyncio.run(go())
    assert waited >= 0.35  # five at 11 a second (less headroom), not a fresh burst at once


def test_pacing_is_shared_by_all_runs_of_one_session() -> None:
    """Two runs at once from two threads: each alone would fill the limit, so only one pacer
    for both keeps the session under it."""
    with LoopbackServer(rate_limits=Limits.enforced(1200, 1_000_000, 1.0)) as srv:
        session = Session(openai(srv, extra_body=CAP), ledger=":memory:", concurrency=16,
                          rate_limits={"requests_per_minute": 1200})
        results = {}

        def run(name: str) -> None:
            results[name] = session.run_batch(name, review_tasks(30, case=name), LABEL_SCHEMA)

        threads = [threading.Thread(target=run, args=(name,)) for name in ("one", "two")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert {r.status for r in results.values()} == {"resolved"}
    assert srv.responses[200] == 60 and srv.responses[429] == 0


def test_the_pacer_counts_tokens_as_the_providers_limiter_does() -> None:
    """Prompt characters / 4 plus max_tokens, the same count the server charges on arrival;
    not the budget's worst case (every byte of the body)."""
    with LoopbackServer() as srv:
        provider = openai(srv, extra_body=CAP)
        from tests.helpers import items_call

        call = items_call()
        body = provider.request_body(call)[0]
    assert request_tokens(call.system, call.prompt, 60) == counted_tokens(body)
    assert request_tokens(call.system, call.prompt, 60) < provider.input_bound(call) + 60


def test_a_429_holds_every_call_for_its_wait_and_halves_the_calls_in_flight() -> None:
    async def go() -> tuple[float, float, float]:
        pacer = Pacer(RateLimits(), concurrency=8)
        loop = asyncio.get_running_loop()
        pacer.penalise(0.3)
        halved = pacer.allowed
        pacer.penalise(0.3)  # a second 429 of the same burst does not halve again
        start = loop.time()
        await pacer.acquire(1, 100)
        waited = loop.time() - start
        for _ in range(40):
            pacer.release(answered=True)
            await pacer.acquire(1, 100)
        pacer.release()
        return halved, waited, pacer.allowed

    halved, waited, climbed = asyncio.run(go())
    assert halved == 4.0
    assert waited >= 0.29
    assert climbed == 8.0  # each answer climbs back a step, up to the session's concurrency


def test_calls_in_flight_never_exceed_what_the_pacer_allows() -> None:
    async def go() -> int:
        pacer = Pacer(RateLimits(), concurrency=4)
        pacer.allowed = 2.0
        most = 0

        async def call() -> None:
            nonlocal most
            await pacer.acquire()
            most = max(most, pacer.in_flight)
            await asyncio.sleep(0.01)
            pacer.release(answered=False)

        await asyncio.gather(*(call() for _ in range(12)))
        return most

    assert asyncio.run(go()) == 2


def test_remaining_tokens_below_a_burst_pause_the_session_until_the_provider_catches_up() -> None:
    async def go() -> float:
        pacer = Pacer(RateLimits(tokens_per_minute=60_000), concurrency=4)
        pacer.observe({"x-ratelimit-limit-tokens": "60000", "x-ratelimit-remaining-tokens": "0"})
        return pacer.paused

    paused = asyncio.run(go())
    assert 0.4 < paused < 0.6  # half a second's worth of tokens at 1,000 a second


def test_the_providers_remaining_counts_lower_and_raise_the_pacers_view() -> None:
    """Less left than a burst (tokens or requests) holds the calls; a later answer saying a
    burst is left again releases them at once; a 429's own wait is never cut short."""
    async def go() -> tuple[float, float, float, float]:
        pacer = Pacer(RateLimits(600, 60_000), concurrency=4)
        loop = asyncio.get_running_loop()
        pacer.observe({"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "0",
                       "x-ratelimit-limit-tokens": "60000",
                       "x-ratelimit-remaining-tokens": "60000"})
        lowered = pacer._open_at - loop.time()
        pacer.observe({"anthropic-ratelimit-requests-limit": "600",
                       "anthropic-ratelimit-requests-remaining": "600",
                       "anthropic-ratelimit-input-tokens-limit": "60000",
                       "anthropic-ratelimit-input-tokens-remaining": "59000"})
        raised = pacer._open_at - loop.time()
        pacer.penalise(0.5)
        pacer.observe({"x-ratelimit-limit-tokens": "60000",
                       "x-ratelimit-remaining-tokens": "60000"})
        return lowered, raised, pacer._open_at - loop.time(), pacer.paused

    lowered, raised, refused, paused = asyncio.run(go())
    assert 0.4 < lowered < 0.6  # half a second's worth of requests at 10 a second
    assert raised <= 0
    assert 0.4 < refused <= 0.5 and paused < 0.6


def test_an_answer_leaving_many_bursts_lets_the_next_tenth_of_a_slice_go_unread_but_no_refusal(
) -> None:
    """Reading every answer's headers costs each call; one leaving four bursts of each limit
    means nothing sent in the next tenth of a slice could bring either below one, so those go
    unread. A 429, or an answer after that tenth, is read at once."""
    plenty = {"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "600"}
    short = {"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "0"}

    async def go() -> tuple[float, float, float]:
        pacer = Pacer(RateLimits(600), concurrency=4, slice_seconds=1.0)
        loop = asyncio.get_running_loop()
        pacer.observe(plenty)
        pacer.observe(short)  # within the tenth: unread
        within = pacer._open_at - loop.time()
        await asyncio.sleep(0.12)
        pacer.observe(short)
        after = pacer._open_at - loop.time()
        pacer.observe(plenty)  # ends that pause, and starts a quiet tenth
        pacer.penalise(0.0)
        pacer.observe(short)  # after a refusal: read at once
        return within, after, pacer._open_at - loop.time()

    within, after, refused = asyncio.run(go())
    assert within <= 0 and 0.4 < after < 0.6 and 0.4 < refused < 0.6

    async def shared() -> float:  # four hosts spend the account's counts: four times as many
        pacer = Pacer(RateLimits(600), concurrency=4, slice_seconds=1.0)
        pacer.share(4)
        loop = asyncio.get_running_loop()
        left = int(4 * pacer._requests.max_rate) + 1  # plenty for one host, not for four
        pacer.observe({**plenty, "x-ratelimit-remaining-requests": str(left)})
        pacer.observe(short)
        return pacer._open_at - loop.time()

    assert asyncio.run(shared()) > 0  # read: paused until the provider has caught up


def test_a_pack_larger_than_the_token_limit_is_refused_before_spending_naming_the_pack_that_fits(
) -> None:
    with LoopbackServer() as srv:
        session = Session(openai(srv, extra_body={"max_completion_tokens": 1200}),
                          ledger=":memory:", rate_limits={"tokens_per_minute": 1600})
        with pytest.raises(InvalidBatch) as refused:
            session.run_batch("big", review_tasks(40), LABEL_SCHEMA, pack=20)
        assert srv.requests == 0 and session.spent_calls == 0
        message = str(refused.value)
        assert "1,600 tokens per minute" in message and "Nothing was spent" in message
        fits = int(message.split("(pack=")[1].split(")")[0])
        assert 1 <= fits < 20
        # the largest pack it names fits: sent at once (one request, so no wait for the next)
        result = session.run_batch("fits", review_tasks(40)[-fits:], LABEL_SCHEMA, pack=fits)
    assert result.status == "resolved" and result.calls == 1


@pytest.mark.parametrize("value", [{"rpm": 0}, {"requests": 5}, "fast", (1, 2, 3),
                                   {"tpm": 1.5}])
def test_a_bad_rate_limit_is_refused_naming_the_setting(value: object) -> None:
    with pytest.raises(ConfigError, match="rate_limits"):
        Session(ledger=":memory:", rate_limits=value)


def test_a_pack_refused_by_the_rate_limit_is_never_split() -> None:
    """Halving changes a request's keys: a 429 (a limit of the day) must not do it."""
    with LoopbackServer(faults=HttpFaults(rate_429=1.0, retry_after=0.0)) as srv:
        session = Session(openai(srv), ledger=":memory:", transport_retries=1, repairs=0,
                          replays=0)
        result = session.run_batch("limited", review_tasks(4), LABEL_SCHEMA, pack=4, split=True,
                                   on_exhausted="return")
    assert result.status != "resolved" and srv.requests == 2  # one call and its one retry
    assert {e["status"] for e in result.errors} == {429}


# -- a 429 that asks for a wait no run should make ------------------------------------------
FAR = "2099-01-01T00:00:00Z"
ENDLESS_WAITS = {  # (protocol, fault, the headers the 429 carries over the server's own)
    "retry-after 86400": ("openai", "429", {"retry-after": "86400"}),
    "retry-after-ms inf": ("openai", "429", {"retry-after-ms": "inf"}),
    "retry-after 1e12": ("anthropic", "429", {"retry-after": "1e12"}),
    "retry-after 2099": ("openai", "429", {"retry-after": "Thu, 01 Jan 2099 00:00:00 GMT"}),
    "openai reset inf": ("openai", "429_tokens", {"x-ratelimit-reset-tokens": "inf"}),
    "openai reset 114h": ("openai", "429_tokens", {"x-ratelimit-reset-tokens": "114h18m0s"}),
    "openai reset 2099": ("openai", "429_tokens", {"x-ratelimit-reset-tokens": FAR}),
    "anthropic reset inf": ("anthropic", "429", {"anthropic-ratelimit-requests-reset": "inf"}),
    "anthropic reset 2099": ("anthropic", "429", {"anthropic-ratelimit-requests-reset": FAR}),
}


@pytest.mark.parametrize("shape", sorted(ENDLESS_WAITS))
def test_a_429_asking_for_an_endless_wait_ends_the_run_within_max_rate_wait_nothing_lost(
        shape: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """A Retry-After of a day, of 10^12 s, of infinity or until 2099, and resets of infinity,
    114 hours or 2099 paused the session's pacer that long: the run hung with no word. Now a
    limit still refusing after max_rate_wait ends the run unresolved, naming the limit, having
    said in its progress that it waited; a later run answers every task."""
    from batchjson._replay import replay

    monkeypatch.setattr(replay, "SAY_WAIT", 0.2)  # "a few seconds", shortened for the test
    protocol, fault, headers = ENDLESS_WAITS[shape]
    make = openai if protocol == "openai" else anthropic_provider

    faults = HttpFaults(script={n: fault for n in range(1, 100)}, retry_after=headers)
    with LoopbackServer(faults=faults) as srv:
        session = Session(make(srv), ledger=":memory:", max_rate_wait=1.0)
        start = time.monotonic()
        result = session.run_batch("limited", review_tasks(6), LABEL_SCHEMA, pack=2,
                                   on_exhausted="return", progress=True)
        took = time.monotonic() - start
        refused = srv.responses[429]
    assert took < 4.0 and refused <= 4  # waited at most max_rate_wait, then stopped
    assert result.status == "unresolved" and not result.values
    note = next(n for n in result.notes if "max_rate_wait" in n)
    assert "per min" in note and "re-run later" in note  # the limit, in the provider's words
    assert "rate limited (HTTP 429): waiting" in capsys.readouterr().err  # in the progress
    receipts = session.ledger.attempts("limited")
    # a receipt its worker opened as the run stopped is closed unsent: no call, nothing lost
    calls = [r for r in receipts if not (r.status == "cancelled" and r.sent_at is None)]
    assert calls and {r.status for r in calls} == {"provider_error"}
    with LoopbackServer() as srv:  # the limit has passed: the same ledger, every task answered
        session.provider = make(srv)
        again = session.run_batch("limited", review_tasks(6), LABEL_SCHEMA, pack=2)
    assert again.status == "resolved" and again.calls == 3


def test_a_retry_after_is_honoured_up_to_20_seconds_and_an_unreadable_wait_is_unknown() -> None:
    from batchjson._providers.ratelimits import retry_after, retry_wait

    assert retry_after({"retry-after": "86400"}) == 20.0
    assert retry_after({"retry-after": "1e12"}) == 20.0
    assert retry_after({"retry-after": "Thu, 01 Jan 2099 00:00:00 GMT"}) == 20.0
    assert retry_after({"retry-after-ms": "inf", "retry-after": "2"}) == 2.0
    for unknown in ("inf", "nan", "-inf", "1e400"):
        assert retry_after({"retry-after-ms": unknown}) is None
        assert retry_wait({"x-ratelimit-remaining-tokens": "0",
                           "x-ratelimit-reset-tokens": unknown}) is None
    assert retry_wait({"x-ratelimit-remaining-tokens": "0",
                       "x-ratelimit-reset-tokens": "114h18m0s"}) == 114 * 3600 + 18 * 60


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "60", True])
def test_a_bad_max_rate_wait_is_refused_before_the_ledger_is_opened(value: object) -> None:
    with pytest.raises(ConfigError, match="max_rate_wait must be a finite number of seconds"):
        Session("simulated", ledger=":memory:", max_rate_wait=value)  # type: ignore[arg-type]


_HOSTILE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_IDENTITY_VALUES = st.one_of(_HOSTILE_TEXT, st.integers(), st.booleans(), st.none(),
                             st.floats(allow_nan=False, allow_infinity=False))


def _counted_when_refused(srv: LoopbackServer, spec: RunSpec, limit: int) -> int | None:
    """The tokens the refusal says the largest request counts, or None if not refused."""
    session = Session(openai(srv), ledger=":memory:", rate_limits={"tokens_per_minute": limit})
    try:
        session.run(spec)
    except InvalidBatch as exc:
        return int(str(exc).split(" counts ")[1].split(" tokens")[0].replace(",", ""))
    finally:
        session.close()
    return None


_CONTEXTS = st.one_of(_HOSTILE_TEXT, st.lists(st.one_of(st.integers(), _HOSTILE_TEXT),
                                              max_size=40),
                      st.dictionaries(_HOSTILE_TEXT, _HOSTILE_TEXT, max_size=8))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases=st.lists(_IDENTITY_VALUES, min_size=1, max_size=6, unique_by=repr),
       notes=st.lists(_HOSTILE_TEXT, min_size=6, max_size=6), pack=st.integers(1, 4),
       value_mode=st.booleans(), context=_CONTEXTS)
def test_a_request_one_token_over_the_limit_is_refused_whatever_its_text(
        cases: list, notes: list[str], pack: int, value_mode: bool, context: object) -> None:
    """The check reads each request's size from its text before rendering any prompt: that
    reading never counts fewer tokens than the rendered request, so none over the limit passes
    (identity values a return echoes: text beyond ASCII, escapes, numbers in any form; a
    value's context a list or dict, which its prompt shows as Python writes it)."""
    if value_mode:
        tasks = [{"task_id": f"t{i}", "prompt": note, "context": context if i else repr(case)}
                 for i, (case, note) in enumerate(zip(cases, notes, strict=False))]
        spec = RunSpec(name="v", tasks=tasks, schema={"enum": ["yes", "no"]}, mode="value")
    else:
        tasks = [{"task_id": f"t{i}", "case": case, "prompt": note}
                 for i, (case, note) in enumerate(zip(cases, notes, strict=False))]
        spec = RunSpec(name="p", tasks=tasks, schema=LABEL_SCHEMA, pack=pack, mode="items",
                       identity=["task_id", "case"], instructions="Label each case.")
    with LoopbackServer() as srv:
        largest = _counted_when_refused(srv, spec, 1)
        assert largest is not None and largest > 1
        assert _counted_when_refused(srv, spec, largest - 1) == largest
        assert srv.requests == 0


def test_a_value_request_whose_context_is_a_list_over_the_limit_is_refused() -> None:
    """Its prompt shows the context as Python writes a list (a space after each comma): longer
    than the request's JSON text, so no size read from that text may wave it through."""
    tasks = [{"task_id": "t0", "prompt": "Sum these.", "context": [0] * 2000}]
    spec = RunSpec(name="v", tasks=tasks, schema={"type": "integer"}, mode="value")
    with LoopbackServer() as srv:
        largest = _counted_when_refused(srv, spec, 1)
        assert largest is not None
        assert _counted_when_refused(srv, spec, largest - 1) == largest
        assert srv.requests == 0
