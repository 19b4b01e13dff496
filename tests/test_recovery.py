"""Import of historical receipts: every item rechecked, whatever status the old receipt claims."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from batchjson import CallableProvider, Ledger, Session
from batchjson._errors import InvalidBatch
from tests.helpers import LABEL_SCHEMA, answer, items_reply, ledger_rows, review_tasks

IDENTITY = ["task_id", "case_id", "candidate_id"]
TABLES = ("batches", "revisions", "requests", "attempts", "checkpoint", "imports")


def items_for(tasks: list[dict], swap: dict[int, str] | None = None) -> str:
    items = [{k: t[k] for k in IDENTITY} | answer(t) for t in tasks]
    for index, case in (swap or {}).items():
        items[index]["case_id"] = case
    return json.dumps({"items": items})


def receipt(tasks: list[dict], raw: str, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"batch": "review", "tasks": tasks, "raw": raw, "status": status,
            "identity": IDENTITY, "schema": LABEL_SCHEMA, "input_tokens": 1200,
            "output_tokens": 800, "cost": 0.00066, "model": "gpt-4o-mini",
            "at": "2026-03-01T10:00:00Z", **extra}


def write(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def counts(ledger_path: Path | str) -> dict[str, int]:
    return {t: ledger_rows(ledger_path, f"SELECT COUNT(*) FROM {t}")[0][0] for t in TABLES}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_ok_receipt_with_swapped_case_id_admits_none_of_20_and_a_later_return_is_accepted(
        tmp_path: Path) -> None:
    tasks = review_tasks(20)
    history = write(tmp_path / "old.jsonl",
                    receipt(tasks, items_for(tasks, {0: "gold-pair-079"}), status="ok"))
    ledger = tmp_path / "ledger.sqlite"

    done = cli("import", str(history), "--ledger", str(ledger), "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # kept as diagnostic
    report = json.loads(done.stdout)
    assert (report["admitted"], report["diagnostic"], report["items_admitted"]) == (0, 1, 0)
    (line,) = report["receipts"]
    assert line["claimed_status"] == "ok" and line["outcome"] == "diagnostic"
    (error,) = line["errors"]
    assert error == {"task_id": "gold-pair-078::gold-pair-078-candidate-127",
                     "field": "case_id", "expected": "gold-pair-078", "got": "gold-pair-079",
                     "message": error["message"]}
    human = cli("import", str(history), "--ledger", str(ledger), cwd=tmp_path)
    assert "already imported" in human.stdout  # the second import changes nothing

    held = Ledger(ledger)
    assert held.checkpoint("review") == {}  # none of the 20 admitted
    (kept,) = held.attempts("review")
    assert (kept.kind, kept.status) == ("import", "rejected")
    sent = json.loads(history.read_text())["raw"]
    assert kept.raw == sent  # the raw return is kept whole, as diagnostic material
    held.close()

    # the same return copied into another file (an extra field: another line) is judged again
    shown = cli("import", str(write(tmp_path / "again.jsonl", receipt(
        tasks, items_for(tasks, {0: "gold-pair-079"}), status="ok", note="copy"))),
        "--ledger", str(ledger), cwd=tmp_path)
    assert shown.returncode == 1
    assert "DIAGNOSTIC" in shown.stdout and "case_id is 'gold-pair-079'" in shown.stdout
    assert "the request has 'gold-pair-078'" in shown.stdout

    session = Session(CallableProvider(items_reply), ledger=ledger)
    result = session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=20)
    assert result.resolved and result.calls == 1 and len(result.values) == 20
    # the live call is the first under its key (the answer source is part of it); the
    # diagnostic import's request is then cleared by re-judging that accepted return, cost 0
    assert [(r.kind, r.status) for r in session.ledger.attempts("review")] == [
        ("import", "rejected"), ("import", "rejected"), ("initial", "accepted"),
        ("recheck", "accepted")]
    session.close()


def test_a_correct_historical_return_is_admitted_and_resumes_with_zero_calls(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(20)
    history = write(tmp_path / "old.jsonl",
                    receipt(tasks, items_for(tasks, {3: "gold-pair-079"}), status="ok"),
                    receipt(tasks, items_for(tasks), status="ok"))
    session = Session(CallableProvider(lambda call: pytest.fail("no call may be made")),
                      ledger=ledger_at("ledger"))
    report = session.ledger.import_receipts(history, validators=session.validators)
    assert [r["outcome"] for r in report["receipts"]] == ["diagnostic", "admitted"]
    assert report["items_admitted"] == 20
    result = session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=20)
    assert result.resolved and result.calls == 0 and result.rechecked == 1  # re-judged, cost 0
    account = session.ledger.cost_summary("review")["total"]
    assert (account["calls"], account["imported"], account["cost"]) == (2, 2, 0.00132)
    assert (account["input_tokens"], account["output_tokens"]) == (2400, 1600)


def test_importing_the_same_file_twice_changes_nothing(tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(4)
    history = write(tmp_path / "old.jsonl", receipt(tasks, items_for(tasks, {1: "x"})),
                    receipt(tasks, items_for(tasks)), receipt(tasks, "not json", "error"))
    ledger = Ledger(ledger_at("ledger"))
    first = ledger.import_receipts(history)
    before = counts(ledger_at("ledger"))
    second = ledger.import_receipts(history)
    assert counts(ledger_at("ledger")) == before
    assert (first["admitted"], first["diagnostic"], first["rejected"]) == (1, 1, 1)
    assert second["skipped"] == 3 and second["admitted"] == 0
    assert ledger.cost_summary()["total"]["calls"] == 3


def test_a_malformed_line_refuses_the_whole_file_before_anything_is_written(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(2)
    good = receipt(tasks, items_for(tasks))
    cases = [({**good, "tasks": "nope"}, "field 'tasks' must be a list"),
             ({k: v for k, v in good.items() if k != "raw"}, "field 'raw'"),
             ({**good, "identity": ["task_id", "shard"]}, "lacks identity field 'shard'"),
             ({**good, "cost": -1}, "field 'cost' must be a number >= 0"),
             ({**good, "schema": {"type": "nonsense"}}, "invalid JSON Schema")]
    ledger = Ledger(ledger_at("ledger"))
    for bad, message in cases:
        path = write(tmp_path / "mixed.jsonl", good, bad)
        with pytest.raises(InvalidBatch, match="line 2") as refused:
            ledger.import_receipts(path)
        assert message in str(refused.value) and "nothing was imported" in str(refused.value)
    (tmp_path / "text.jsonl").write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(InvalidBatch, match="line 2: not JSON"):
        ledger.import_receipts(tmp_path / "text.jsonl")
    assert counts(ledger_at("ledger"))["attempts"] == 0


def test_a_registered_validator_rechecks_imported_items(tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(3)
    session = Session(CallableProvider(items_reply), ledger=ledger_at("ledger"))

    def strict_review(item: Any, task: Any) -> None:
        if item["verdict"] != "match":
            raise ValueError("only matches are plausible here")

    session.validators.define(strict_review, name="strict_review")
    history = write(tmp_path / "old.jsonl",
                    receipt(tasks, items_for(tasks), validator="strict_review"))
    report = session.ledger.import_receipts(history, validators=session.validators)
    (line,) = report["receipts"]
    assert line["outcome"] == "rejected" and "validation" in line["reason"]
    assert session.ledger.checkpoint("review") == {}


def test_a_claimed_failure_is_not_overruled_without_the_checks_that_failed_it(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(3)
    no_schema = {k: v for k, v in receipt(tasks, items_for(tasks), "failed").items()
                 if k != "schema"}
    history = write(tmp_path / "old.jsonl", no_schema,
                    receipt(tasks, items_for(tasks), "failed", validator="gone"))
    with pytest.raises(InvalidBatch, match="name validator\\(s\\) 'gone', not given here"):
        Ledger(ledger_at("ledger")).import_receipts(history)
    report = Ledger(ledger_at("ledger")).import_receipts(history, without_validator=True)
    assert [r["outcome"] for r in report["receipts"]] == ["unverified", "unverified"]
    assert report["items_admitted"] == 0


def test_export_then_import_carries_every_attempt_into_a_new_ledger(
        tmp_path: Path, ledger_at) -> None:
    calls = {"n": 0}

    def flaky(call: Any) -> str:
        calls["n"] += 1
        return "{broken" if calls["n"] == 1 else items_reply(call)

    first = Session(CallableProvider(flaky), ledger=ledger_at("a"))
    first.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2)
    exported = tmp_path / "a.jsonl"
    exported.write_text("".join(json.dumps(r) + "\n" for r in first.ledger.export_receipts()))
    assert first.ledger.import_receipts(exported)["skipped"] == 3  # same uids: already here

    second = Session(CallableProvider(flaky), ledger=ledger_at("b"))  # same source
    calls["n"] = 0
    report = second.ledger.import_receipts(exported)
    assert (report["admitted"], report["rejected"], report["recorded"]) == (2, 0, 1)
    assert second.ledger.cost_summary()["total"]["calls"] == 3
    again = second.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2)
    assert again.resolved and again.calls == 0 and calls["n"] == 0


def test_an_import_beside_a_live_batch_leaves_its_current_revision_and_what_is_owed_alone(
        tmp_path: Path, ledger_at) -> None:
    session = Session(CallableProvider(items_reply), ledger=ledger_at("ledger"))
    live = session.run_batch("review", review_tasks(4), LABEL_SCHEMA, identity=IDENTITY, pack=2)
    assert live.resolved
    other = review_tasks(3, case="gold-pair-090")
    history = write(tmp_path / "old.jsonl",
                    receipt(other, items_for(other, {0: "gold-pair-091"})))
    report = session.ledger.import_receipts(history)
    assert report["diagnostic"] == 1
    assert len(session.ledger.checkpoint("review")) == 4  # the live revision is still current
    assert session.evidence.minimum_exact_retry_calls == 0  # the diagnostic is not owed work
    summary = session.ledger.cost_summary("review")["batches"][0]
    assert (summary["calls"], summary["imported"], summary["rejected_returns"]) == (3, 1, 1)


def test_an_import_never_replaces_values_the_ledger_already_accepted(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(4)
    session = Session(CallableProvider(items_reply), ledger=ledger_at("ledger"))
    assert session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=4).resolved
    before = session.ledger.checkpoint("review")
    exported = session.ledger.export_receipts("review")[0]
    flipped = json.loads(exported["raw"])
    for item in flipped["items"]:  # a valid return for the same request, other answers
        item["verdict"] = "no_match" if item["verdict"] == "match" else "match"
    other = {**exported, "uid": "from-another-ledger", "raw": json.dumps(flipped)}
    same = {**exported, "uid": "a-second-copy"}
    report = session.ledger.import_receipts(write(tmp_path / "other.jsonl", other, same))
    assert [r["outcome"] for r in report["receipts"]] == ["duplicate", "duplicate"]
    assert "4 of this return's items differ" in report["receipts"][0]["reason"]
    assert report["items_admitted"] == 0
    assert session.ledger.checkpoint("review") == before  # the accepted values are kept
    assert session.ledger.cost_summary("review")["total"]["calls"] == 3  # both still count


def test_two_passing_receipts_for_one_request_in_a_file_admit_the_first(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(3)
    first = receipt(tasks, items_for(tasks))
    second = receipt(tasks, json.dumps({"items": [
        {k: t[k] for k in IDENTITY} | {"verdict": "no_match"} for t in tasks]}))
    ledger = Ledger(ledger_at("ledger"))
    report = ledger.import_receipts(write(tmp_path / "old.jsonl", first, second))
    assert [r["outcome"] for r in report["receipts"]] == ["admitted", "duplicate"]
    assert ledger.checkpoint("review") == {t["task_id"]: answer(t) for t in tasks}


def test_an_exported_receipt_whose_request_key_is_not_its_content_is_refused(
        tmp_path: Path, ledger_at) -> None:
    session = Session(CallableProvider(items_reply), ledger=ledger_at("a"))
    session.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2)
    one, two = session.ledger.export_receipts()
    forged = {**one, "request_key": two["request_key"]}  # would serve one's answers to two
    target = Ledger(ledger_at("b"))
    with pytest.raises(InvalidBatch, match="request_key .* is not the key of this receipt"):
        target.import_receipts(write(tmp_path / "forged.jsonl", forged))
    assert counts(ledger_at("b"))["attempts"] == 0


@pytest.mark.parametrize(("spoil", "message"), [
    (lambda line: line.replace('"cost": 0.00066', '"cost": 1e400'), "1e400 overflows a float"),
    (lambda line: line.replace('"input_tokens": 1200', '"input_tokens": ' + "9" * 30),
     "whole number of tokens below 2\\*\\*63"),
    (lambda line: line.replace('"input_tokens": 1200', '"input_tokens": 12.5'),
     "whole number of tokens"),
    (lambda line: line.replace('"at": "2026-03-01T10:00:00Z"', '"at": {"day": 1}'),
     "field 'at' must be a string"),
    (lambda line: line.replace('"model": "gpt-4o-mini"', '"model": 4'),
     "field 'model' must be a string"),
    (lambda line: line[:-1] + ', "deep": ' + "[" * 3000 + "]" * 3000 + "}",
     "nested too deeply"),
    (lambda line: line[:-1] + ', "mode": "value"}', "a 'value' receipt answers one task"),
    (lambda line: line[:-1] + ', "validator": ""}', "field 'validator' must be"),
])
def test_a_crafted_line_is_refused_naming_it_not_crashing(tmp_path: Path, spoil: Any,
                                                           message: str, ledger_at) -> None:
    tasks = review_tasks(2)
    good = json.dumps(receipt(tasks, items_for(tasks)))
    path = tmp_path / "crafted.jsonl"
    path.write_text(good + "\n" + spoil(good) + "\n")
    with pytest.raises(InvalidBatch, match=f"line 2: .*{message}"):
        Ledger(ledger_at("ledger")).import_receipts(path)
    assert counts(ledger_at("ledger"))["attempts"] == 0


@pytest.mark.parametrize(("spoil", "field"), [
    (lambda line: line.replace('"cost": 0.00066', '"cost": 1e-400'), "cost"),
    (lambda line: line.replace('"output_tokens": 800', '"output_tokens": -4.9e-325'),
     "output_tokens"),
    (lambda line: line.replace('"prompt": "Does', '"x": 1e-400, "prompt": "Does', 1),
     "tasks\\[0\\].x"),
    (lambda line: line.replace('"enum"', '"maximum": -1e-400, "enum"'),
     "schema.properties.verdict.maximum"),
    (lambda line: line.replace('"enum"', '"minimum": -1e400, "enum"'),
     "schema.properties.verdict.minimum"),
])
def test_a_number_a_float_cannot_hold_anywhere_in_a_line_is_refused_naming_its_field(
        tmp_path: Path, spoil: Any, field: str) -> None:
    """1e-400 is not zero: read as 0.0 it would pass a maximum of -1e-400, equal a return's 0,
    or record a cost of nothing. It is refused as 1e400 is, the line and field named."""
    tasks = review_tasks(2)
    good = json.dumps(receipt(tasks, items_for(tasks)))
    spoiled = spoil(good)
    assert spoiled != good
    path = tmp_path / "crafted.jsonl"
    path.write_text(good + "\n" + spoiled + "\n")
    with pytest.raises(InvalidBatch, match=f"line 2: field {field}: number -?[0-9.e-]+ "
                                           "(underflows|overflows) a float"):
        Ledger(tmp_path / "ledger.sqlite").import_receipts(path)
    assert counts(tmp_path / "ledger.sqlite")["attempts"] == 0


def test_a_bom_crlf_and_line_separators_inside_strings_read_as_json_lines(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(2)
    one = receipt(tasks, items_for(tasks), note="first\u2028line\x0cfeed\x1cgroup")
    other = receipt(review_tasks(2, case="gold-pair-090"),
                    items_for(review_tasks(2, case="gold-pair-090")))
    text = json.dumps(one, ensure_ascii=False) + "\r\n" + json.dumps(other) + "\r\n"
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    report = Ledger(ledger_at("ledger")).import_receipts(path)
    assert [(r["line"], r["outcome"]) for r in report["receipts"]] == [(1, "admitted"),
                                                                      (2, "admitted")]


def test_a_return_too_deep_or_out_of_range_is_rejected_as_json_not_a_crash(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(2)
    huge = items_for(tasks).replace('"verdict": "match"', '"verdict": "match", "score": 1e400', 1)
    history = write(tmp_path / "old.jsonl", receipt(tasks, "[" * 3000 + "]" * 3000),
                    receipt(tasks, huge))
    ledger = Ledger(ledger_at("ledger"))
    report = ledger.import_receipts(history)
    assert [r["outcome"] for r in report["receipts"]] == ["rejected", "rejected"]
    assert "nested deeper" in report["receipts"][0]["errors"][0]["message"]
    assert "overflows" in report["receipts"][1]["errors"][0]["message"]
    assert ledger.checkpoint("review") == {}


def test_two_processes_importing_one_file_into_a_new_ledger_record_each_line_once(
        tmp_path: Path) -> None:
    tasks = review_tasks(3)
    history = write(tmp_path / "old.jsonl", receipt(tasks, items_for(tasks, {0: "x"})),
                    receipt(tasks, items_for(tasks)))
    for trial in range(3):
        ledger = tmp_path / f"shared-{trial}.sqlite"
        command = [sys.executable, "-m", "batchjson", "import", str(history), "--ledger",
                   str(ledger), "--json"]
        runs = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outputs = [run.communicate(timeout=120) for run in runs]
        for run, (_, err) in zip(runs, outputs, strict=True):
            assert run.returncode in (0, 1) and "Traceback" not in err, err
        reports = [json.loads(out) for out, _ in outputs]
        assert sorted(r["skipped"] for r in reports) == [0, 2]  # one imported, one found it
        assert counts(ledger)["attempts"] == 2 and counts(ledger)["checkpoint"] == 3


def test_an_exported_receipt_with_a_schema_other_than_its_components_name_is_refused(
        tmp_path: Path, ledger_at) -> None:
    session = Session(CallableProvider(items_reply), ledger=ledger_at("a"))
    session.run_batch("labels", review_tasks(2), LABEL_SCHEMA, pack=2)
    (line,) = session.ledger.export_receipts()
    with_its_schema = {**line, "uid": "copy-1", "schema": LABEL_SCHEMA}
    loose = {**line, "uid": "copy-2", "schema": {"type": "object"}}  # would admit anything
    target = Ledger(ledger_at("b"))
    assert target.import_receipts(write(tmp_path / "ok.jsonl", with_its_schema))["admitted"] == 1
    with pytest.raises(InvalidBatch, match="its schema is not the one its components name"):
        target.import_receipts(write(tmp_path / "loose.jsonl", loose))


@pytest.mark.parametrize("claimed", ["OK", " ok ", "Success\n"])
def test_a_claimed_success_is_read_whatever_its_case_and_spacing(tmp_path: Path,
                                                                 claimed: str, ledger_at) -> None:
    tasks = review_tasks(2)
    no_schema = {k: v for k, v in receipt(tasks, items_for(tasks), claimed).items()
                 if k != "schema"}
    report = Ledger(ledger_at("l")).import_receipts(write(tmp_path / "o.jsonl", no_schema))
    assert report["receipts"][0]["outcome"] == "admitted"  # not 'unverified' as a failure claim


def test_importing_a_ledger_file_says_to_merge_it(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    Ledger(other).close()
    done = cli("import", str(other), "--ledger", str(tmp_path / "mine.sqlite"), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"is a SQLite file, not JSON Lines: to bring another ledger in, merge it " \
           f"(batchjson merge {other})" in done.stderr
    assert not (tmp_path / "mine.sqlite").exists()


def test_an_identity_field_whose_name_holds_a_comma_survives_export_and_import(
        tmp_path: Path, ledger_at) -> None:
    tasks = [{"task_id": f"t{i}", "prompt": "p", "a,b": f"x{i}", "a": 0} for i in range(2)]

    def reply(call: Any) -> str:
        return json.dumps({"items": [{"task_id": t["task_id"], "a,b": t["a,b"], "v": 1}
                                     for t in call.tasks]})

    first = Session(CallableProvider(reply), ledger=ledger_at("a"))
    assert first.run_batch("c", tasks, {"type": "object"}, identity=["task_id", "a,b"],
                           pack=2).resolved
    (line,) = first.ledger.export_receipts()
    assert line["identity"] == ["task_id", "a,b"]
    report = Ledger(ledger_at("b")).import_receipts(write(tmp_path / "c.jsonl", line))
    assert report["admitted"] == 1 and report["items_admitted"] == 2


def test_the_human_import_report_groups_the_expected_and_details_the_rest(
        tmp_path: Path) -> None:
    tasks = review_tasks(2)
    lines = [receipt(tasks, items_for(tasks), note=str(n)) for n in range(30)]
    lines[7] = receipt(tasks, items_for(tasks, {1: "gold-pair-079"}), note="swap")
    history = write(tmp_path / "old.jsonl", *lines)
    ledger = str(tmp_path / "ledger.sqlite")
    first = cli("import", str(history), "--ledger", ledger, cwd=tmp_path).stdout.splitlines()
    assert first[1] == "  ADMITTED: 1 line(s) (line 1): every check passed"
    assert any("line 8:" in line and line.endswith("DIAGNOSTIC") for line in first)
    assert sum(line.endswith("DUPLICATE") for line in first) == 19  # 20 detailed in all
    assert first[-1] == "  ... and 9 more line(s) not admitted (--json lists every line)"
    again = cli("import", str(history), "--ledger", ledger, cwd=tmp_path).stdout.splitlines()
    assert again[1:] == ["  SKIPPED: 30 line(s) (lines 1-30): already imported"]


def test_an_exported_call_that_was_in_flight_here_completes_its_receipt(
        tmp_path: Path, ledger_at) -> None:
    there = Session(CallableProvider(items_reply), ledger=ledger_at("there"))
    assert there.run_batch("labels", review_tasks(2), LABEL_SCHEMA, pack=2).resolved
    (done,) = there.ledger.export_receipts()
    early = {**done, "status": "in_flight", "raw": None, "input_tokens": None,
             "output_tokens": None, "finished_at": None}
    here = Ledger(ledger_at("here"))
    assert here.import_receipts(write(tmp_path / "early.jsonl", early))["recorded"] == 1
    report = here.import_receipts(write(tmp_path / "late.jsonl", done))
    (line,) = report["receipts"]
    assert line["outcome"] == "admitted"
    assert "completes the receipt of this call" in line["reason"]
    total = here.cost_summary()["total"]
    assert (total["calls"], total["accepted_returns"], total["abandoned"]) == (1, 1, 0)
    assert len(here.checkpoint("labels")) == 2


def test_an_import_from_inside_a_running_loop_rechecks_like_any_other(
        tmp_path: Path, ledger_at) -> None:
    """A notebook cell runs inside the kernel's event loop: importing there must still judge
    every line (a nested loop is not allowed, so the recheck runs on a thread of its own)."""
    import asyncio

    tasks = review_tasks(3)
    history = write(tmp_path / "old.jsonl",
                    receipt(tasks, items_for(tasks, {0: "gold-pair-079"}), status="ok"),
                    receipt(tasks, items_for(tasks), status="ok"))
    ledger = Ledger(ledger_at("ledger"))

    async def cell() -> dict:
        return ledger.import_receipts(history)

    report = asyncio.run(cell())
    assert [r["outcome"] for r in report["receipts"]] == ["diagnostic", "admitted"]
    assert len(ledger.checkpoint("review")) == 3


def test_a_merge_admits_no_stored_value_its_receipts_raw_return_does_not_give(
        tmp_path: Path, ledger_at) -> None:
    tasks = review_tasks(4)
    edited, honest = tmp_path / "edited.sqlite", tmp_path / "honest.sqlite"
    for path in (edited, honest):
        Session(CallableProvider(items_reply, source="m"), ledger=path).run_batch(
            "review", tasks, LABEL_SCHEMA, pack=2)
    db = sqlite3.connect(edited)  # by hand: a no_match turned match, a task no attempt covered
    flipped, task_id = db.execute("SELECT attempt_id, task_id FROM checkpoint WHERE item LIKE "
                                  "'%no_match%' ORDER BY task_id LIMIT 1").fetchone()
    db.execute("UPDATE checkpoint SET item = ? WHERE task_id = ?", ('{"verdict": "match"}',
                                                                     task_id))
    db.execute("INSERT INTO checkpoint(batch_id, request_key, task_id, attempt_id, item, "
               "committed_at) SELECT batch_id, request_key, 'never-asked', attempt_id, item, "
               "committed_at FROM checkpoint WHERE attempt_id != ? LIMIT 1", (flipped,))
    db.commit()
    db.close()

    target = Session(CallableProvider(items_reply, source="ours"), ledger=ledger_at("target"))
    target.run_batch("review", tasks, LABEL_SCHEMA, pack=2)
    ours = target.ledger.checkpoint("review")
    report = target.ledger.merge(edited)
    assert target.ledger.checkpoint("review") == ours  # the target's own values untouched
    reasons = " ".join(r["reason"] for r in report["not_admitted"])
    assert len(report["not_admitted"]) == 2 and report["added"]["checkpoint_rows"] == 0
    assert f"the value stored for task {task_id!r} is not what its raw return gives" in reasons
    assert "'never-asked', which its request did not ask" in reasons

    fresh = Session(CallableProvider(items_reply, source="m"), ledger=ledger_at("fresh"))
    assert fresh.ledger.merge(edited)["added"]["checkpoint_rows"] == 0
    assert fresh.ledger.checkpoint("review") == {}  # nothing edited admitted: still owed
    assert fresh.run_batch("review", tasks, LABEL_SCHEMA, pack=2).calls == 2
    done = cli("merge", str(edited), "--ledger", str(tmp_path / "cli.sqlite"), cwd=tmp_path)
    assert done.returncode == 1 and "NOT ADMITTED: batch 'review'" in done.stdout

    whole = Ledger(ledger_at("whole"))
    merged = whole.merge(honest)
    assert merged["not_admitted"] == [] and merged["added"]["checkpoint_rows"] == 4
    assert whole.checkpoint("review") == Ledger(honest).checkpoint("review")


class Verdict(BaseModel):
    verdict: Literal["match", "no_match"]


@pytest.mark.parametrize("schema", [LABEL_SCHEMA, Verdict], ids=["json-schema", "pydantic"])
def test_an_exported_return_edited_past_its_schema_is_not_admitted_on_import(
        schema: Any, tmp_path: Path, ledger_at) -> None:
    """batchjson's own export carries the schema its batch was judged by, so an import
    rechecks every item against it: a raw return edited to an answer the schema never
    allowed ("maybe") is rejected, its pack-mates with it, while the honest receipts admit."""
    first = Session(CallableProvider(items_reply), ledger=ledger_at("a"))
    first.run_batch("labels", review_tasks(4), schema, pack=2)
    receipts = first.ledger.export_receipts()
    assert all(r["schema"]["properties"]["verdict"]["enum"] == ["match", "no_match"]
               for r in receipts)
    raw = json.loads(receipts[0]["raw"])
    raw["items"][0]["verdict"] = "maybe"
    receipts[0]["raw"] = json.dumps(raw)
    exported = write(tmp_path / "edited.jsonl", *receipts)
    second = Session(CallableProvider(items_reply), ledger=ledger_at("b"))
    report = second.ledger.import_receipts(exported)
    assert (report["admitted"], report["rejected"]) == (1, 1)
    assert sorted(second.ledger.checkpoint("labels")) == sorted(
        t["task_id"] for t in review_tasks(4)[2:])


def _rejects_maybe(item: Any, task: Any) -> None:
    if item["verdict"] == "maybe":
        raise ValueError("maybe is no verdict")


@pytest.mark.parametrize("stripped", ["schema", "validator"])
def test_an_exported_receipt_stripped_of_its_schema_or_validator_is_refused_on_import(
        stripped: str, tmp_path: Path, ledger_at) -> None:
    """An export names the schema and the validator its batch was judged by: a receipt with
    one removed (so that an edited answer would pass unchecked) is refused whole, before
    anything is written, and the edited answer is never evidence."""
    first = Session(CallableProvider(items_reply), ledger=ledger_at("a"))
    first.run_batch("labels", review_tasks(2), LABEL_SCHEMA, pack=2, validator=_rejects_maybe)
    receipt = first.ledger.export_receipts()[0]
    raw = json.loads(receipt["raw"])
    raw["items"][0]["verdict"] = "maybe"
    receipt |= {"raw": json.dumps(raw), stripped: None}
    receipt["components"].pop("schema_doc") if stripped == "schema" else None
    second = Session(CallableProvider(items_reply), ledger=ledger_at("b"))
    with pytest.raises(InvalidBatch, match="the receipt was altered"):
        second.ledger.import_receipts(write(tmp_path / "stripped.jsonl", receipt),
                                      validators={"_rejects_maybe": _rejects_maybe})
    assert second.ledger.checkpoint("labels") == {}
