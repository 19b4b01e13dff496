"""The replay loop is a plain worker pool: each worker reserves, claims and commits the receipt of
a call, then sends it. These tests hold what users rely on around that: a receipt never sent is
not a call, a slow call never holds up the others, and a run stops early (validator crash,
unreachable host) without sending what cannot help. The Session's one event loop is reused."""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import sqlite3
import threading
import time

import pytest

from batchjson import (
    BatchJsonError,
    BatchUnresolved,
    Budget,
    CallableProvider,
    OpenAIProvider,
    ProviderError,
    Session,
)
from batchjson.testing import LoopbackServer
from batchjson.testing.simulated import SimulatedModel
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


def test_an_interrupted_run_counts_only_the_calls_it_sent():
    sent = []

    async def model(call):
        sent.append(call.tasks[0]["task_id"])
        if len(sent) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second call is out
        return items_reply(call)

    session = Session(CallableProvider(model), concurrency=1)
    tasks = review_tasks(3)
    with pytest.raises(KeyboardInterrupt):
        session.run_batch("r", tasks, LABEL_SCHEMA)
    assert len(sent) == 2
    assert [a.status for a in session.ledger.attempts("r")] == ["accepted", "cancelled"]
    assert session.spent_calls == 2 and session.ledger.spend("r")["calls"] == 2
    assert session.evidence.minimum_exact_retry_calls == 2

    result = session.run_batch("r", tasks, LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 2
    kinds = {a.task_ids[0]: a.kind for a in session.ledger.attempts("r")[2:]}
    assert kinds == {tasks[1]["task_id"]: "replay", tasks[2]["task_id"]: "initial"}


def test_a_receipt_committed_but_never_sent_is_not_a_call(monkeypatch):
    """A Ctrl-C landing between the receipt's commit and the send: the receipt is closed as
    cancelled with no sent_at, and neither the ledger nor the budget counts it."""
    from batchjson._ledger.store_calls import CallStore

    begin = CallStore.begin_call_later

    def begin_call(store, tx, *args, **kwargs):
        begun = begin(store, tx, *args, **kwargs)
        loop = asyncio.get_running_loop()
        for task in asyncio.all_tasks(loop):  # the interrupt lands before the worker resumes
            loop.call_soon(task.cancel)
        return begun

    monkeypatch.setattr(CallStore, "begin_call_later", begin_call)
    sent = []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call)))
    with pytest.raises((asyncio.CancelledError, KeyboardInterrupt)):
        session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert sent == []
    assert [a.status for a in session.ledger.attempts("r")] == ["cancelled"]
    spend = session.ledger.spend("r")
    assert spend["calls"] == 0 and spend["unsent"] == 1 and session.spent_calls == 0


def test_a_slow_call_does_not_hold_up_the_others():
    tasks = review_tasks(3)
    slow = tasks[0]["task_id"]
    log = []
    release = asyncio.Event()

    async def model(call):
        task_id = call.tasks[0]["task_id"]
        log.append(("start", task_id))
        if task_id == slow:
            await release.wait()
        elif len([e for e in log if e[0] == "end"]) == 1:
            release.set()  # the other two calls went out and came back meanwhile
        log.append(("end", task_id))
        return items_reply(call)

    session = Session(CallableProvider(model), concurrency=2)
    result = session.run_batch("r", tasks, LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 3
    assert log.index(("end", tasks[2]["task_id"])) < log.index(("end", slow))


@pytest.fixture
def group_commits(monkeypatch):
    """Every run's group commit, as made: its ``flushes`` count the transactions it committed."""
    from batchjson._replay import replay

    made: list = []

    class Counted(replay.GroupCommit):
        def __init__(self, store):
            super().__init__(store)
            made.append(self)

    monkeypatch.setattr(replay, "GroupCommit", Counted)
    return made


def test_calls_answering_a_moment_apart_share_commits_yet_each_receipt_precedes_its_call(
        tmp_path, group_commits):
    """With many calls in flight, a receipt waits a little for the writes of calls answering
    meanwhile, so a few transactions hold many calls' records; each call still finds its receipt
    in the ledger (another connection reads it) when it is sent."""
    path = tmp_path / "ledger.sqlite"
    pace = random.Random(7)
    unseen = []

    async def model(call):
        reader = sqlite3.connect(path)
        try:
            held = reader.execute("SELECT count(*) FROM attempts WHERE request_key = ? AND "
                                  "status = 'in_flight'", (call.request_key,)).fetchone()[0]
        finally:
            reader.close()
        if not held:
            unseen.append(call.request_key)
        await asyncio.sleep(pace.uniform(0.03, 0.07))  # a model's pace: calls end apart
        return items_reply(call)

    session = Session(CallableProvider(model), ledger=path, concurrency=64)
    result = session.run_batch("r", review_tasks(400), LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 400
    assert unseen == []
    # about 215 transactions when each loop turn committed, about 115 sharing them
    assert group_commits[-1].flushes < 0.4 * result.calls


def test_calls_sent_together_to_a_slow_model_share_commits_as_they_answer_together(
        tmp_path, group_commits):
    """A slow model (half a second a call) answers the calls sent together within a few
    milliseconds of one another: too few in flight for one to be due within the wait on
    average, yet the answers come bunched, so their records and the next receipts share
    transactions instead of one each."""
    pace = random.Random(11)

    async def model(call):
        await asyncio.sleep(0.5 + pace.uniform(0, 0.02))  # answers a moment apart
        return items_reply(call)

    session = Session(CallableProvider(model), ledger=tmp_path / "ledger.sqlite", concurrency=32)
    result = session.run_batch("r", review_tasks(96), LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 96
    # 64 transactions when each loop turn committed, about 22 sharing them
    assert group_commits[-1].flushes < 0.5 * result.calls


def test_near_the_end_of_the_budget_the_request_in_hand_is_finished_first():
    tasks = review_tasks(2)
    sent = []

    def model(call):
        sent.append((call.kind, call.tasks[0]["task_id"]))
        return "not json" if len(sent) == 1 else items_reply(call)

    session = Session(CallableProvider(model), budget=Budget(calls=2), concurrency=1,
                      repairs=1, replays=0)
    result = session.run_batch("r", tasks, LABEL_SCHEMA, on_exhausted="return")
    first = tasks[0]["task_id"]
    assert sent == [("initial", first), ("repair", first)]
    assert list(result.values) == [first] and session.spent_calls == 2


def test_a_validator_crash_stops_the_batch_opening_calls_and_names_the_line():
    sent = []

    def model(call):
        sent.append(call.kind)
        return items_reply(call)

    def buggy(item, task):
        return item["no_such_field"]

    session = Session(CallableProvider(model), concurrency=1, repairs=2, replays=2)
    result = session.run_batch("r", review_tasks(5), LABEL_SCHEMA, validator=buggy,
                               on_exhausted="return")
    assert sent == ["initial"]  # no repair, no replay, no other request
    crash, *rest = result.errors
    assert crash["type"] == "validator_error" and "KeyError" in crash["message"]
    assert len(rest) == 4 and all(e["type"] == "not_attempted" for e in rest)
    assert all("validator crashed" in e["message"] for e in rest)
    assert any("validator crashed" in note for note in result.notes)


def test_a_call_sent_and_failed_whose_retry_a_stop_cancels_keeps_its_failure():
    """Fault: the first task's call fails (a retryable 503) and, before its retry, the other
    task's validator crashes and stops the run. A call was made and paid for: the task shows
    that call's failure, not "no call was made for this task"."""
    first, second = (t["task_id"] for t in review_tasks(2))
    sent = []

    async def model(call):
        sent.append(call.tasks[0]["task_id"])
        if call.tasks[0]["task_id"] == first:
            raise ProviderError("503 busy", status=503, retryable=True, retry_after=0.6)
        await asyncio.sleep(0.05)
        return items_reply(call)

    def crash(item, task):
        if task["task_id"] == second:
            return item["no_such_field"]

    session = Session(CallableProvider(model), concurrency=2, replays=2)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, validator=crash,
                               on_exhausted="return")
    assert sorted(sent) == sorted([first, second]) and result.calls == 2  # no retry sent
    (error,) = [e for e in result.errors if e["task_id"] == first]
    assert error["type"] == "provider_error" and "503 busy" in error["message"]


def test_a_repair_sent_is_counted_though_a_stop_cancels_its_retry():
    """A repair reached the model (and failed with a 503); the run stopped before its retry.
    ``repairs_made`` counts repairs sent, so it is 1, as the calls say."""
    first, second = (t["task_id"] for t in review_tasks(2))
    sent = []

    async def model(call):
        sent.append(call.kind)
        if call.tasks[0]["task_id"] == first:
            if call.kind == "repair":
                raise ProviderError("503 busy", status=503, retryable=True, retry_after=0.6)
            return items_reply(call)
        await asyncio.sleep(0.15)
        return items_reply(call)

    def picky(item, task):
        if task["task_id"] == first:
            raise ValueError("not this label")
        if task["task_id"] == second:
            return item["no_such_field"]

    session = Session(CallableProvider(model), concurrency=2, repairs=2, replays=0)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, validator=picky,
                               on_exhausted="return")
    assert sent.count("repair") == 1 and result.repairs_made == 1 and result.calls == 3


def test_an_unreachable_host_stops_the_run_after_one_calls_retries():
    tries = []

    def refused(call):
        tries.append(call.tasks[0]["task_id"])
        raise ProviderError("connection failed (ClientConnectorError: Connect call failed)",
                            unreachable=True)

    provider = CallableProvider(refused)
    provider.url = "http://127.0.0.1:9/v1/chat/completions"
    session = Session(provider, concurrency=4, transport_retries=2)
    session.transport.backoff_initial = session.transport.backoff_max = 0.001
    with pytest.raises(ProviderError, match="is the server running") as raised:
        session.run_batch("r", review_tasks(8), LABEL_SCHEMA)
    assert "http://127.0.0.1:9/v1/chat/completions" in str(raised.value)
    assert len(tries) == 3 and len(set(tries)) == 1  # one request, its transport retries only
    assert session.ledger.spend("r")["calls"] == 3


def closed_port_provider() -> OpenAIProvider:
    """An OpenAI provider at a loopback port where nothing listens."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    return OpenAIProvider("gpt-4o-mini", base_url=f"http://127.0.0.1:{port}/v1",
                          api_key="sk-test", extra_body={"max_completion_tokens": 60})


def ended_within(session: Session, seconds: float) -> BaseException:
    """What a run of 8 tasks raised, failing if it has not ended within ``seconds``."""
    ended: list[BaseException] = []

    def run() -> None:
        try:
            session.run_batch("r", review_tasks(8), LABEL_SCHEMA)
        except BatchJsonError as exc:
            ended.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the run still waits on an unreachable host"
    assert session.pacer.in_flight == 0
    return ended[0]


def test_a_budget_that_runs_out_while_one_call_probes_an_unreachable_host_ends_the_run(
        tmp_path):
    """The probing call's next try is refused by the budget: the calls waiting to hear whether
    the host is back go on to find the budget spent, instead of waiting for good."""
    session = Session(closed_port_provider(), ledger=tmp_path / "l.sqlite", concurrency=4,
                      transport_retries=12, budget=Budget(calls=9),
                      rate_limits={"requests_per_minute": 100_000})
    session.transport.backoff_initial = session.transport.backoff_max = 0.01
    ended = ended_within(session, 30)
    assert isinstance(ended, BatchUnresolved) and "budget_exhausted" in str(ended)
    assert session.ledger.spend("r")["calls"] == 9
    session.close()


def test_an_unreachable_host_stops_a_first_run_that_learns_the_limits(tmp_path):
    """While a fresh ledger learns the limits one call is in flight at a time; a call waiting
    to hear whether the host is back holds that slot, so the call finding out must not wait
    for it (the run hung there)."""
    session = Session(closed_port_provider(), ledger=tmp_path / "l.sqlite", concurrency=4,
                      transport_retries=2)
    session.transport.backoff_initial = session.transport.backoff_max = 0.01
    assert "is the server running" in str(ended_within(session, 60))
    session.close()


@pytest.mark.parametrize("failures, retryable, tries, status", [
    (1, True, 2, "resolved"),  # tried again once, after the wait the provider asked
    (5, True, 3, "unresolved"),  # transport_retries=2: three tries in all, then its error
    (1, False, 1, "unresolved"),  # never retried
])
def test_a_failed_call_is_retried_after_the_providers_wait_up_to_transport_retries(
        failures, retryable, tries, status):
    sent: list[float] = []

    def flaky(call):
        sent.append(time.monotonic())
        if len(sent) <= failures:
            raise ProviderError("503 busy", retryable=retryable, retry_after=0.05)
        return items_reply(call)

    session = Session(CallableProvider(flaky), transport_retries=2, replays=0)
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, on_exhausted="return")
    assert len(sent) == tries and result.status == status
    assert all(later - earlier >= 0.05 for earlier, later in itertools.pairwise(sent))
    if status != "resolved":
        assert result.errors[0]["type"] == "provider_error"
    assert session.ledger.spend("r")["calls"] == tries


def test_a_blocking_provider_returns_at_its_timeout():
    release = threading.Event()
    finished = threading.Event()

    def stuck(call):
        release.wait(30)
        finished.set()
        return items_reply(call)

    stuck.blocking = True
    session = Session(CallableProvider(stuck), timeout=0.2, transport_retries=0, replays=0)
    try:
        result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, on_exhausted="return")
        assert not finished.is_set()  # returned while the blocking call was still stuck
        assert result.errors[0]["type"] == "provider_error"
        assert "no answer within 0.2s" in result.errors[0]["message"]
    finally:
        release.set()
        session.close()


def test_one_event_loop_and_connection_pool_serve_every_run_of_a_session():
    from batchjson._providers.openai import OpenAIProvider

    with LoopbackServer(SimulatedModel(lambda task: {"verdict": "match"})) as server:
        provider = OpenAIProvider("gpt-4o-mini", base_url=server.base_url, api_key="sk-test")
        session = Session(provider, concurrency=2)
        session.run_batch("a", review_tasks(2), LABEL_SCHEMA)
        pool = list(provider._sessions._sessions.values())
        session.run_batch("b", review_tasks(2, case="gold-pair-079"), LABEL_SCHEMA)
        assert list(provider._sessions._sessions.values()) == pool and len(pool) == 1
        assert not pool[0].closed  # kept open between runs: its connections are reused

        async def cell():  # from a running loop, as in Jupyter
            return session.run_batch("c", review_tasks(2, case="gold-pair-080"), LABEL_SCHEMA)

        assert asyncio.run(cell()).status == "resolved"
        assert list(provider._sessions._sessions.values()) == pool
        session.close()
        assert pool[0].closed


def test_runs_on_two_threads_never_touch_the_kernels_collector_or_start_threads_of_their_own(
        tmp_path):
    """A notebook library keeps its hands off process-wide settings: while two runs overlap
    (two threads, two sessions on ledger files) the collector's thresholds and frozen heap are
    the kernel's own, and no thread runs but the sessions' event loops and the callers'."""
    import gc

    before = gc.get_threshold()
    both_running = threading.Barrier(2)
    seen_during: list[tuple[tuple[int, ...], int, set[str]]] = []

    def model(call):
        if call.tasks[0]["task_id"].endswith("127"):
            both_running.wait(timeout=10)  # each run waits inside a call until the other is in
            seen_during.append((gc.get_threshold(), gc.get_freeze_count(),
                                {t.name for t in threading.enumerate()}))
        return items_reply(call)

    def run(name):
        Session(CallableProvider(model), concurrency=1,
                ledger=tmp_path / f"{name}.sqlite").run_batch(name, review_tasks(2),
                                                              LABEL_SCHEMA)

    already = {t.name for t in threading.enumerate()}
    threads = [threading.Thread(target=run, args=(f"runner{i}",), name=f"runner{i}")
               for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen_during) == 2
    for threshold, frozen, names in seen_during:
        assert threshold == before and frozen == 0
        extra = {n for n in names - already if not n.startswith(("runner", "batchjson-"))}
        extra -= {n for n in names if n.startswith("asyncio_")}  # a loop's executor threads
        assert extra == set(), extra
        assert not {n for n in names if "checkpoint" in n}
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
