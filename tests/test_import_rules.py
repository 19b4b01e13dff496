"""Import admits only what the request proves, and shows every item it admitted.

Another system's receipt is held to what was requested (every task field an item echoes),
whatever its identity list says; batchjson's own export keeps the identity it was judged under;
the receipts of one batch judged alike form one revision, which ``values`` and ``status`` show;
a live run of the same content resumes from imported answers without a call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchjson import CallableProvider, Ledger, RunSpec, Session
from batchjson._errors import InvalidBatch
from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

ECHOED = ("task_id", "case_id", "candidate_id")


def items_for(tasks: list[dict], swap: dict[int, str] | None = None) -> str:
    items = [{k: t[k] for k in ECHOED} | answer(t) for t in tasks]
    for index, case in (swap or {}).items():
        items[index]["case_id"] = case
    return json.dumps({"items": items})


def receipt(tasks: list[dict], raw: str, **extra: Any) -> dict[str, Any]:
    return {"batch": "review", "tasks": tasks, "raw": raw, "status": "ok",
            "schema": LABEL_SCHEMA, "identity": ["task_id"], **extra}


def write(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def no_calls(call: Any) -> str:
    raise AssertionError(f"no call may be made, got one for {[t['task_id'] for t in call.tasks]}")


def three_requests() -> tuple[list[dict], list[dict[str, Any]]]:
    """Six tasks asked two at a time: three receipts of one batch."""
    tasks = review_tasks(6)
    return tasks, [receipt(tasks[i:i + 2], items_for(tasks[i:i + 2])) for i in (0, 2, 4)]


def imported_as_diagnostic(tmp_path: Path, line: dict[str, Any]) -> dict[str, Any]:
    """Import one line (its identity list "missing": without one) by the CLI; it must be kept
    as diagnostic, nothing admitted and nothing in ``values``. Returns the report."""
    if line.get("identity") == "missing":
        del line["identity"]
    ledger = tmp_path / "ledger.sqlite"
    done = cli("import", str(write(tmp_path / "old.jsonl", line)), "--ledger", str(ledger),
               "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["admitted"], report["diagnostic"], report["items_admitted"]) == (0, 1, 0)
    values = cli("values", "review", "--ledger", str(ledger), "--json", cwd=tmp_path)
    assert json.loads(values.stdout) == {}
    return report


@pytest.mark.parametrize("identity", [["task_id"], ["task_id", "candidate_id"], [], None,
                                      "missing"])
def test_the_seed_swap_is_kept_as_diagnostic_whatever_identity_list_the_receipt_gives(
        tmp_path: Path, identity: Any) -> None:
    tasks = review_tasks(20)
    line = receipt(tasks, items_for(tasks, {0: "gold-pair-079"}), identity=identity)
    report = imported_as_diagnostic(tmp_path, line)
    (error,) = report["receipts"][0]["errors"]
    assert (error["field"], error["expected"], error["got"]) == (
        "case_id", "gold-pair-078", "gold-pair-079")


def test_a_receipt_whose_identity_is_not_a_list_is_refused_naming_the_line(
        tmp_path: Path) -> None:
    tasks = review_tasks(2)
    path = write(tmp_path / "old.jsonl", receipt(tasks, items_for(tasks)),
                 receipt(tasks, items_for(tasks), identity="task_id"))
    with pytest.raises(InvalidBatch, match="line 2: field 'identity' must be a list of field "
                                           "names \\(or absent\\)"):
        Ledger(tmp_path / "ledger.sqlite").import_receipts(path)


def live_runs(ledger: Path) -> list[tuple[str, Any, Any]]:
    """Three batches run live: the default identity, an explicit one, and a validator whose
    fingerprint cannot see what it reads (its revision carries an ``unseen`` generation)."""
    calls = {"n": 0}

    def flaky(call: Any) -> str:  # the first return is bad: a rejected receipt to carry too
        calls["n"] += 1
        return items_reply(call, **{call.tasks[0]["task_id"]: {"case_id": "x"}}) \
            if calls["n"] == 1 else items_reply(call)

    def sees_nothing(item: Any, task: Any) -> bool:
        return globals()["LENIENT"]

    session = Session(CallableProvider(flaky, source=SOURCE), ledger=ledger)
    runs = [("default", None, None), ("explicit", ["task_id", "case_id"], None),
            ("blind", None, sees_nothing)]
    for name, identity, validator in runs:
        assert session.run_batch(name, review_tasks(4), LABEL_SCHEMA, identity=identity,
                                 validator=validator, pack=2).resolved
    session.close()
    return runs


LENIENT = True
SOURCE = "review-model-v1"  # one answer source for both sessions: exported keys carry it


def test_an_export_reimported_into_a_fresh_ledger_admits_what_it_admitted_before(
        tmp_path: Path) -> None:
    runs = live_runs(tmp_path / "a.sqlite")
    before = Ledger(tmp_path / "a.sqlite")
    exported = write(tmp_path / "a.jsonl", *before.export_receipts())
    report = Ledger(tmp_path / "b.sqlite").import_receipts(exported, validators={
        "live_runs.<locals>.sees_nothing": runs[2][2]})
    assert (report["admitted"], report["rejected"], report["diagnostic"]) == (6, 0, 0)
    assert report["recorded"] == 1  # the rejected return, as its ledger judged it
    after = Ledger(tmp_path / "b.sqlite")
    for name, _, _ in runs:
        assert after.checkpoint(name) == before.checkpoint(name)
        assert [(r.status, r.request_key) for r in after.attempts(name)] == [
            (r.status, r.request_key) for r in before.attempts(name)]
    again = Session(CallableProvider(no_calls, source=SOURCE), ledger=tmp_path / "b.sqlite")
    for name, identity, validator in runs:
        result = again.run_batch(name, review_tasks(4), LABEL_SCHEMA, identity=identity,
                                 validator=validator, pack=2)
        assert result.resolved and result.calls == 0


def test_an_export_whose_identity_was_weakened_is_refused(tmp_path: Path) -> None:
    session = Session(CallableProvider(items_reply), ledger=tmp_path / "a.sqlite")
    assert session.run_batch("review", review_tasks(2), LABEL_SCHEMA, pack=2).resolved
    (line,) = session.ledger.export_receipts()
    weakened = {**line, "identity_echo": False}  # its key would still match: compared less
    with pytest.raises(InvalidBatch, match="its identity 'task_id' is not the one its "
                                           "components name"):
        Ledger(tmp_path / "b.sqlite").import_receipts(write(tmp_path / "w.jsonl", weakened))


def test_every_admitted_item_is_shown_and_a_live_rerun_of_the_same_content_makes_no_call(
        tmp_path: Path) -> None:
    tasks, lines = three_requests()
    ledger = tmp_path / "ledger.sqlite"
    done = cli("import", str(write(tmp_path / "old.jsonl", *lines)), "--ledger", str(ledger),
               "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["admitted"], report["items_admitted"]) == (3, 6)
    (revision,) = report["revisions"]
    assert revision["current"] and revision["lines"] == [1, 2, 3]
    values = json.loads(cli("values", "review", "--ledger", str(ledger), "--json",
                            cwd=tmp_path).stdout)
    assert values == {t["task_id"]: answer(t) for t in tasks}
    status = json.loads(cli("status", "review", "--ledger", str(ledger), "--json",
                            cwd=tmp_path).stdout)
    (batch,) = status["batches"]
    assert (batch["tasks"], batch["usable_results"], batch["unresolved_tasks"]) == (6, 6, 0)

    session = Session(CallableProvider(no_calls), ledger=ledger)
    result = session.run_batch("review", tasks, LABEL_SCHEMA, pack=2)
    assert result.resolved and result.calls == 0 and len(result.values) == 6
    assert session.run_batch("review", tasks, LABEL_SCHEMA, pack=2).calls == 0


def test_a_strict_session_answering_an_imported_request_whose_receipt_was_rejected_clears_it(
        tmp_path: Path) -> None:
    """A receipt of another system rejected on import leaves its request owed under the key of
    its content without an answer source. A strict session (an RLM host's) never supersedes
    it, so when it answers the same tasks the imported request is cleared by a cost-0 recheck
    of that answer instead of owing forever on a key no live run computes as its own."""
    tasks = review_tasks(2)
    swapped = receipt(tasks, items_for(tasks, {0: "gold-pair-079"}))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.import_receipts(write(tmp_path / "old.jsonl", swapped))["diagnostic"] == 1
    ledger.close()
    session = Session(CallableProvider(items_reply, source="live"),
                      ledger=tmp_path / "ledger.sqlite", strict=True)
    assert session.evidence.minimum_exact_retry_calls == 1
    result = session.run_batch("review", tasks, LABEL_SCHEMA, pack=2)
    assert result.resolved and result.calls == 1
    assert session.evidence.minimum_exact_retry_calls == 0
    assert [r.kind for r in session.ledger.attempts("review")] == ["import", "initial",
                                                                    "recheck"]
    session.close()


def test_a_rejected_first_receipt_does_not_hide_the_admitted_second(tmp_path: Path) -> None:
    tasks, lines = three_requests()
    lines[0] = receipt(tasks[:2], items_for(tasks[:2], {1: "gold-pair-079"}))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    report = ledger.import_receipts(write(tmp_path / "old.jsonl", *lines[:2]))
    assert [r["outcome"] for r in report["receipts"]] == ["diagnostic", "admitted"]
    assert ledger.checkpoint("review") == {t["task_id"]: answer(t) for t in tasks[2:4]}
    (batch,) = ledger.cost_summary("review")["batches"]
    assert (batch["usable_results"], batch["unresolved_tasks"]) == (2, 2)


def test_receipts_that_disagree_on_schema_are_kept_apart_and_the_report_names_the_current(
        tmp_path: Path) -> None:
    tasks, lines = three_requests()
    lines[2] = {**lines[2], "schema": {"type": "object"}}
    ledger = tmp_path / "ledger.sqlite"
    history = write(tmp_path / "old.jsonl", *lines)
    report = json.loads(cli("import", str(history), "--ledger", str(ledger), "--json",
                            cwd=tmp_path).stdout)
    assert [(r["revision"], r["lines"], r["current"]) for r in report["revisions"]] == [
        (1, [1, 2], True), (2, [3], False)]
    assert "differ in schema" in report["revisions"][1]["reason"]
    human = cli("import", str(write(tmp_path / "copy.jsonl", *lines)), "--ledger",
                str(tmp_path / "other.sqlite"), cwd=tmp_path).stdout
    assert "batch 'review': revision 1 is current (values and status show it)" in human
    assert "revision 2: line 3, 2 item(s) admitted, imported beside revision 1: its " \
           "receipts differ in schema" in " ".join(human.split())
    values = Ledger(ledger).checkpoint("review")
    assert values == {t["task_id"]: answer(t) for t in tasks[:4]}


def test_a_history_imported_again_as_it_grows_shows_every_admitted_item(
        tmp_path: Path) -> None:
    tasks, lines = three_requests()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert ledger.import_receipts(write(tmp_path / "old.jsonl", *lines[:2]))["admitted"] == 2
    report = ledger.import_receipts(write(tmp_path / "old.jsonl", *lines))
    assert (report["skipped"], report["admitted"]) == (2, 1)
    assert ledger.checkpoint("review") == {t["task_id"]: answer(t) for t in tasks}
    assert [r.number for r in ledger.revisions("review")] == [1]


def test_an_import_beside_a_live_batch_says_which_revision_values_show(tmp_path: Path) -> None:
    tasks, lines = three_requests()
    session = Session(CallableProvider(items_reply), ledger=tmp_path / "ledger.sqlite")
    assert session.run_batch("review", tasks[:2], LABEL_SCHEMA, pack=2).resolved
    report = session.ledger.import_receipts(write(tmp_path / "old.jsonl", *lines[1:]))
    (beside,) = report["revisions"]
    assert (beside["current"], beside["current_revision"]) == (False, 1)
    assert "beside the batch's current revision" in beside["reason"]
    assert len(session.ledger.checkpoint("review")) == 2  # what the live batch works on


def test_an_export_of_several_revisions_keeps_the_current_one_current(tmp_path: Path) -> None:
    session = Session(CallableProvider(items_reply, source=SOURCE), ledger=tmp_path / "a.sqlite")
    loose = {"type": "object", "properties": {"verdict": {"type": "string"}}}
    for schema in (LABEL_SCHEMA, loose, LABEL_SCHEMA):  # the first revision is current again
        assert session.run_batch("review", review_tasks(4), schema, pack=2).resolved
    exported = write(tmp_path / "a.jsonl", *session.ledger.export_receipts())
    fresh = Ledger(tmp_path / "b.sqlite")
    report = fresh.import_receipts(exported)
    assert [(r["revision"], r["current"]) for r in report["revisions"]] == [(1, True), (2, False)]
    assert [r.status for r in fresh.revisions("review")] == ["open", "superseded"]
    assert fresh.checkpoint("review") == session.ledger.checkpoint("review")


SEED_TASK = review_tasks(1)[0]
SEED_ECHO = {k: SEED_TASK[k] for k in ECHOED}
OTHER_TASK = review_tasks(2)[1]["task_id"]
VALUE_SWAPS = {  # a value-mode answer that somewhere says it answers another case or task
    "the object echoes the swap": SEED_ECHO | {"case_id": "gold-pair-079", "verdict": "match"},
    "no task_id, only the case": {"case_id": "gold-pair-079", "verdict": "match"},
    "another task's id": {"task_id": OTHER_TASK, "verdict": "match"},
    "an items envelope sent as the value": {"items": [SEED_ECHO | {"case_id": "gold-pair-079",
                                                                   "verdict": "match"}]},
    "a list of one answer": [SEED_ECHO | {"case_id": "gold-pair-079", "verdict": "match"}],
    "nested under a wrapper": {"answer": SEED_ECHO | {"case_id": "gold-pair-079"}},
}


@pytest.mark.parametrize("identity", [["task_id", "candidate_id", "case_id"], ["task_id"], [],
                                      None, "missing"])
@pytest.mark.parametrize("shape", list(VALUE_SWAPS))
def test_the_seed_swap_in_a_value_mode_receipt_is_kept_as_diagnostic(
        tmp_path: Path, shape: str, identity: Any) -> None:
    """A receipt of another system saying ``"mode": "value"`` is held to its task too: the
    answer (an object) and any object in it naming a task_id must echo the task's fields."""
    line = receipt([SEED_TASK], json.dumps(VALUE_SWAPS[shape]), mode="value",
                   identity=identity, schema={})
    report = imported_as_diagnostic(tmp_path, line)
    assert {e["field"] for e in report["receipts"][0]["errors"]} <= {"case_id", "task_id"}


@pytest.mark.parametrize("claimed", ["batchjson format without components", "fenced",
                                     "float identity rounding onto the task's"])
def test_a_value_mode_swap_is_diagnostic_however_the_receipt_dresses_it(
        tmp_path: Path, claimed: str) -> None:
    task, raw, extra = SEED_TASK, json.dumps(VALUE_SWAPS["the object echoes the swap"]), {}
    if claimed == "batchjson format without components":
        extra = {"format": "batchjson/receipt-1", "identity_echo": False}
    elif claimed == "fenced":
        raw = f"```json\n{raw}\n```"
    else:  # 0.10000000000000001 reads as the float 0.1, but is not the number requested
        task = {**SEED_TASK, "score": 0.1}
        raw = json.dumps({"task_id": task["task_id"]})[:-1] + ', "score": 0.10000000000000001}'
    line = receipt([task], raw, mode="value", schema={}, **extra)
    report = Ledger(tmp_path / "l.sqlite").import_receipts(write(tmp_path / "o.jsonl", line))
    assert (report["diagnostic"], report["items_admitted"]) == (1, 0)


def test_a_value_mode_receipt_that_echoes_its_task_or_nothing_is_admitted(
        tmp_path: Path) -> None:
    lines = [receipt([task], raw, mode="value", schema=schema) for task, raw, schema in (
        (SEED_TASK, json.dumps(SEED_ECHO | {"verdict": "match"}), LABEL_SCHEMA),
        (review_tasks(2)[1], json.dumps("no_match"), {"enum": ["match", "no_match"]}))]
    report = Ledger(tmp_path / "l.sqlite").import_receipts(write(tmp_path / "o.jsonl", *lines))
    assert (report["admitted"], report["items_admitted"]) == (2, 2)


def test_an_export_whose_mode_was_changed_to_value_is_refused(tmp_path: Path) -> None:
    session = Session(CallableProvider(items_reply), ledger=tmp_path / "a.sqlite")
    assert session.run_batch("review", review_tasks(1), LABEL_SCHEMA, pack=1).resolved
    (line,) = session.ledger.export_receipts()
    with pytest.raises(InvalidBatch, match="its mode 'value' is not the one its components "
                                           "name \\('items'"):
        Ledger(tmp_path / "b.sqlite").import_receipts(
            write(tmp_path / "w.jsonl", {**line, "mode": "value"}))


def test_a_live_value_mode_run_rejects_an_answer_echoing_another_case_and_repairs_it(
        tmp_path: Path) -> None:
    """The same rule live: under the default identity a value that echoes a task field is held
    to it; droste's contract (an explicit identity of task_id alone) compares nothing."""
    answers = iter([SEED_ECHO | {"case_id": "gold-pair-079", "verdict": "match"},
                    SEED_ECHO | {"verdict": "match"}, {"index": 7, "task_id": "mine"}])
    session = Session(CallableProvider(lambda call: json.dumps(next(answers))),
                      ledger=tmp_path / "a.sqlite")
    result = session.run(RunSpec("review", [SEED_TASK], {}, mode="value"))
    assert result.resolved and result.calls == 2
    (rejected, _) = session.ledger.attempts("review")
    assert rejected.errors[0]["field"] == "case_id"
    droste = session.llm_batch_json(["p"], {"type": "object"})
    assert droste["values"] == [{"index": 7, "task_id": "mine"}]  # the task's are ours
    session.close()
