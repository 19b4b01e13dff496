"""Run-level behaviour users rely on: resume, budgets, revisions, replay bounds, bad input."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from batchjson import (
    BatchUnresolved,
    Budget,
    BudgetExceeded,
    CallableProvider,
    FaultPlan,
    InvalidBatch,
    ProviderError,
    Session,
    SimulatedModel,
)
from tests.helpers import LABEL_SCHEMA, ConcurrentModel, answer, items_reply, review_tasks


def flaky(rate=0.3, seed=7, **kw):
    return SimulatedModel(answer=answer, faults=FaultPlan.uniform(rate, **kw), seed=seed)


def test_resume_spends_nothing_on_accepted_requests(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    # first attempts fault; later attempts of the same model (same source) are clean
    session = Session(flaky(0.15, clean_after=1), ledger=ledger, repairs=0, replays=0)
    tasks = review_tasks(24)
    first = session.run_batch("r", tasks, LABEL_SCHEMA, pack=3, on_exhausted="return")
    assert 0 < len(first.values) < 24  # some requests failed with no retries allowed
    owed = session.evidence.minimum_exact_retry_calls
    assert owed == 8 - first.accepted_returns

    again = Session(flaky(0.15, clean_after=1), ledger=ledger)  # a new process, same model
    second = again.run_batch("r", tasks, LABEL_SCHEMA, pack=3)
    assert second.status == "resolved"
    assert second.calls == owed  # exactly the unresolved requests, nothing re-spent
    assert second.resumed == 8 - owed
    third = again.run_batch("r", tasks, LABEL_SCHEMA, pack=3)
    assert third.calls == 0 and third.status == "resolved" and third.values == second.values


def test_budget_refused_before_spending():
    model = flaky(0.0)
    session = Session(model)
    with pytest.raises(BudgetExceeded) as raised:
        session.run_batch("r", review_tasks(10), LABEL_SCHEMA, pack=2, max_calls=4)
    assert raised.value.needed == 5 and raised.value.remaining == 4
    assert "5" in str(raised.value) and "4" in str(raised.value)
    assert model.calls == 0
    assert session.ledger.batch_names() == []  # nothing recorded either


def test_session_budget_counts_across_runs():
    session = Session(flaky(0.0), budget=Budget(calls=6))
    session.run_batch("a", review_tasks(4), LABEL_SCHEMA)
    with pytest.raises(BudgetExceeded) as raised:
        session.run_batch("b", review_tasks(4, case="gold-pair-080"), LABEL_SCHEMA)
    assert (raised.value.needed, raised.value.remaining) == (4, 2)


def test_budget_running_out_mid_run_leaves_requests_unresolved():
    session = Session(SimulatedModel(answer=answer, faults=FaultPlan(script={0: "malformed_json"})),
                      repairs=3, replays=0)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, max_calls=2,
                               on_exhausted="return")
    assert result.calls == 2
    assert result.status == "unresolved"
    assert {e["type"] for e in result.errors} == {"budget_exhausted"}


def test_validator_crash_is_reported_and_never_retried():
    model = flaky(0.0)
    session = Session(model, repairs=3, replays=3, concurrency=1)

    def buggy(item, task):
        return item["no_such_field"]

    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, validator=buggy,
                               on_exhausted="return")
    assert model.calls == 1  # no repair, no replay, and no new call once the validator crashed
    assert result.values == {}
    assert [e["type"] for e in result.errors] == ["validator_error", "not_attempted"]
    assert "KeyError" in result.errors[0]["message"]
    assert "validator crashed" in result.errors[1]["message"]


def test_validator_value_error_is_repaired_with_the_errors_in_the_prompt():
    prompts = []

    def model(call):
        prompts.append(call.prompt)
        verdict = "no_match" if call.kind == "initial" else "match"
        return items_reply(call, **{t["task_id"]: {"verdict": verdict} for t in call.tasks})

    def must_match(item, task):
        if item["verdict"] != "match":
            raise ValueError("verdict must be match for this case")

    session = Session(CallableProvider(model), repairs=1, replays=0)
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=must_match)
    assert result.status == "resolved" and result.calls == 2
    assert [r.kind for r in session.ledger.attempts("r")] == ["initial", "repair"]
    assert "verdict must be match for this case" in prompts[1]
    assert '"no_match"' in prompts[1]  # the previous raw return travels with the repair


def test_exhaustion_raises_with_the_result_and_a_short_report():
    session = Session(CallableProvider(lambda call: "not json"), repairs=1, replays=1)
    with pytest.raises(BatchUnresolved) as raised:
        session.run_batch("r", review_tasks(3), LABEL_SCHEMA, pack=3)
    result = raised.value.result
    assert result.calls == 3 and result.status == "unresolved"
    assert [r.kind for r in session.ledger.attempts("r")] == ["initial", "repair", "replay"]
    report = str(raised.value)
    assert "0 of" not in report and "3 of 3 task(s)" in report and "re-running" in report


def test_split_halves_a_failing_request_deterministically():
    def poisoned(call):
        bad = "gold-pair-078::gold-pair-078-candidate-130"
        if any(t["task_id"] == bad for t in call.tasks):
            return items_reply(call, **{bad: {"verdict": "maybe"}})
        return items_reply(call)

    session = Session(CallableProvider(poisoned), repairs=0, replays=0)
    result = session.run_batch("r", review_tasks(8), LABEL_SCHEMA, pack=8, split=True,
                               on_exhausted="return")
    assert len(result.values) == 7
    assert result.unresolved == ["gold-pair-078::gold-pair-078-candidate-130"]
    kinds = [r.kind for r in session.ledger.attempts("r")]
    assert kinds[0] == "initial" and set(kinds[1:]) == {"split"}
    assert len(kinds) == 1 + 2 + 2 + 2  # 8 -> 4+4 -> 2+2 -> 1+1 on the poisoned side
    assert session.evidence.minimum_exact_retry_calls == 1


def test_changed_content_supersedes_and_strict_keeps_counting():
    failing = CallableProvider(lambda call: "{")
    loose = Session(failing, repairs=0, replays=0)
    loose.run_batch("r", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    assert loose.evidence.minimum_exact_retry_calls == 2
    loose.run_batch("r", review_tasks(2), LABEL_SCHEMA, instructions="Be careful.",
                    on_exhausted="return")
    assert loose.evidence.minimum_exact_retry_calls == 2  # the old revision no longer counts
    (old,) = loose.evidence.superseded
    assert old["revision"] == 1 and old["superseded_by"] == 2
    assert old["reason"] == "changed: instructions"

    strict = Session(failing, repairs=0, replays=0, strict=True)
    strict.run_batch("r", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    strict.run_batch("r", review_tasks(2), LABEL_SCHEMA, instructions="Be careful.",
                     on_exhausted="return")
    assert strict.evidence.minimum_exact_retry_calls == 4
    assert strict.evidence.superseded == []


def test_provider_errors_are_receipts_not_repairs():
    model = SimulatedModel(answer=answer, faults=FaultPlan(script={0: "provider_error",
                                                                    1: "timeout"}))
    session = Session(model, repairs=0, replays=0, transport_retries=3)
    session.transport.backoff_initial = 0.001
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert result.status == "resolved" and result.provider_errors == 2
    receipts = session.ledger.attempts("r")
    assert [r.status for r in receipts] == ["provider_error", "provider_error", "accepted"]
    assert result.repairs_made == 0


def test_non_retryable_provider_error_fails_fast():
    calls = []

    def refuse(call):
        calls.append(call)
        raise ProviderError("HTTP 401: invalid api key", status=401, retryable=False)

    session = Session(CallableProvider(refuse), repairs=2, replays=0, transport_retries=5)
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, on_exhausted="return")
    assert len(calls) == 1
    assert result.errors[0]["type"] == "provider_error" and "401" in result.errors[0]["message"]


def test_pydantic_schema_values_are_model_instances(tmp_path):
    class Label(BaseModel):
        verdict: str
        confidence: float = 1.0

    session = Session(flaky(0.0), ledger=tmp_path / "l.sqlite")
    result = session.run_batch("r", review_tasks(3), Label, pack=3)
    assert all(isinstance(v, Label) for v in result.values.values())
    again = Session(flaky(0.0), ledger=tmp_path / "l.sqlite").run_batch(
        "r", review_tasks(3), Label, pack=3)
    assert again.calls == 0 and again.values == result.values


def test_tokens_and_cost_are_recorded_per_attempt():
    model = SimulatedModel(answer=answer, price_per_million=(1.0, 2.0))
    session = Session(model)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    receipts = session.ledger.attempts("r")
    assert all(r.input_tokens and r.output_tokens and r.cost > 0 for r in receipts)
    assert result.tokens == sum(r.tokens for r in receipts)
    assert result.cost == pytest.approx(sum(r.cost for r in receipts))


BAD_INPUTS = [
    ([], "empty batch"),
    ([{"task_id": "a", "prompt": "x", "case_id": "c"}, {"task_id": "a", "prompt": "y"}],
     "duplicate task_id 'a'"),
    ([{"prompt": "x"}], "task #0 has no task_id"),
    ([{"task_id": "a", "prompt": 3, "case_id": "c"}], "task 'a': prompt must be a string"),
    ([{"task_id": "a", "prompt": "x", "case_id": "c", "blob": object()}],
     "task 'a' is not JSON-serialisable"),
    ([{"task_id": "a", "prompt": "x", "case_id": "c", "score": float("nan")}],
     "task 'a' is not JSON-serial"),
    ([{"task_id": "a", "prompt": "x"}], "task 'a' lacks identity field 'case_id'"),
]


@pytest.mark.parametrize(("tasks", "message"), BAD_INPUTS)
def test_bad_input_is_refused_before_spending(tasks, message):
    model = flaky(0.0)
    session = Session(model)
    with pytest.raises(InvalidBatch) as raised:
        session.run_batch("r", tasks, LABEL_SCHEMA, identity=("task_id", "case_id"))
    assert message in str(raised.value)
    assert model.calls == 0 and session.ledger.batch_names() == []


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pack": 0}, "pack must be a whole number >= 1"),
    ({"schema": {"type": "strnig"}}, "invalid JSON Schema"),
    ({"schema": 42}, "schema must be a pydantic model class or a JSON Schema dict"),
    ({"name": ""}, "batch name must be a non-empty string"),
    ({"on_exhausted": "ignore"}, "on_exhausted must be 'raise' or 'return'"),
    ({"validator": "not callable"}, "validator must be callable"),
])
def test_bad_options_are_refused_before_spending(kwargs, message):
    model = flaky(0.0)
    session = Session(model)
    args = {"name": "r", "tasks": review_tasks(2), "schema": LABEL_SCHEMA} | kwargs
    with pytest.raises(InvalidBatch, match=message):
        session.run_batch(args.pop("name"), args.pop("tasks"), args.pop("schema"), **args)
    assert model.calls == 0


def test_bad_input_leaves_earlier_records_untouched(tmp_path):
    session = Session(flaky(0.0), ledger=tmp_path / "l.sqlite")
    session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    before = (session.ledger.attempts("r"), session.ledger.checkpoint("r"))
    with pytest.raises(InvalidBatch):
        session.run_batch("r", [{"task_id": "x"}], LABEL_SCHEMA)
    assert (session.ledger.attempts("r"), session.ledger.checkpoint("r")) == before


def test_no_provider_is_a_clear_error_listing_the_ways(monkeypatch):
    monkeypatch.delenv("BATCHJSON_PROVIDER", raising=False)
    session = Session()
    with pytest.raises(Exception) as raised:
        session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    text = str(raised.value)
    assert "No model provider is configured" in text
    assert "%config BatchJson.provider" in text and "BATCHJSON_PROVIDER" in text


def test_calls_of_one_batch_run_concurrently_within_the_bound():
    model = ConcurrentModel(delay=0.02)
    session = Session(CallableProvider(model), concurrency=4)
    session.run_batch("r", review_tasks(12), LABEL_SCHEMA)
    assert model.peak == 4


def test_works_inside_a_running_event_loop():
    import asyncio

    session = Session(flaky(0.0))

    async def notebook_cell():
        return session.run_batch("r", review_tasks(2), LABEL_SCHEMA)

    assert asyncio.run(notebook_cell()).status == "resolved"


def test_wire_schema_pins_identity_and_count():
    seen = []

    def capture(call):
        seen.append(call.schema)
        return items_reply(call)

    session = Session(CallableProvider(capture))
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA, identity="task_id,case_id", pack=3)
    items = seen[0]["properties"]["items"]
    assert items["minItems"] == items["maxItems"] == 3
    assert items["items"]["properties"]["case_id"] == {"enum": ["gold-pair-078"]}
    assert json.dumps(seen[0])  # JSON-serialisable for providers that enforce it


def test_validator_decorator_defines_once_in_the_default_session():
    import batchjson

    session = Session(flaky(0.0))
    batchjson.set_default_session(session)
    try:
        source = ("@validator\ndef check(item, task):\n"
                  "    if item['verdict'] not in ('match', 'no_match'):\n"
                  "        raise ValueError('bad verdict')\n")
        namespace = {"validator": batchjson.validator}
        exec(source, namespace)
        first = namespace["check"]
        exec(source, namespace)
        assert namespace["check"] is first
        exec(source.replace("@validator", "@validator(name='verdicts')"), namespace)
        assert session.validators.current("verdicts").fn is namespace["check"]
        assert [v.name for v in session.validators] == ["check", "verdicts"]
    finally:
        batchjson.set_default_session(None)


def test_strict_session_refuses_a_changed_validator_while_its_evidence_is_open():
    from batchjson import ValidatorChanged

    model = flaky(0.0)
    session = Session(model, strict=True, repairs=0, replays=0)
    namespace: dict = {}
    exec("def check(item, task):\n    raise ValueError('never good enough')", namespace)
    session.run_batch("r", review_tasks(2), LABEL_SCHEMA, validator=namespace["check"],
                      on_exhausted="return")
    calls_before = model.calls
    exec("def check(item, task):\n    return None", namespace)
    with pytest.raises(ValidatorChanged) as raised:
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA, validator=namespace["check"])
    assert "check" in str(raised.value) and "code changed" in str(raised.value)
    assert "Restore the previous definition" in str(raised.value)
    assert model.calls == calls_before
    assert session.evidence.minimum_exact_retry_calls == 2


def test_cost_budget_stops_spending_before_it_would_be_exceeded():
    model = SimulatedModel(answer=answer, price_per_million=(1000.0, 1000.0))
    model.max_tokens = 40  # each call's worst case: its input bound plus 40 output tokens
    session = Session(model, budget=Budget(cost=2.0), concurrency=1)
    result = session.run_batch("r", review_tasks(10), LABEL_SCHEMA, on_exhausted="return")
    spent = sum(r.cost for r in session.ledger.attempts("r"))
    assert 0 < spent <= 2.0 and session.spent_cost == pytest.approx(spent)
    assert result.status == "unresolved" and 0 < len(result.values) < 10
    assert {e["type"] for e in result.errors} == {"budget_exhausted"}
    session.tally.cost = 2.0 - 0.01  # less than one call's worth left: refused up front
    calls = model.calls
    with pytest.raises(BudgetExceeded, match=r"one call may cost up to \$1\.\d+.*the budget is "
                       r"\$2\.00 \(of which \$1\.99 is spent"):
        session.run_batch("r", review_tasks(10), LABEL_SCHEMA)
    assert model.calls == calls


def test_the_session_s_llm_batch_json_is_a_droste_compatible_helper():
    session = Session(SimulatedModel(answer=lambda task: {"label": "pos"}))
    out = session.llm_batch_json(["a", "b"], {"type": "object"})
    assert out["values"] == [{"label": "pos"}, {"label": "pos"}] and out["errors"] == []
    assert out["attempts"] == [1, 1] and out["repairs_made"] == 0
    assert session.evidence.unresolved_batches == 0


def test_a_top_level_identity_beside_items_is_rejected_not_ignored():
    def with_case(call):
        payload = json.loads(items_reply(call))
        payload["case_id"] = "gold-pair-079"  # which request would this belong to?
        return json.dumps(payload)

    session = Session(CallableProvider(with_case), repairs=0, replays=0)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, pack=2, on_exhausted="return")
    assert result.values == {}
    (receipt,) = session.ledger.attempts("r")
    assert receipt.status == "rejected" and "'case_id'" in receipt.errors[0]["message"]


def test_split_halves_run_in_parallel_and_accepted_halves_are_never_paid_twice():
    bad = "gold-pair-078::gold-pair-078-candidate-130"

    def poisoned(call):
        if any(t["task_id"] == bad for t in call.tasks):
            return items_reply(call, **{bad: {"verdict": "maybe"}})
        return items_reply(call)

    model = ConcurrentModel(poisoned)
    session = Session(CallableProvider(model), repairs=0, replays=0, concurrency=4)
    first = session.run_batch("r", review_tasks(8), LABEL_SCHEMA, pack=8, split=True,
                              on_exhausted="return")
    # both halves of one request went out at once (a quarter of the bad half may follow while
    # the good half is still in flight: 3 is as parallel as 2)
    assert len(first.values) == 7 and model.peak >= 2
    # A new revision (pack=16, eight more tasks) sends its bigger request, which fails and
    # splits again: halves whose exact content was accepted under revision 1 are not re-sent.
    model.sent.clear()
    tasks = review_tasks(8) + review_tasks(8, case="gold-pair-080")
    again = session.run_batch("r", tasks, LABEL_SCHEMA, pack=16, split=True,
                              on_exhausted="return")
    assert again.revision == 2 and len(again.values) == 15
    accepted_before = {k for k in first.values}
    for call in model.sent:
        assert not set(call) <= accepted_before, f"re-sent an accepted half: {call}"
