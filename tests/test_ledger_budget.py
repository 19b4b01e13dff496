"""A cost budget on the ledger itself (``batchjson budget --cost``) holds for every runner on it
together, on both stores: each call's worst case is reserved with its claim and settled with its
receipt, a dead runner's calls are charged their worst case when its claims are taken over, and
a session's own budget still holds for its calls."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import threading

import pytest

from batchjson import Budget, BudgetExceeded, CallableProvider, Ledger, Session
from batchjson._providers.base import Reply
from tests.helpers import (
    LABEL_SCHEMA,
    items_reply,
    kill_runner_mid_call,
    ledger_rows,
    review_tasks,
)

PRICE = {"input": 1000.0, "output": 1000.0}  # USD per million tokens: a call costs cents
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def priced(call):
    return Reply(items_reply(call), input_tokens=100, output_tokens=5)  # $0.105 a call


async def slow(call):
    await asyncio.sleep(0.03)
    return priced(call)


def test_two_sessions_on_one_ledger_hold_its_budget_together(ledger_at):
    path = ledger_at()
    Ledger(path).set_budget(4.0)  # a call's worst case is $1.14: at most three in flight
    sessions = [Session(CallableProvider(slow, price=PRICE, max_tokens=40), ledger=path,
                        concurrency=4) for _ in range(2)]
    results, together = [], threading.Barrier(2)

    def run(session, case):
        together.wait()
        results.append(session.run_batch(case, review_tasks(20, case=case), LABEL_SCHEMA,
                                         on_exhausted="return"))

    threads = [threading.Thread(target=run, args=(s, f"gold-pair-{n}"))
               for s, n in zip(sessions, (78, 79), strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    budget = Ledger(path).budget()
    calls = ledger_rows(path, "SELECT COUNT(*) FROM attempts WHERE sent_at IS NOT NULL")[0]
    assert budget["reserved"] == pytest.approx(0.0, abs=1e-9)  # every reservation settled
    assert budget["spent"] == pytest.approx(0.105 * calls[0]) and budget["spent"] <= 4.0
    assert 0 < calls[0] < 40  # the budget stopped both, well before their 40 tasks
    assert len(results) == 2 and all(r.calls for r in results)  # both ran, both were stopped
    said = [e["message"] for r in results for e in r.errors if e["type"] == "budget_exhausted"]
    assert said and all("the ledger's cost budget of $4.00" in m for m in said)
    for s in sessions:
        s.close()


def test_a_sessions_own_budget_still_holds_beside_the_ledgers(ledger_at):
    path = ledger_at()
    Ledger(path).set_budget(100.0)
    session = Session(CallableProvider(priced, price=PRICE, max_tokens=40), ledger=path,
                      budget=Budget(calls=3))
    with pytest.raises(BudgetExceeded):  # five requests, three calls: refused before spending
        session.run_batch("r", review_tasks(5), LABEL_SCHEMA)
    result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert result.calls == 3 and Ledger(path).budget()["spent"] == pytest.approx(0.315)


def test_a_ledger_budget_too_small_for_one_call_is_refused_before_anything_is_spent(ledger_at):
    path = ledger_at()
    Ledger(path).set_budget(0.01)
    session = Session(CallableProvider(priced, price=PRICE, max_tokens=40), ledger=path)
    with pytest.raises(BudgetExceeded, match="the ledger's cost budget of"):
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert ledger_rows(path, "SELECT COUNT(*) FROM attempts") == [(0,)]
    unpriced = Session(CallableProvider(items_reply), ledger=path)
    with pytest.raises(Exception, match="the ledger's cost budget needs the model's price"):
        unpriced.run_batch("r", review_tasks(2), LABEL_SCHEMA)


def test_a_budget_set_while_a_run_is_going_stops_its_next_call(ledger_at):
    path = ledger_at()
    sent = []

    async def model(call):
        sent.append(call)
        if len(sent) == 1:
            Ledger(path).set_budget(100.0)  # a person caps the ledger mid-run
        await asyncio.sleep(0.01)
        return items_reply(call)

    session = Session(CallableProvider(model, source="capped-mid-run"), ledger=path,
                      concurrency=1)
    result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA, on_exhausted="return")
    assert len(sent) == 1 and result.status == "unresolved"
    assert any("set on the ledger after this run started" in e["message"]
               for e in result.errors)


HANGING = textwrap.dedent("""
    import asyncio, sys
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, review_tasks

    async def model(call):
        print("sent", flush=True)
        await asyncio.sleep(600)

    session = Session(CallableProvider(model, price={"input": 1000.0, "output": 1000.0},
                                       max_tokens=40), ledger=sys.argv[1], concurrency=3)
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
""")


def test_a_killed_runners_calls_are_charged_their_worst_case_when_taken_over(ledger_at):
    path = ledger_at()
    Ledger(path).set_budget(10.0)
    kill_runner_mid_call(HANGING, path, 3)
    (held,), = ledger_rows(path, "SELECT SUM(reserved) FROM attempts")
    assert Ledger(path).budget()["reserved"] == pytest.approx(held) and held > 0
    session = Session(CallableProvider(priced, price=PRICE, max_tokens=40), ledger=path)
    result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert result.status == "resolved"
    budget = Ledger(path).budget()
    assert budget["reserved"] == pytest.approx(0.0, abs=1e-9)
    assert budget["spent"] == pytest.approx(held + 3 * 0.105)  # the dead calls at worst case


HANGING_ELSEWHERE = HANGING.replace("ledger=sys.argv[1]",
                                    "ledger=Ledger(sys.argv[1], lease=1.0)").replace(
    "from batchjson import CallableProvider, Session",
    "from batchjson import CallableProvider, Ledger, Session")


def test_a_call_waiting_on_the_ledgers_budget_frees_what_a_dead_hosts_calls_held(
        ledger_at, monkeypatch):
    """Another machine died with calls in flight: its reservations are what a waiting call
    waits on, and no live runner would ever release them. Once its lease has expired the
    waiting runner takes them over (charged their worst case) and ends, never hanging."""
    path = ledger_at()
    Ledger(path).set_budget(10.0)
    monkeypatch.setenv("BATCHJSON_HOST", "another-machine")  # its death cannot be seen here
    kill_runner_mid_call(HANGING_ELSEWHERE, path, 3)
    monkeypatch.setenv("BATCHJSON_HOST", "this-machine")
    held = Ledger(path).budget()["reserved"]
    Ledger(path).set_budget(held * 7 / 6)  # a call fits in it, but not beside the dead calls
    results: list[object] = []
    session = Session(CallableProvider(priced, price=PRICE, max_tokens=40), ledger=path)
    runner = threading.Thread(target=lambda: results.append(session.run_batch(
        "r", review_tasks(3), LABEL_SCHEMA, on_exhausted="return")), daemon=True)
    runner.start()
    runner.join(60)
    assert results, "the run hung on reservations no live runner holds"
    (result,) = results
    assert result.status == "unresolved" and result.calls == 0
    assert {e["type"] for e in result.errors} == {"budget_exhausted"}
    budget = Ledger(path).budget()
    assert budget["reserved"] == pytest.approx(0.0, abs=1e-9)
    assert budget["spent"] == pytest.approx(held)  # the dead calls, at their worst case
    assert ledger_rows(path, "SELECT status, COUNT(*) FROM attempts GROUP BY status") == [
        ("abandoned", 3)]
    session.close()
