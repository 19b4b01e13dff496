"""Property: no return with any coverage or identity fault is ever committed."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from batchjson import CallableProvider, Session
from batchjson._canon import canonical_json, ledger_json
from batchjson._content.schema import compile_schema
from tests.helpers import LABEL_SCHEMA, accept_items, answer, review_tasks

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


# -- overflowing numbers, exotic identity values, mutating providers and validators ------------
OVERFLOWING = st.sampled_from(["1e400", "-1e999", "1e309", "-2e308", "1.8e308", "123e456"])


@settings(max_examples=60, deadline=None)
@given(st.permutations(correct_items(TASKS)), OVERFLOWING, st.sampled_from(["score", "case_id"]))
def test_a_number_overflowing_to_infinity_is_never_accepted(items, number, where):
    items = [dict(i) for i in items]
    items[0][where] = "__NUMBER__"
    text = json.dumps({"items": items}).replace('"__NUMBER__"', number)
    verdict = accept_items(text, TASKS, IDENTITY, COMPILED, None)
    assert not verdict.accepted and verdict.stored == {}
    assert verdict.errors[0]["type"] == "json"


SCALARS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.integers(-(10 ** 30), 10 ** 30),
    st.text(max_size=8), st.booleans(), st.none())


def _other_spelling(value):
    """A JSON text for a value that differs from ``value`` as an exact JSON value."""
    if isinstance(value, bool):
        return json.dumps(int(value))
    if isinstance(value, float):
        if value == 0.0:
            return "0.0" if str(value).startswith("-") else "-0.0"
        return repr(value) + "1" if "e" not in repr(value) else json.dumps(value * 2)
    if isinstance(value, int):
        return json.dumps(float(value)) if abs(value) < 2 ** 53 else json.dumps(value + 1)
    if value is None:
        return "false"
    return json.dumps(value + "x")


@settings(max_examples=200, deadline=None)
@given(SCALARS)
def test_an_exotic_identity_value_passes_only_when_echoed_as_the_same_json_value(value):
    tasks = [{"task_id": "t1", "prompt": "p", "x": value}]
    same = '{"items": [{"task_id": "t1", "verdict": "match", "x": ' + json.dumps(value) + "}]}"
    assert accept_items(same, tasks, ("task_id", "x"), COMPILED, None).accepted
    other = _other_spelling(value)
    if isinstance(value, float) and float(other) == value and other.startswith("-") == (
            str(value).startswith("-")):
        return  # the perturbation happened to spell the same number
    text = '{"items": [{"task_id": "t1", "verdict": "match", "x": ' + other + "}]}"
    verdict = accept_items(text, tasks, ("task_id", "x"), COMPILED, None)
    assert not verdict.accepted, (value, other)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(TASKS) - 1), st.sampled_from(IDENTITY[1:]),
                          st.text(max_size=6)), min_size=1, max_size=4),
       st.booleans())
def test_a_provider_mutating_call_tasks_commits_nothing_wrong(edits, default_identity):
    def forger(call):
        for index, name, value in edits:
            if index < len(call.tasks):
                call.tasks[index][name] = value  # its own copy: echoes the forgery
        return json.dumps({"items": correct_items(call.tasks)})

    session = Session(CallableProvider(forger), repairs=0, replays=0)
    identity = None if default_identity else IDENTITY
    session.run_batch("r", TASKS, LABEL_SCHEMA, identity=identity, pack=len(TASKS),
                      on_exhausted="return")
    by_id = {t["task_id"]: t for t in TASKS}
    forged = any(by_id[TASKS[i]["task_id"]][n] != v for i, n, v in edits)
    stored = session.ledger.checkpoint("r")
    assert stored == ({} if forged else {t["task_id"]: answer(t) for t in TASKS})


JUNK = st.one_of(st.text(max_size=5), st.integers(), st.none(), st.lists(st.integers()))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["verdict", "task_id", "case_id", "extra"]), JUNK,
                       min_size=1), st.booleans())
def test_a_validator_mutating_its_item_or_task_commits_only_what_passed(junk, clear):
    def vandal(item, task):
        item.update(junk)
        task.update(junk)
        if clear:
            item.clear()

    session = Session(CallableProvider(lambda call: json.dumps(
        {"items": correct_items(call.tasks)})), repairs=0, replays=0)
    session.run_batch("r", TASKS, LABEL_SCHEMA, identity=IDENTITY, pack=3, validator=vandal)
    assert session.ledger.checkpoint("r") == {t["task_id"]: answer(t) for t in TASKS}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    | st.dictionaries(st.integers(), inner, max_size=3), max_leaves=20)


@given(JSON_VALUES)
@settings(max_examples=300)
def test_an_items_ledger_text_is_byte_for_byte_the_text_rows_have_always_held(value):
    """Encoded once, an accepted item's checkpoint text is what the value read back from its
    canonical JSON, dumped, has always been: rows old and new compare as texts."""
    assert ledger_json(value) == json.dumps(json.loads(canonical_json(value)))
