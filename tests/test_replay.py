"""The replay loop opens each worker's next call while the current one is in flight.

Opening means: budget reserved and in-flight receipt committed, so the next send waits for no
ledger write. These tests hold what users rely on around that: a call that was opened but never
sent leaves no receipt and costs no budget, and a slow call never holds up the call opened
behind it.
"""

from __future__ import annotations

import asyncio

import pytest

from batchjson import Budget, CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


@pytest.mark.parametrize("when", ["before its receipt is written", "after its receipt is written"])
def test_a_call_opened_but_never_sent_leaves_no_receipt_and_costs_nothing(when):
    sent = []

    async def model(call):
        sent.append(call.tasks[0]["task_id"])
        if len(sent) == 2:
            if when == "after its receipt is written":
                await asyncio.sleep(0.05)  # the group commit writes the third call's receipt
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


def test_a_slow_call_does_not_hold_up_the_call_opened_behind_it():
    tasks = review_tasks(3)
    slow = tasks[0]["task_id"]
    log = []

    async def model(call):
        task_id = call.tasks[0]["task_id"]
        log.append(("start", task_id))
        await asyncio.sleep(0.6 if task_id == slow else 0.01)
        log.append(("end", task_id))
        return items_reply(call)

    session = Session(CallableProvider(model), concurrency=2)
    result = session.run_batch("r", tasks, LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 3
    # The third call, opened ahead by the slow call's worker, went out with the idle one.
    assert log.index(("start", tasks[2]["task_id"])) < log.index(("end", slow))


def test_near_the_end_of_the_budget_calls_are_reserved_only_as_they_are_sent():
    tasks = review_tasks(2)
    sent = []

    def model(call):
        sent.append((call.kind, call.tasks[0]["task_id"]))
        return "not json" if len(sent) == 1 else items_reply(call)

    # Two calls: the first return is rejected, and its repair must not lose the last call to
    # the next request opened ahead of time. The request in hand is finished first.
    session = Session(CallableProvider(model), budget=Budget(calls=2), concurrency=1,
                      repairs=1, replays=0)
    result = session.run_batch("r", tasks, LABEL_SCHEMA, on_exhausted="return")
    first = tasks[0]["task_id"]
    assert sent == [("initial", first), ("repair", first)]
    assert list(result.values) == [first] and session.spent_calls == 2


def test_under_a_cost_budget_no_call_is_opened_ahead():
    from batchjson.providers.base import Reply

    reserved_at_send = []

    def model(call):
        reserved_at_send.append(session.spent_calls)
        return Reply(items_reply(call), cost=0.01)

    session = Session(CallableProvider(model), budget=Budget(cost=1.0), concurrency=1)
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert reserved_at_send == [1, 2, 3]  # each call reserved as it is sent, none ahead


def test_with_an_ample_budget_the_next_call_is_opened_before_the_current_is_sent():
    reserved_at_send = []

    def model(call):
        reserved_at_send.append(session.spent_calls)
        return items_reply(call)

    session = Session(CallableProvider(model), budget=Budget(calls=1000), concurrency=1)
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert reserved_at_send == [2, 3, 3]
