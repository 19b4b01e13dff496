"""Property: no return with any coverage or identity fault is ever committed."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batchjson import CallableProvider, Session
from batchjson.acceptance import accept_items
from batchjson.schema import compile_schema
from tests.helpers import LABEL_SCHEMA, answer, review_tasks

IDENTITY = ("task_id", "case_id", "candidate_id")
COMPILED = compile_schema(LABEL_SCHEMA)
TASKS = review_tasks(6) + review_tasks(3, case="gold-pair-079")


def correct_items(tasks):
    return [{k: t[k] for k in IDENTITY} | answer(t) for t in tasks]


@st.composite
def faulty_returns(draw):
    """A correct return, reordered, then hit by at least one coverage or identity fault."""
    items = draw(st.permutations(correct_items(TASKS)))
    items = [dict(i) for i in items]
    faults = draw(st.lists(st.sampled_from(
        ["drop", "duplicate", "extra", "swap", "retype", "blank", "delete_field"]),
        min_size=1, max_size=3))
    for fault in faults:
        if not items:
            items.append({"task_id": "ghost", "case_id": "x", "candidate_id": "y",
                          "verdict": "match"})
            continue
        victim = draw(st.integers(0, len(items) - 1))
        field = draw(st.sampled_from(IDENTITY))
        if fault == "drop":
            del items[victim]
        elif fault == "duplicate":
            items.append(dict(items[victim]))
        elif fault == "extra":
            items.append({**items[victim], "task_id": f"{items[victim].get('task_id')}-x"})
        elif fault == "swap":
            other = draw(st.sampled_from([t[field] for t in TASKS
                                          if t[field] != items[victim].get(field)]))
            items[victim][field] = other
        elif fault == "retype":
            wrong = [None, 78, True, [items[victim].get(field)]]
            items[victim][field] = draw(st.sampled_from(wrong))
        elif fault == "blank":
            items[victim][field] = ""
        else:
            items[victim].pop(field, None)
    canonical = sorted(json.dumps(i, sort_keys=True) for i in items)
    assume(canonical != sorted(json.dumps(i, sort_keys=True) for i in correct_items(TASKS)))
    return items


@settings(max_examples=300, deadline=None)
@given(faulty_returns())
def test_no_identity_or_coverage_fault_is_ever_accepted(items):
    verdict = accept_items(json.dumps({"items": items}), TASKS, IDENTITY, COMPILED, None)
    assert not verdict.accepted
    assert verdict.values == {}
    assert {e["type"] for e in verdict.errors} <= {"coverage", "identity", "json"}


@settings(max_examples=100, deadline=None)
@given(st.permutations(correct_items(TASKS)))
def test_any_order_of_a_correct_return_is_accepted(items):
    verdict = accept_items(json.dumps({"items": list(items)}), TASKS, IDENTITY, COMPILED, None)
    assert verdict.accepted and set(verdict.values) == {t["task_id"] for t in TASKS}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(faulty_returns())
def test_faulty_returns_never_reach_the_checkpoint(items):
    session = Session(CallableProvider(lambda call: json.dumps({"items": items})),
                      repairs=0, replays=0)
    result = session.run_batch("r", TASKS, LABEL_SCHEMA, identity=IDENTITY, pack=len(TASKS),
                               on_exhausted="return")
    assert session.ledger.checkpoint("r") == {} and result.values == {}
    assert [r.status for r in session.ledger.attempts("r")] == ["rejected"]
