"""Define-once registry: re-running a cell must hand back the first validator object."""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
from datetime import datetime
from typing import Any

import pytest

from batchjson._errors import InvalidBatch, ValidatorChanged
from batchjson._session.registry import ValidatorRegistry, ValidatorVersion

CELL = '''
THRESHOLD = 0.5
LABELS = ["positive", "negative", "neutral"]

def validate_labels(items):
    errors = [f"item {i}: unknown label" for i, it in enumerate(items)
              if it["label"] not in LABELS or it["score"] < THRESHOLD]
    if errors:
        raise RuntimeError("; ".join(errors))
    return items

definition = registry.register(validate_labels)
validate_labels = definition.fn
'''


def run_cell(ns: dict[str, Any], src: str = CELL) -> Any:
    exec(compile(src, "<cell>", "exec"), ns)
    return ns["validate_labels"]


def test_seven_reexecutions_return_the_first_object() -> None:
    registry = ValidatorRegistry()
    ns: dict[str, Any] = {"registry": registry}
    first = run_cell(ns)
    assert ns["definition"].kind == "registered" and ns["definition"].version == 1
    assert ns["definition"].message.startswith(
        "validator 'validate_labels' registered (version 1, ")
    for _ in range(6):
        again = run_cell(ns)
        assert again is first and id(again) == id(first)
        assert ns["definition"].kind == "unchanged"
        assert ns["definition"].message == (
            "validator 'validate_labels' unchanged: reusing version 1")
    assert len(registry) == 1 and [v.version for v in registry.versions("validate_labels")] == [1]


def test_version_record() -> None:
    registry = ValidatorRegistry()
    ns: dict[str, Any] = {"registry": registry}
    fn = run_cell(ns)
    record = registry.version_of(fn)
    assert isinstance(record, ValidatorVersion)
    assert (record.name, record.version, record.fn) == ("validate_labels", 1, fn)
    assert record.where == "<cell>:5"
    assert datetime.fromisoformat(record.defined_at).utcoffset().total_seconds() == 0
    assert record.fingerprint.stable
    assert registry.current("validate_labels") is record
    assert "validate_labels" in registry and "other" not in registry
    assert list(registry) == [record]
    assert registry.current("other") is None and registry.versions("other") == []


def test_nonstrict_change_makes_version_2_and_revert_returns_version_1() -> None:
    registry = ValidatorRegistry()
    ns: dict[str, Any] = {"registry": registry}
    v1 = run_cell(ns)
    v2 = run_cell(ns, CELL.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7"))
    assert v2 is not v1
    assert registry.current("validate_labels").version == 2
    assert ns["definition"].kind == "changed"
    assert ns["definition"].changes == ("global THRESHOLD changed",)
    assert ns["definition"].message == ("validator 'validate_labels' changed (global THRESHOLD "
                                        "changed): now version 2")
    back = run_cell(ns)
    assert back is v1
    assert registry.current("validate_labels").version == 1
    assert ns["definition"].kind == "reused" and ns["definition"].version == 1
    assert "matches version 1" in ns["definition"].message
    assert [v.version for v in registry.versions("validate_labels")] == [1, 2]
    assert run_cell(ns, CELL.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")) is v2


def test_strict_refuses_change_only_while_evidence_is_open() -> None:
    open_under: dict[str, int] = {}
    registry = ValidatorRegistry(strict=True, unresolved_under=lambda d: open_under.get(d, 0))
    ns: dict[str, Any] = {"registry": registry}
    v1 = run_cell(ns)
    digest1 = registry.current("validate_labels").fingerprint.digest
    open_under[digest1] = 3
    changed = CELL.replace("THRESHOLD = 0.5", "THRESHOLD = 0.7")
    with pytest.raises(ValidatorChanged) as info:
        run_cell(ns, changed)
    err = info.value
    assert err.name == "validate_labels" and err.old_fingerprint == digest1
    assert err.changes == ["global THRESHOLD changed"] and "3 request(s)" in str(err)
    # nothing was registered: same single version, still current
    assert [v.version for v in registry.versions("validate_labels")] == [1]
    assert registry.current("validate_labels").fn is v1
    # an unchanged re-run is still fine while evidence is open
    ns["THRESHOLD"] = 0.5
    assert run_cell(ns) is v1
    # once resolved, the change is accepted as version 2
    open_under[digest1] = 0
    v2 = run_cell(ns, changed)
    assert v2 is not v1 and registry.current("validate_labels").version == 2


def test_strict_without_open_evidence_behaves_like_nonstrict() -> None:
    registry = ValidatorRegistry(strict=True, unresolved_under=lambda d: 0)
    ns: dict[str, Any] = {"registry": registry}
    run_cell(ns)
    run_cell(ns, CELL.replace("0.5", "0.6"))
    assert registry.current("validate_labels").version == 2


def test_names_are_independent_and_explicit_names_win() -> None:
    registry = ValidatorRegistry()

    def check(x: int) -> bool:
        return x > 0

    a = registry.define(check)
    assert registry.current(check.__qualname__).fn is a is check
    b = registry.define(lambda x: x > 1, name=check.__qualname__)
    assert b is not a and registry.current(check.__qualname__).version == 2
    assert registry.define(check, name="positive") is check
    assert len(registry) == 2 and {v.name for v in registry} == {check.__qualname__, "positive"}


def test_partials_methods_and_instances_get_sensible_names() -> None:
    registry = ValidatorRegistry()

    def check(x: int, limit: int) -> bool:
        return x < limit

    class Checker:
        def __call__(self, x: int) -> bool:
            return x > 0

        def method(self, x: int) -> bool:
            return x > 0

    p = functools.partial(check, limit=3)
    assert registry.define(p) is p
    assert registry.define(functools.partial(check, limit=3)) is p
    registry.define(Checker())
    registry.define(Checker().method)
    names = {v.name for v in registry}
    suffixes = {"partial(" + check.__qualname__ + ")", Checker.__qualname__,
                Checker.method.__qualname__}
    assert names == suffixes


def test_identity_fallback_still_defines_once_within_the_process() -> None:
    registry = ValidatorRegistry()
    db = sqlite3.connect(":memory:")  # a database's content is out of sight: identity
    src = "def guarded(x):\n    with db:\n        return x\nguarded = registry.define(guarded)\n"
    ns: dict[str, Any] = {"registry": registry, "db": db}
    exec(compile(src, "<cell>", "exec"), ns)
    first = ns["guarded"]
    assert registry.register(first).message.endswith("compared by identity: global:db")
    exec(compile(src, "<cell>", "exec"), ns)
    assert ns["guarded"] is first
    record = registry.current("guarded")
    assert record.fingerprint.by_identity == ("global:db",) and not record.fingerprint.stable
    ns["db"] = sqlite3.connect(":memory:")  # a new object: identity differs, so a new version
    exec(compile(src, "<cell>", "exec"), ns)
    assert ns["guarded"] is not first and registry.current("guarded").version == 2


def test_define_is_thread_safe_and_converges_on_one_object() -> None:
    registry = ValidatorRegistry()
    src = "PAT = re.compile('^[a-z]+$')\ndef check(s):\n    return bool(PAT.match(s))\n"
    candidates = []
    for _ in range(8):
        ns: dict[str, Any] = {"re": re}
        exec(compile(src, "<cell>", "exec"), ns)
        candidates.append(ns["check"])
    results: list[Any] = []
    barrier = threading.Barrier(len(candidates))

    def worker(fn: Any) -> None:
        barrier.wait()
        results.append(registry.define(fn))

    threads = [threading.Thread(target=worker, args=(fn,)) for fn in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and len({id(r) for r in results}) == 1
    assert results[0] in candidates and len(registry.versions("check")) == 1


def test_rejects_non_callables_and_bad_names() -> None:
    registry = ValidatorRegistry()
    with pytest.raises(InvalidBatch, match="must be callable"):
        registry.define(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidBatch, match="names go by keyword"):
        registry.define("check")  # type: ignore[arg-type]
    with pytest.raises(InvalidBatch, match="non-empty string"):
        registry.define(len, name="")
    assert len(registry) == 0


def test_unrelated_lambdas_are_separate_validators_even_in_a_strict_registry() -> None:
    registry = ValidatorRegistry(strict=True, unresolved_under=lambda digest: 1)
    first = registry.define(lambda value, index: None)
    second = registry.define(lambda value, index: value["label"])  # evidence is open: no matter
    assert first is not second
    again = registry.define(lambda value, index: None)  # the same lambda, re-executed
    assert again is first


def test_a_function_defined_under_a_chosen_name_keeps_that_name_when_passed_on():
    """The ValidatorChanged advice (define the new logic under another name) must work when
    the function is then handed to run_batch, which knows no name."""
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    session = Session(CallableProvider(lambda call: "not json"), strict=True, repairs=0,
                      replays=0)

    def check(item, task):
        return None

    session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=check,
                      on_exhausted="return")

    def check(item, task):  # noqa: F811 - the cell was edited and re-run
        if item["verdict"] == "x":
            raise ValueError("no x")

    with pytest.raises(ValidatorChanged) as refused:
        session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=check)
    advised = f"{refused.value.name}_v2"
    assert f"validator(fn, name='{advised}')" in str(refused.value)
    session.validators.define(check, name=advised)  # as the message advises
    session.provider = CallableProvider(items_reply)
    result = session.run_batch("r2", review_tasks(1), LABEL_SCHEMA, validator=check)
    assert result.status == "resolved"
    assert session.validators.current(advised).fn is check
    assert [v.name for v in session.validators] == [refused.value.name, advised]


# --- a registry never runs stale logic -------------------------------------------------------

CHECK_CELL = '''
class Check:
    _limit = 0.5
    def ok(self, score):
        return score >= self._limit

def validate(item, task):
    if not Check().ok(item["score"]):
        raise ValueError("score too low")

validate = registry.define(validate)
'''


def test_a_redefined_underscore_class_attribute_runs_the_new_check() -> None:
    """The issue's repro: after `class Check: _limit = 0.9`, a never-seen task scoring 0.7 was
    accepted by the old 0.5 check because the registry handed back the first object."""
    registry = ValidatorRegistry()
    ns: dict[str, Any] = {"registry": registry}
    exec(compile(CHECK_CELL, "<cell>", "exec"), ns)
    old = ns["validate"]
    old({"score": 0.7}, {})  # the 0.5 check accepts it
    exec(compile(CHECK_CELL.replace("0.5", "0.9"), "<cell>", "exec"), ns)
    assert ns["validate"] is not old
    with pytest.raises(ValueError, match="too low"):
        ns["validate"]({"score": 0.7}, {})
    current = registry.current("validate")
    assert current.version == 2 and current.fn is ns["validate"]


PARTIAL_CELL = '''
LIMIT = {limit}
def validate(item, task):
    if item["score"] < globals()["LIMIT"]:
        raise ValueError("score too low")
definition = registry.register(validate)
validate = definition.fn
'''


def test_a_partial_fingerprint_never_hands_back_an_older_object() -> None:
    registry = ValidatorRegistry()
    first_ns: dict[str, Any] = {"registry": registry}
    exec(compile(PARTIAL_CELL.format(limit=0.5), "<cell>", "exec"), first_ns)
    first = first_ns["validate"]
    assert first_ns["definition"].fingerprint.unseen == ("globals()",)
    assert "cannot see: globals()" in first_ns["definition"].message
    # the same code in another namespace where LIMIT is 0.9: the digest cannot tell them apart,
    # so the object just defined (reading its own globals) must be the one that runs
    second_ns: dict[str, Any] = {"registry": registry}
    exec(compile(PARTIAL_CELL.format(limit=0.9), "<cell>", "exec"), second_ns)
    definition = second_ns["definition"]
    assert definition.kind == "unchanged" and definition.fn is not first
    with pytest.raises(ValueError, match="too low"):
        second_ns["validate"]({"score": 0.7}, {})
    assert registry.current("validate").fn is second_ns["validate"]


RLM_CELL = '''
from pydantic import TypeAdapter
ints = TypeAdapter(list[int])
def validate_counts(value, index):
    ints.validate_python(value["counts"])
validate_counts = validator(validate_counts)
'''


def test_a_strict_rlm_cell_using_a_type_adapter_reexecutes_without_validator_changed() -> None:
    registry = ValidatorRegistry(strict=True, unresolved_under=lambda digest: 3)  # open evidence
    ns: dict[str, Any] = {"validator": registry.define}
    exec(compile(RLM_CELL, "<cell>", "exec", dont_inherit=True), ns)
    first = ns["validate_counts"]
    for _ in range(3):  # the RLM loop's repair path re-runs the whole cell
        exec(compile(RLM_CELL, "<cell>", "exec", dont_inherit=True), ns)
        assert ns["validate_counts"] is first
    with pytest.raises(ValidatorChanged):  # a real change is still refused
        exec(compile(RLM_CELL.replace("list[int]", "list[str]"), "<cell>", "exec",
                     dont_inherit=True), ns)


# --- one `validator`, one meaning ----------------------------------------------------------

SHAPES_CELL = '''
@validator
def bare(item, task):
    return None

@validator(name="named")
def anything(item, task):
    return None

def plain(item, task):
    return None

called = validator(plain)
called_named = validator(plain, name="plain_v2")
'''


def _assert_every_shape_registered(ns: dict[str, Any], registry: ValidatorRegistry) -> None:
    assert {v.name for v in registry} >= {"bare", "named", "plain", "plain_v2"}
    assert registry.current("named").fn is ns["anything"]
    assert ns["called"] is ns["plain"] and ns["called_named"] is ns["plain"]
    assert callable(ns["bare"]) and registry.current("bare").fn is ns["bare"]


def test_every_validator_shape_works_in_a_plain_namespace_given_the_session_s_helper() -> None:
    from batchjson import CallableProvider, Session

    session = Session(CallableProvider(lambda call: "{}"))
    ns = {"llm_batch_json": session.llm_batch_json, "validator": session.validators.define}
    exec(compile(SHAPES_CELL, "<cell>", "exec"), ns)
    _assert_every_shape_registered(ns, session.validators)
    exec(compile(SHAPES_CELL, "<cell>", "exec"), ns)  # re-run: same objects, no new versions
    assert all(len(session.validators.versions(n)) == 1 for n in ("bare", "named", "plain"))


def test_every_validator_shape_works_through_the_name_injected_into_ipython(ip: Any) -> None:
    result = ip.run_cell("%load_ext batchjson")
    assert result.success
    result = ip.run_cell(SHAPES_CELL)
    assert result.success, result.error_in_exec
    _assert_every_shape_registered(ip.user_ns, ip.user_ns["batch_session"].validators)


def test_the_public_validator_decorator_has_the_same_shapes() -> None:
    import batchjson
    from batchjson import CallableProvider, Session

    session = Session(CallableProvider(lambda call: "{}"))
    previous = batchjson._session.session._default
    batchjson.set_default_session(session)
    try:
        ns: dict[str, Any] = {"validator": batchjson.validator}
        exec(compile(SHAPES_CELL, "<cell>", "exec"), ns)
        _assert_every_shape_registered(ns, session.validators)
    finally:
        batchjson.set_default_session(previous)


# --- a TypeAdapter-using validator resumes in another process ---------------------------------

RESUME = '''
import json, sys
from pydantic import TypeAdapter
from batchjson import CallableProvider, Session

ints = TypeAdapter(list[int])

def answer(call):
    return json.dumps({"items": [{**{k: t[k] for k in call.identity}, "counts": [1, 2]}
                                 for t in call.tasks]})

def check(item, task):
    ints.validate_python(item["counts"])

session = Session(CallableProvider(answer), ledger=sys.argv[1], strict=True)
before = session.ledger.spend()["calls"]
tasks = [{"task_id": f"t{i}", "prompt": f"count {i}"} for i in range(6)]
schema = {"type": "object", "properties": {"counts": {"type": "array"}}, "required": ["counts"]}
result = session.run_batch("counts", tasks, schema, validator=check, pack=2)
print(json.dumps([result.status, session.ledger.spend()["calls"] - before]))
session.close()
'''


def test_a_type_adapter_validator_resumes_with_zero_calls_in_a_second_process(
        tmp_path: Any) -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    ledger = str(tmp_path / "ledger.sqlite")
    runs = [json.loads(subprocess.run([sys.executable, "-c", RESUME, ledger], env=env,
                                      check=True, capture_output=True, text=True).stdout)
            for _ in range(2)]
    assert runs == [["resolved", 3], ["resolved", 0]]


def test_an_object_that_raises_when_read_is_registered_by_identity() -> None:
    class Hostile:
        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError("no peeking")

        def __call__(self, item: Any, task: Any) -> None:
            return None

    registry = ValidatorRegistry()
    hostile = Hostile()
    definition = registry.register(hostile)
    assert definition.kind == "registered" and definition.name.endswith("Hostile")
    assert definition.record.where == "<unknown>"
    assert registry.define(hostile) is hostile


STRICT_RLM_CELL = '''
from pydantic import TypeAdapter
ints = TypeAdapter(list[int])

def validate_counts(value, index):
    ints.validate_python(value)

out = llm_batch_json(["count a", "count b"], {"type": "array"}, validator=validate_counts,
                     max_repair_attempts=0)
if out["errors"] and any(out["errors"]):
    raise RuntimeError("unresolved")
'''


def test_a_strict_session_resumes_an_rlm_cell_whose_validator_uses_a_type_adapter() -> None:
    """The seed's ratchet: the RLM loop re-runs a failing cell; with the TypeAdapter compared by
    identity every re-run was a 'changed' validator, refused while evidence was open."""
    from batchjson import CallableProvider, Session

    answers = {"text": "not json"}
    session = Session(CallableProvider(lambda call: answers["text"]), strict=True, replays=0)
    ns = {"llm_batch_json": session.llm_batch_json, "validator": session.validators.define}
    for _ in range(3):
        with pytest.raises(RuntimeError, match="unresolved"):
            exec(compile(STRICT_RLM_CELL, "<cell>", "exec", dont_inherit=True), ns)
    assert [v.version for v in session.validators.versions("validate_counts")] == [1]
    answers["text"] = "[1, 2]"
    exec(compile(STRICT_RLM_CELL, "<cell>", "exec", dont_inherit=True), ns)
    assert ns["out"]["values"] == [[1, 2], [1, 2]]


MAGIC_CELL = '''%%batch_json scored --validator check
tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(N)]
schema = {"type": "object", "properties": {"verdict": {"type": "string"},
          "score": {"type": "number"}}, "required": ["verdict", "score"]}
class Check:
    _limit = LIMIT
def check(item, task):
    if item["score"] < Check._limit:
        raise ValueError(f"score below {Check._limit}")
'''


def test_the_magic_runs_a_redefined_underscore_limit_on_a_never_seen_task(
        ip: Any, capsys: Any) -> None:
    """The issue's repro through %%batch_json: after `_limit = 0.9`, a new task scoring 0.7 must
    be rejected, not accepted by the old 0.5 check handed back by the registry."""
    from batchjson import BatchUnresolved

    setup = ("%load_ext batchjson",
             "from batchjson import SimulatedModel\n"
             "model = SimulatedModel(answer=lambda task: {'verdict': 'match', 'score': 0.7})",
             "%config BatchJson.provider = model", "%config BatchJson.repairs = 0",
             "%config BatchJson.replays = 0")
    for line in setup:
        assert ip.run_cell(line).success
    first = ip.run_cell(MAGIC_CELL.replace("N)", "2)").replace("LIMIT", "0.5"))
    assert first.success, first.error_in_exec
    capsys.readouterr()
    second = ip.run_cell(MAGIC_CELL.replace("N)", "3)").replace("LIMIT", "0.9"))
    assert isinstance(second.error_in_exec, BatchUnresolved)
    out = capsys.readouterr().out
    assert "validator 'check' changed (global Check: attribute _limit changed)" in out
    result = ip.user_ns["scored"]
    # no value accepted under 0.5 is reused under 0.9: every task was judged by the new check
    assert result.status == "unresolved" and result.values == {} and result.resumed == 0
    assert {e["task_id"] for e in result.errors} == {"t0", "t1", "t2"}
    assert all("score below 0.9" in e["message"] for e in result.errors)


def test_a_run_fingerprints_a_validator_again_unless_a_helper_handed_it_over() -> None:
    """A validator defined, then its global changed before a run, is judged as it is at the
    run; only a helper registering it on its way to the run (RLM, droste) skips a second
    fingerprint, and only for that one run."""
    from batchjson import Session, SimulatedModel
    from tests.helpers import LABEL_SCHEMA, answer, review_tasks

    session = Session(SimulatedModel(answer))
    ns: dict[str, Any] = {}
    exec(compile("LIMIT = 1\ndef check(item, task):\n    return LIMIT > 0\n", "<cell>", "exec"),
         ns)
    check = session.validators.define(ns["check"], name="check")
    ns["LIMIT"] = 2  # changed after the definition, before the run
    result = session.run_batch("b", review_tasks(2), LABEL_SCHEMA, validator=check)
    assert any("validator 'check' changed" in note for note in result.notes)

    handed = session.validators.version_of(check, hand_over=True)
    assert session.validators.handed_over(check) is handed
    ns["LIMIT"] = 3  # a helper's hand-over is trusted for the run it is on its way to
    assert session.run_batch("b", review_tasks(2), LABEL_SCHEMA, validator=check).notes == []
    assert session.validators.handed_over(check) is None  # taken by that run
    result = session.run_batch("b", review_tasks(2), LABEL_SCHEMA, validator=check)
    assert any("changed" in note for note in result.notes)  # and never again
    session.close()
