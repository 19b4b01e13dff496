"""Regression tests from a review: one test per bug, each asserting what a user relies on."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time

import pytest
from pydantic import BaseModel

from batchjson import Budget, BudgetExceeded, CallableProvider, Session
from batchjson.acceptance import accept_items
from batchjson.errors import InvalidBatch, LedgerError
from batchjson.ledger import Ledger
from batchjson.providers.base import Reply
from batchjson.providers.simulated import SimulatedModel
from batchjson.schema import compile_schema
from batchjson.testing import HttpFaults, LoopbackServer
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

VALUE_SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}},
                "required": ["label"]}


def test_llm_batch_json_with_no_prompts_returns_droste_empty_result():
    droste = pytest.importorskip("droste.structured")

    class NoCalls:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return [], []

    expected = droste.structured_batch(NoCalls(), [], VALUE_SCHEMA)
    model = SimulatedModel(answer=lambda t: {"label": "x"})
    session = Session(model)
    assert session.llm_batch_json([], VALUE_SCHEMA) == expected
    assert model.calls == 0


def test_nested_identity_values_are_compared_as_json_not_python():
    tasks = [{"task_id": "t1", "case": {"ids": [1, 2], "flag": 1}, "prompt": "p"}]
    swapped = {"items": [{"task_id": "t1", "case": {"ids": [True, 2], "flag": 1.0},
                          "verdict": "match"}]}
    verdict = accept_items(json.dumps(swapped), tasks, ("task_id", "case"),
                           compile_schema(LABEL_SCHEMA), None)
    assert not verdict.accepted
    assert verdict.errors[0]["type"] == "identity"


def test_an_item_naming_an_identity_field_twice_is_rejected():
    tasks = [{"task_id": "t1", "case_id": "gold-pair-078", "prompt": "p"}]
    text = ('{"items": [{"task_id": "t1", "case_id": "gold-pair-079", '
            '"case_id": "gold-pair-078", "verdict": "match"}]}')
    verdict = accept_items(text, tasks, ("task_id", "case_id"), compile_schema(LABEL_SCHEMA),
                           None)
    assert not verdict.accepted
    assert verdict.errors[0]["type"] == "json"


def test_llm_batch_json_with_no_prompts_still_refuses_a_bad_schema():
    session = Session(SimulatedModel())
    with pytest.raises(InvalidBatch, match="invalid JSON Schema"):
        session.llm_batch_json([], {"type": "no-such-type"})


def test_a_model_schema_cannot_commit_an_identity_value_other_than_the_request():
    class Label(BaseModel):
        case_id: int  # disagrees with the tasks, whose case_id is the string "078"
        verdict: str

    tasks = [{"task_id": "t1", "case_id": "078", "prompt": "p"}]
    reply = json.dumps({"items": [{"task_id": "t1", "case_id": "078", "verdict": "match"}]})
    session = Session(CallableProvider(lambda call: reply), repairs=0, replays=0)
    result = session.run_batch("r", tasks, Label, identity="task_id,case_id",
                               on_exhausted="return")
    assert result.values == {}
    assert session.ledger.checkpoint("r") == {}  # 78 never committed for case "078"


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
    def model(call):
        if call.tasks[0]["task_id"].endswith("127"):
            return Reply(items_reply(call), input_tokens=100, output_tokens=5)
        return Reply(items_reply(call))  # no usage, no cost: charged as the worst case

    price = {"input": 1000.0, "output": 1000.0}
    session = Session(CallableProvider(model, price=price, max_tokens=10),
                      budget=Budget(cost=10.0), concurrency=1)
    session.run_batch("a", review_tasks(2), LABEL_SCHEMA)
    second = session.ledger.attempts("a")[1]
    estimated = session.ledger._rows("SELECT estimated_input_tokens FROM attempts "
                                     "WHERE id = ?", (second.id,))[0][0]
    assert second.cost is None and estimated > 0
    assert session.spent_cost == pytest.approx(0.105 + (estimated + 10) * 1000 / 1e6)


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


def test_a_cancel_right_after_the_begin_receipt_commits_closes_that_receipt(monkeypatch):
    begin = Ledger.op_begin

    def op_begin(db, *args, **kwargs):
        attempt_id = begin(db, *args, **kwargs)
        loop = asyncio.get_running_loop()
        for task in asyncio.all_tasks(loop):  # an interrupt lands before the worker resumes
            loop.call_soon(task.cancel)
        return attempt_id

    monkeypatch.setattr(Ledger, "op_begin", staticmethod(op_begin))
    session = Session(CallableProvider(items_reply))
    with pytest.raises((asyncio.CancelledError, KeyboardInterrupt)):
        session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert [a.status for a in session.ledger.attempts("r")] == ["cancelled"]


def test_a_write_failure_in_a_notebook_loop_leaves_no_receipt_in_flight(monkeypatch):
    begin = Ledger.op_begin

    def op_begin(db, batch_id, revision_id, request, *args, **kwargs):
        if request.position == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return begin(db, batch_id, revision_id, request, *args, **kwargs)

    monkeypatch.setattr(Ledger, "op_begin", staticmethod(op_begin))

    async def model(call):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # a provider that tidies up its connection when cancelled
            raise
        return items_reply(call)

    session = Session(CallableProvider(model), concurrency=2)

    async def cell():  # a running loop, as in Jupyter: the run happens on a worker thread
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)

    with pytest.raises(LedgerError, match="disk I/O error") as raised:
        asyncio.run(cell())
    assert ":memory:" in str(raised.value)  # names the ledger
    assert [a.status for a in session.ledger.attempts("r")] == ["cancelled"]


def test_finishing_a_run_in_one_thread_leaves_another_threads_calls_alone():
    from tests.test_providers_http import items_call, openai, upper

    # the first request is held for a second; the second is answered at once
    faults = HttpFaults(script={1: "timeout"}, hold=1.0)
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        provider = openai(srv)
        out: dict[str, object] = {}

        def complete(key):
            async def go():
                try:
                    return await provider.complete(items_call())
                finally:
                    await provider.aclose()
            try:
                out[key] = asyncio.run(go())
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                out[key] = exc

        other = threading.Thread(target=complete, args=("other",))
        other.start()
        time.sleep(0.3)  # the other thread's call is now in flight
        complete("mine")
        other.join(10)
    assert not isinstance(out["mine"], Exception)
    # the other thread gets the server's answer (the held 504), not a connection closed under it
    assert getattr(out["other"], "status", None) == 504


def test_strict_evidence_counts_a_request_shared_by_two_revisions_once():
    session = Session(CallableProvider(lambda call: "not json"), strict=True, repairs=0,
                      replays=0)
    tasks = review_tasks(5)
    session.run_batch("r", tasks[:4], LABEL_SCHEMA, on_exhausted="return")
    session.run_batch("r", tasks, LABEL_SCHEMA, on_exhausted="return")  # one task appended
    owed = session.evidence.minimum_exact_retry_calls
    session.provider = CallableProvider(items_reply)
    result = session.run_batch("r", tasks, LABEL_SCHEMA)
    assert result.calls == 5
    assert owed == 5  # the calls that actually clear both revisions
    assert session.evidence.minimum_exact_retry_calls == 0


def test_evidence_counts_a_request_shared_by_two_batches_once():
    session = Session(CallableProvider(lambda call: "not json"), repairs=0, replays=0)
    tasks = review_tasks(2)
    session.run_batch("a", tasks, LABEL_SCHEMA, on_exhausted="return")
    session.run_batch("b", tasks, LABEL_SCHEMA, on_exhausted="return")  # same content
    assert session.evidence.minimum_exact_retry_calls == 2
    assert session.evidence.unresolved_items == 2
    assert session.evidence.summary()["unresolved_requests"] == 4  # two per batch
    session.provider = CallableProvider(items_reply)
    assert session.run_batch("a", tasks, LABEL_SCHEMA).calls == 2  # the calls that clear both
    assert session.evidence.minimum_exact_retry_calls == 0
    assert session.run_batch("b", tasks, LABEL_SCHEMA).calls == 0
