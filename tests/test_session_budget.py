"""A session's budget counts every call it paid for: interrupted runs, unknown costs, threads."""

from __future__ import annotations

import threading

import pytest

from batchjson import Budget, BudgetExceeded, CallableProvider, Session
from batchjson._providers.base import Reply, input_bound
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


def test_calls_of_an_interrupted_run_count_against_the_session_budget():
    seen = []

    def model(call):
        seen.append(call.tasks[0]["task_id"])
        if len(seen) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second call is out
        return items_reply(call)

    session = Session(CallableProvider(model), budget=Budget(calls=3), concurrency=1)
    tasks = review_tasks(3)
    with pytest.raises(KeyboardInterrupt):
        session.run_batch("r", tasks, LABEL_SCHEMA)
    assert session.spent_calls == 2
    with pytest.raises(BudgetExceeded):  # 2 requests owed, 1 call left: refuse before spending
        session.run_batch("r", tasks, LABEL_SCHEMA)
    assert len(seen) == 2


def test_a_reply_without_a_cost_is_charged_from_its_usage_or_else_its_worst_case():
    bounds = []

    def model(call):
        bounds.append(input_bound(None, call))
        if call.tasks[0]["task_id"].endswith("127"):
            return Reply(items_reply(call), input_tokens=100, output_tokens=5)
        return Reply(items_reply(call))  # no usage, no cost: charged as the worst case

    price = {"input": 1000.0, "output": 1000.0}
    session = Session(CallableProvider(model, price=price, max_tokens=40),
                      budget=Budget(cost=10.0), concurrency=1)
    session.run_batch("a", review_tasks(2), LABEL_SCHEMA)
    second = session.ledger.attempts("a")[1]
    assert second.cost is None
    # the worst case reserved for it: its input bound (bytes sent) and max_tokens
    assert session.spent_cost == pytest.approx(0.105 + (bounds[1] + 40) * 1000 / 1e6)


def test_two_threads_share_one_session_call_budget():
    first_call = threading.Event()
    release = threading.Event()
    calls = []

    def model(call):
        calls.append(call.tasks[0]["task_id"])
        if call.tasks[0]["case_id"] == "gold-pair-078" and not first_call.is_set():
            first_call.set()
            release.wait(10)
        return items_reply(call)

    model.blocking = True
    session = Session(CallableProvider(model), budget=Budget(calls=2), concurrency=1)
    errors = []
    worker = threading.Thread(target=lambda: session.run_batch(
        "a", review_tasks(2), LABEL_SCHEMA, on_exhausted="return"))
    worker.start()
    try:
        assert first_call.wait(10)
        try:
            session.run_batch("b", review_tasks(2, case="gold-pair-079"), LABEL_SCHEMA,
                              on_exhausted="return")
        except BudgetExceeded as exc:
            errors.append(exc)
    finally:
        release.set()
        worker.join(10)
    assert len(errors) == 1  # refused before spending: the other thread holds a call
    assert len(calls) <= 2  # the session's budget holds across threads
    assert session.spent_calls == len(calls)
