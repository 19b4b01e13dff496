"""The command line scripts rely on: every subcommand run as a subprocess, as a script would."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from batchjson import CallableProvider, Ledger, Session
from batchjson import _cli as cli_module
from batchjson._errors import InvalidBatch, ProviderError
from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

SUBCOMMANDS = ("demo", "status", "receipts", "values", "export", "import", "merge", "advise",
               "forget")


def bj(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory where `batchjson demo` ran with its defaults."""
    where = tmp_path_factory.mktemp("demo")
    done = bj("demo", cwd=where)
    assert done.returncode == 0, done.stderr
    assert (where / ".batchjson" / "ledger.sqlite").exists()  # the notebook default
    (where / "demo.out").write_text(done.stdout)
    (where / "demo.err").write_text(done.stderr)
    return where


def test_demo_prints_a_readable_summary_that_ends_with_what_to_run_next(demo_dir: Path) -> None:
    out = (demo_dir / "demo.out").read_text()
    assert "<BatchResult" not in out and "Evidence(" not in out  # no reprs
    assert "first run   resolved: 60/60 tasks answered; 17 call(s): 12 returns accepted" in out
    assert "second run  resolved: 60/60 tasks answered; 0 call(s)" in out
    assert "identity: " in out and "the request has" in out
    tail = out.strip().splitlines()[-5:]
    assert tail[0] == "next:" and tail[1].split()[1] == "status"
    assert tail[1].split()[0].endswith("batchjson")  # the command as this shell can run it
    assert (demo_dir / "demo.err").read_text() == ""  # no progress bar off a TTY


def test_status_after_the_demo_reads_the_same_default_ledger(demo_dir: Path) -> None:
    human = bj("status", cwd=demo_dir)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == "ledger .batchjson/ledger.sqlite"
    assert any(line.split()[:3] == ["review", "60", "60"] for line in lines)
    assert "$0.0" in human.stdout and "e-0" not in human.stdout
    data = json.loads(bj("status", "review", "--json", cwd=demo_dir).stdout)
    (review,) = data["batches"]
    assert review["usable_results"] == 60 and data["unresolved_requests"] == 0
    assert review["calls"] == review["accepted_returns"] + review["rejected_returns"]
    assert data["total"]["calls"] == review["calls"]


def test_receipts_are_numbered_1_to_n_per_batch_with_json_for_scripts(demo_dir: Path) -> None:
    every = json.loads(bj("receipts", "review", "--json", cwd=demo_dir).stdout)
    assert [r["number"] for r in every] == list(range(1, len(every) + 1))
    failed = json.loads(bj("receipts", "review", "--failed", "--json", cwd=demo_dir).stdout)
    assert failed and all(r["status"] != "accepted" for r in failed)
    assert {r["number"] for r in failed} < {r["number"] for r in every}
    assert all(r["raw"] is None for r in failed)
    raw = json.loads(bj("receipts", "review", "--failed", "--raw", "--json",
                        cwd=demo_dir).stdout)
    assert all(isinstance(r["raw"], str) for r in raw)
    human = bj("receipts", "review", "--failed", cwd=demo_dir).stdout
    assert human.splitlines()[0].split()[:3] == ["#", "rev", "kind"]
    assert "#627" not in human and "cost=" not in human and "$0.000" in human


def test_values_come_out_as_jsonl_csv_or_json(demo_dir: Path) -> None:
    lines = bj("values", "review", cwd=demo_dir).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 60 and set(rows[0]) == {"task_id", "value"}
    table = list(csv.DictReader(io.StringIO(bj("values", "review", "--csv",
                                               cwd=demo_dir).stdout)))
    assert len(table) == 60 and set(table[0]) == {"task_id", "verdict", "confidence"}
    by_id = json.loads(bj("values", "review", "--json", cwd=demo_dir).stdout)
    assert by_id[table[0]["task_id"]]["verdict"] == table[0]["verdict"]


@pytest.mark.parametrize("text", ['=HYPERLINK("http://evil.example/")', "+1+cmd|' /C calc'!A0",
                                  "-2+3", "@SUM(A1:A9)", "\t=1+1"])
def test_csv_cells_a_spreadsheet_would_run_as_formulas_are_written_as_text(
        tmp_path: Path, text: str) -> None:
    """OWASP's CSV-injection rule: a cell starting with = + - @ tab or CR gets a leading ',
    in the task_id, an identity field and the answer alike; numbers stay numbers."""
    def reply(call):
        return json.dumps({"items": [{"task_id": text, "case_id": text, "verdict": text,
                                      "confidence": -0.5}]})

    session = Session(CallableProvider(reply, source="csv"), ledger=tmp_path / "l.sqlite")
    tasks = [{"task_id": text, "case_id": text, "prompt": "q"}]
    schema = {"type": "object", "properties": {"verdict": {"type": "string"},
                                               "confidence": {"type": "number"}}}
    assert session.run_batch("b", tasks, schema, identity="task_id,case_id").resolved
    session.close()
    out = bj("values", "b", "--csv", "--identity", "--ledger", "l.sqlite", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    [row] = list(csv.DictReader(io.StringIO(out.stdout)))
    assert row == {"task_id": "'" + text, "case_id": "'" + text, "verdict": "'" + text,
                   "confidence": "-0.5"}
    assert cli_module._cell("\r=1+1") == "'\r=1+1"  # a text pipe would turn CR into a newline


def test_export_import_merge_and_advise_round_trip(demo_dir: Path, tmp_path: Path) -> None:
    whole = json.loads(bj("export", cwd=demo_dir).stdout)
    jsonl = bj("export", "--jsonl", cwd=demo_dir).stdout.splitlines()
    assert len(whole["receipts"]) == len(jsonl) > 0
    exported = tmp_path / "review.jsonl"
    exported.write_text("\n".join(jsonl) + "\n")
    fresh = tmp_path / "fresh.sqlite"
    imported = bj("import", str(exported), "--ledger", str(fresh), "--json", *DEMO_VALIDATOR,
                  cwd=tmp_path)
    report = json.loads(imported.stdout)
    swapped = [r for r in whole["receipts"]
                if any(e["type"] == "identity" for e in r["errors"])]
    assert report["items_admitted"] == 60 and report["recorded"] >= len(swapped) > 0
    assert report["diagnostic"] == 0  # its rejected returns are recorded as it judged them
    assert imported.returncode == 0, imported.stdout
    merged = bj("merge", str(demo_dir / ".batchjson" / "ledger.sqlite"), "--ledger",
                str(tmp_path / "merged.sqlite"), "--json", cwd=tmp_path)
    assert merged.returncode == 0 and json.loads(merged.stdout)["added"]["attempts"] == len(
        jsonl)
    advice = bj("advise", "review", "--json", cwd=demo_dir)
    assert advice.returncode == 0, advice.stderr
    said = json.loads(advice.stdout)
    best = said["recommended"]
    assert best["pack"] >= 1 and best["cost_per_usable_result"] > 0
    human = bj("advise", "review", cwd=demo_dir).stdout
    assert " ".join(human.split()).endswith(said["verdict"])  # what it advises, said last


DEMO_VALIDATOR = ("--validator", "batchjson._cli:_demo_check")


def test_batchjsons_own_export_imports_with_exit_0_only_after_its_validator_is_rerun(
        demo_dir: Path, tmp_path: Path) -> None:
    exported = tmp_path / "out.json"
    exported.write_text(bj("export", cwd=demo_dir).stdout)
    unnamed = bj("import", str(exported), "--ledger", str(tmp_path / "a.sqlite"), cwd=tmp_path)
    assert unnamed.returncode == 2 and "'_demo_check', not given here" in unnamed.stderr
    assert "--validator NAME=module:function" in unnamed.stderr and "--without-validator" in (
        unnamed.stderr)
    (tmp_path / "refuse_all.py").write_text(
        "def check(item, task):\n    raise ValueError('refused by the given validator')\n")
    refusing = bj("import", str(exported), "--ledger", str(tmp_path / "b.sqlite"), "--json",
                  "--validator", "_demo_check=refuse_all:check", cwd=tmp_path)
    assert json.loads(refusing.stdout)["items_admitted"] == 0  # the validator given was run
    assert refusing.returncode == 1
    opted_out = bj("import", str(exported), "--ledger", str(tmp_path / "c.sqlite"), "--json",
                   "--without-validator", cwd=tmp_path)
    report = json.loads(opted_out.stdout)
    assert report["items_admitted"] == 0 and report["unverified"] > 0
    assert Ledger(tmp_path / "c.sqlite").checkpoint("review") == {}  # never evidence
    assert "unverified" in bj("export", "--ledger", str(tmp_path / "c.sqlite"),
                              cwd=tmp_path).stdout  # shown and exported
    clean = bj("import", str(exported), "--ledger", str(tmp_path / "d.sqlite"), *DEMO_VALIDATOR,
               cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr


@pytest.mark.parametrize("form", [[], ["--json"], ["--jsonl"]])
def test_what_export_prints_in_every_format_imports_into_a_fresh_ledger(
        demo_dir: Path, tmp_path: Path, form: list[str]) -> None:
    """`batchjson export > file; batchjson import file` round-trips whichever format export
    printed: the default JSON document as well as JSON Lines."""
    exported = tmp_path / "out.json"
    exported.write_text(bj("export", *form, cwd=demo_dir).stdout)
    fresh = tmp_path / "fresh.sqlite"
    imported = bj("import", str(exported), "--ledger", str(fresh), "--json", *DEMO_VALIDATOR,
                  cwd=tmp_path)
    report = json.loads(imported.stdout)
    assert report["items_admitted"] == 60 and report["recorded"] > 0, imported.stderr
    assert report["numbered"] == ("line" if form == ["--jsonl"] else "receipt")
    assert Ledger(fresh).checkpoint("review") == Ledger(
        demo_dir / ".batchjson" / "ledger.sqlite").checkpoint("review")
    again = bj("import", str(exported), "--ledger", str(fresh), *DEMO_VALIDATOR, cwd=tmp_path)
    assert again.returncode == 0 and "SKIPPED" in again.stdout  # each receipt imported once
    if not form:  # a receipt of the document is named by its place when refused
        document = json.loads(exported.read_text())
        document["receipts"][2]["cost"] = "@"
        exported.write_text(json.dumps(document, indent=2).replace('"@"', "1e-400"))
        refused = bj("import", str(exported), "--ledger", str(tmp_path / "x.sqlite"),
                     cwd=tmp_path)
        assert refused.returncode == 2
        assert "receipt 3: field cost: number 1e-400 underflows a float" in refused.stderr


def test_exit_codes_are_as_documented(demo_dir: Path, tmp_path: Path) -> None:
    not_sqlite = tmp_path / "notes.json"
    not_sqlite.write_text('{"a": 1}')
    other_db = tmp_path / "other.db"
    sqlite3.connect(other_db).execute("CREATE TABLE t (x)").connection.close()
    bad_import = tmp_path / "bad.jsonl"
    bad_import.write_text('{"batch": "x"}\n')
    cases = [
        (["status", "--ledger", str(tmp_path / "nope.sqlite")], 3, "no ledger at"),
        (["status", "--ledger", str(not_sqlite)], 3, "is not a SQLite file"),
        (["status", "--ledger", str(tmp_path)], 3, "is a directory"),
        (["receipts", "review", "--ledger", str(other_db)], 3, "not a batchjson ledger"),
        (["merge", str(other_db), "--ledger", str(tmp_path / "m.sqlite")], 3,
         "not a batchjson ledger"),
        (["status", "reveiw"], 2, "no batch named 'reveiw' in this ledger (batches: review)"),
        (["values", "nope"], 2, "no batch named 'nope'"),
        (["advise", "review", "--replays", "-1"], 2, "must be a whole number"),
        (["import", str(bad_import), "--ledger", str(tmp_path / "b.sqlite")], 2,
         "line 1: field 'tasks' must be a list"),
        (["import", str(tmp_path / "none.jsonl"), "--ledger", str(tmp_path / "i.sqlite")], 2,
         "no receipts file at"),
        (["frobnicate"], 2, "invalid choice"),
        ([], 2, "required"),
    ]
    for argv, code, message in cases:
        done = bj(*argv, cwd=demo_dir)
        assert done.returncode == code, (argv, done.returncode, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
    tables = sqlite3.connect(other_db).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("t",)]  # a wrong file is never turned into a ledger
    for never_made in ("nope.sqlite", "m.sqlite", "i.sqlite", "b.sqlite"):
        assert not (tmp_path / never_made).exists()  # refused before a ledger was created


def test_every_subcommand_documents_each_option(tmp_path: Path) -> None:
    for name in SUBCOMMANDS:
        done = bj(name, "--help", cwd=tmp_path)
        assert done.returncode == 0
        options = [line.strip() for line in done.stdout.splitlines()
                   if line.strip().startswith("--")]
        assert any(o.startswith("--ledger PATH") for o in options), name
        assert any(o.startswith("--json") for o in options), name
        for option in options:
            assert len(option.split(None, 2)) >= 2, (name, option)  # a help text on each line
    serve = bj("serve", "--help", cwd=tmp_path)
    assert serve.returncode == 0 and "--port" in serve.stdout
    top = bj("--help", cwd=tmp_path).stdout
    assert "Exit codes" in top and all(name in top for name in SUBCOMMANDS)


def test_a_closed_pipe_is_quiet(demo_dir: Path) -> None:
    for argv in (["export", "--jsonl"], ["receipts", "review", "--raw"]):
        proc = subprocess.Popen([sys.executable, "-m", "batchjson", *argv], cwd=demo_dir,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.readline()
        proc.stdout.close()  # like `| head -1`
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0 and err == "", err


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    def interrupted(args: object, out: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "cmd_demo", interrupted)
    assert cli_module.main(["demo", "--ledger", str(tmp_path / "d.sqlite")]) == 130
    err = capsys.readouterr().err
    assert err.startswith("batchjson: interrupted") and "Traceback" not in err


def test_demo_never_clears_a_ledger_that_holds_other_batches(tmp_path: Path) -> None:
    ledger = tmp_path / "work.sqlite"
    Session(CallableProvider(items_reply), ledger=ledger).run_batch(
        "labels", review_tasks(1), LABEL_SCHEMA)
    refused = bj("demo", "--ledger", str(ledger), cwd=tmp_path)
    assert refused.returncode == 2
    assert "holds batches other than the demo's (labels)" in refused.stderr
    assert Ledger(ledger).batch_names() == ["labels"]
    again = bj("demo", "--ledger", str(tmp_path / "d.sqlite"), "--json", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["second"]["calls"] == 0
    assert bj("demo", "--ledger", str(tmp_path / "d.sqlite"), cwd=tmp_path).returncode == 0


def test_status_ends_with_what_to_run_next_for_the_batch_that_needs_a_look(
        demo_dir: Path, tmp_path: Path) -> None:
    tail = bj("status", cwd=demo_dir).stdout.strip().splitlines()[-4:]
    assert tail[0] == "next:"
    assert [line.split()[1:3] for line in tail[1:]] == [
        ["receipts", "review"], ["values", "review"], ["advise", "review"]]
    ledger = tmp_path / "down.sqlite"
    session = Session(CallableProvider(lambda call: "{broken"), ledger=ledger, repairs=0,
                      replays=0)
    session.run_batch("labels", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    session.close()
    owed = bj("status", "--ledger", str(ledger), cwd=tmp_path).stdout
    assert "next:\n  re-run batch 'labels'" in owed
    assert f"batchjson receipts labels --failed --ledger {ledger}" in owed  # path or bare name


def test_costs_of_unpriced_models_print_as_unknown_never_as_zero(tmp_path: Path) -> None:
    ledger = tmp_path / "unpriced.sqlite"
    session = Session(CallableProvider(items_reply), ledger=ledger)  # no usage, no model price
    session.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2)
    session.close()
    human = bj("status", "--ledger", str(ledger), cwd=tmp_path).stdout
    assert "unknown" in human and "$0.00" not in human
    assert "so their cost is unknown (not zero)" in " ".join(human.split())
    total = json.loads(bj("status", "--ledger", str(ledger), "--json", cwd=tmp_path).stdout)
    assert total["total"]["cost_is_lower_bound"] and total["total"]["unpriced_calls"] == 2


def test_a_ledger_sqlite_cannot_write_is_exit_3_without_a_traceback(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite"
    Session(CallableProvider(items_reply), ledger=ledger).run_batch(
        "labels", review_tasks(2), LABEL_SCHEMA)
    db = sqlite3.connect(ledger)
    db.execute("CREATE TRIGGER no_imports BEFORE INSERT ON attempts BEGIN "
               "SELECT RAISE(ABORT, 'attempt table is read-only'); END")
    db.commit()
    db.close()
    receipts = tmp_path / "old.jsonl"
    tasks = review_tasks(1, case="gold-pair-090")
    raw = json.dumps({"items": [{"task_id": t["task_id"]} | answer(t) for t in tasks]})
    receipts.write_text(json.dumps({"batch": "b", "tasks": tasks, "status": "ok",
                                    "identity": ["task_id"], "raw": raw}) + "\n")
    done = bj("import", str(receipts), "--ledger", str(ledger), cwd=tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert "attempt table is read-only" in done.stderr


def test_merge_names_the_other_file_when_it_is_missing_or_a_directory(tmp_path: Path) -> None:
    for other in (tmp_path / "missing.sqlite", tmp_path):
        done = bj("merge", str(other), "--ledger", str(tmp_path / "mine.sqlite"), cwd=tmp_path)
        assert done.returncode == 3 and "Traceback" not in done.stderr
        assert "--ledger" not in done.stderr and "ledger to merge" in done.stderr
    assert not (tmp_path / "mine.sqlite").exists()


def _option_entries(help_text: str) -> dict[str, str]:
    """option spec -> its help text, from argparse's "options:" section."""
    entries: dict[str, str] = {}
    spec = None
    for line in help_text.split("options:", 1)[1].splitlines():
        if line.startswith("  -"):
            spec, _, text = line.strip().partition("  ")
            entries[spec] = text.strip()
        elif spec and line.startswith("        "):
            entries[spec] = (entries[spec] + " " + line.strip()).strip()
    return entries


def test_serve_help_is_batchjson_serve_with_a_line_of_help_per_option(tmp_path: Path) -> None:
    done = bj("serve", "--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: batchjson serve")
    entries = _option_entries(done.stdout)
    assert {"--host HOST", "--retry-after RETRY_AFTER", "--seed SEED"} <= set(entries)
    assert all(entries.values()), [spec for spec, text in entries.items() if not text]
    for name in SUBCOMMANDS:
        entries = _option_entries(bj(name, "--help", cwd=tmp_path).stdout)
        assert all(entries.values()), (name, entries)


def test_receipts_failed_of_a_clean_batch_says_every_attempt_was_accepted(
        tmp_path: Path) -> None:
    ledger = tmp_path / "clean.sqlite"
    Session(CallableProvider(items_reply), ledger=ledger).run_batch(
        "labels", review_tasks(2), LABEL_SCHEMA)
    done = bj("receipts", "labels", "--failed", "--ledger", str(ledger), cwd=tmp_path)
    assert done.returncode == 0
    assert done.stdout.strip() == ("no failed receipts for batch 'labels': every attempt was "
                                   "accepted")


def test_ctrl_c_during_an_import_rolls_it_back_and_says_nothing_was_imported(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from batchjson._session import ledger as recovery

    tasks = review_tasks(2)
    raw = json.dumps({"items": [{"task_id": t["task_id"]} | answer(t) for t in tasks]})
    line = {"batch": "b", "tasks": tasks, "status": "ok", "identity": ["task_id"], "raw": raw}
    receipts = tmp_path / "old.jsonl"
    receipts.write_text(json.dumps(line) + "\n" + json.dumps({**line, "batch": "c"}) + "\n")
    real = recovery._import_line
    seen: list[int] = []

    def interrupted_on_the_second(*args: object, **kwargs: object) -> object:
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(recovery, "_import_line", interrupted_on_the_second)
    ledger = tmp_path / "ledger.sqlite"
    assert cli_module.main(["import", str(receipts), "--ledger", str(ledger)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == ("batchjson: interrupted; nothing was imported (it is one "
                           "transaction), run it again")
    db = sqlite3.connect(ledger)
    assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] == 0
    db.close()


def test_escape_sequences_in_a_return_or_a_batch_name_never_reach_the_terminal(
        tmp_path: Path) -> None:
    tasks = review_tasks(2)
    hostile = "\x1b]0;owned\x07\x1b[2J"
    raw = json.dumps({"items": [{"task_id": t["task_id"], "verdict": hostile} for t in tasks]},
                     ensure_ascii=False)
    line = {"batch": "evil\x1b[31m\u202e", "tasks": tasks, "status": "ok",
            "identity": ["task_id"], "raw": raw, "schema": LABEL_SCHEMA}
    receipts = tmp_path / "old.jsonl"
    receipts.write_text(json.dumps(line, ensure_ascii=False) + "\n")
    ledger = str(tmp_path / "ledger.sqlite")
    outputs = [bj("import", str(receipts), "--ledger", ledger, cwd=tmp_path).stdout,
               bj("status", "--ledger", ledger, cwd=tmp_path).stdout,
               bj("receipts", line["batch"], "--raw", "--ledger", ledger, cwd=tmp_path).stdout]
    for out in outputs:
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "evil\\x1b[31m\\u202e" in outputs[1]
    assert "\\x1b]0;owned\\x07\\x1b[2J" in outputs[2]  # shown, as text, in the raw return
    data = json.loads(bj("receipts", line["batch"], "--raw", "--json", "--ledger", ledger,
                         cwd=tmp_path).stdout)
    assert data[0]["raw"] == raw  # scripts still get the exact text


def test_a_newline_in_a_batch_name_cannot_forge_a_row_of_the_status_table(
        tmp_path: Path) -> None:
    """A run refuses such a name; one imported from another system's receipts is shown
    escaped, so it cannot add a row."""
    ledger = tmp_path / "ledger.sqlite"
    forged = "x\n  total      99      99"
    with pytest.raises(InvalidBatch, match="control character"):
        Session(CallableProvider(items_reply), ledger=ledger).run_batch(
            forged, review_tasks(2), LABEL_SCHEMA)
    tasks = review_tasks(2)
    raw = json.dumps({"items": [{"task_id": t["task_id"], "verdict": "match"} for t in tasks]})
    line = {"batch": forged, "tasks": tasks, "status": "ok", "identity": ["task_id"],
            "raw": raw, "schema": LABEL_SCHEMA}
    receipts = tmp_path / "old.jsonl"
    receipts.write_text(json.dumps(line) + "\n")
    bj("import", str(receipts), "--ledger", str(ledger), cwd=tmp_path)
    out = bj("status", "--ledger", str(ledger), cwd=tmp_path).stdout
    assert "x\\n  total      99      99" in out
    assert [line.split()[0] for line in out.splitlines() if line.strip().startswith("total")] \
        == ["total"]


def test_next_steps_name_a_batchjson_the_shell_can_run(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "batchjson"
    if not script.exists():
        pytest.skip("the batchjson script is not installed beside this python")
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}  # the venv is not activated
    done = subprocess.run([sys.executable, "-m", "batchjson", "demo"], cwd=tmp_path, env=bare,
                          capture_output=True, text=True, timeout=120)
    commands = [line.split()[0] for line in done.stdout.split("next:")[1].splitlines()
                if line.strip()]
    assert commands and all(c == str(script.absolute()) for c in commands)
    activated = {**bare, "PATH": f"{script.parent}:/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "batchjson", "status"], cwd=tmp_path,
                          env=activated, capture_output=True, text=True, timeout=120)
    assert "\n  batchjson receipts review --failed" in done.stdout


def test_demo_never_clears_a_batch_of_ones_own_that_is_also_called_review(
        tmp_path: Path) -> None:
    ledger = tmp_path / ".batchjson" / "ledger.sqlite"  # the notebook default
    mine = Session(CallableProvider(items_reply), ledger=ledger)
    assert mine.run_batch("review", review_tasks(3), LABEL_SCHEMA).resolved
    mine.close()
    refused = bj("demo", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "holds a batch 'review' that is not the demo's" in refused.stderr
    assert len(Ledger(ledger).checkpoint("review")) == 3  # nothing was cleared


def test_two_output_formats_at_once_is_a_usage_error(demo_dir: Path) -> None:
    for argv in (["values", "review", "--csv", "--json"], ["export", "--jsonl", "--json"]):
        done = bj(*argv, cwd=demo_dir)
        assert done.returncode == 2 and done.stdout == ""
        assert "ask for two formats: give one" in done.stderr


def test_status_fits_a_terminal_leaving_out_columns_that_are_zero_everywhere(
        demo_dir: Path, tmp_path: Path) -> None:
    out = bj("status", cwd=demo_dir).stdout
    assert max(len(line) for line in out.splitlines() if "batchjson " not in line) <= 100
    table_part = out.split("\n  no ")[0]
    assert "provider err" not in table_part and "abandoned" not in table_part
    assert "  no provider errors, no abandoned calls, no calls in flight" in out
    ledger = tmp_path / "down.sqlite"

    def down(call: object) -> str:
        raise ProviderError("service unavailable", retryable=False)

    session = Session(CallableProvider(down), ledger=ledger)
    session.run_batch("labels", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    session.close()
    out = bj("status", "--ledger", str(ledger), cwd=tmp_path).stdout
    header = out.splitlines()[1].split()
    assert "err" in header and header.index("err") == header.index("provider") + 1
    assert json.loads(bj("status", "--json", "--ledger", str(ledger), cwd=tmp_path).stdout)[
        "total"]["abandoned"] == 0  # scripts still get every figure


def test_merge_says_what_it_added_and_nothing_new_the_second_time(
        demo_dir: Path, tmp_path: Path) -> None:
    other = str(demo_dir / ".batchjson" / "ledger.sqlite")
    mine = str(tmp_path / "mine.sqlite")
    first = bj("merge", other, "--ledger", mine, cwd=tmp_path).stdout.strip()
    assert ": added 1 batches, 1 revisions, 12 requests, 17 attempts, 60 checkpoint rows, 1 " \
        "validators; 0 attempt(s) were already here" in first  # no "0 imports"
    second = bj("merge", other, "--ledger", mine, cwd=tmp_path).stdout.strip()
    assert second.endswith(f"into {mine}: nothing new; 17 attempt(s) were already here")


def test_receipts_say_which_provider_and_model_answered(tmp_path: Path) -> None:
    ledger = tmp_path / "l.sqlite"
    session = Session(CallableProvider(items_reply, model="reviewer-7b"), ledger=ledger)
    session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    session.close()
    listed = json.loads(bj("receipts", "r", "--json", "--ledger", str(ledger),
                           cwd=tmp_path).stdout)
    assert {(r["provider"], r["model"]) for r in listed} == {("callable", "reviewer-7b")}
    assert all(r["source"] for r in listed)  # the answer source the request key covers
    human = bj("receipts", "r", "--ledger", str(ledger), cwd=tmp_path).stdout
    assert "callable/reviewer-7b" in human


def _check_with_a_pasted_key(item, task):
    return item["lable"] == "sk-proj-a1b2c3d4e5f6g7h8i9j0k1"


def test_receipts_failed_shows_a_crashed_validators_own_frames_with_keys_masked(
        tmp_path: Path) -> None:
    ledger = tmp_path / "crash.sqlite"
    Session(CallableProvider(items_reply), ledger=ledger, repairs=0, replays=0).run_batch(
        "labels", review_tasks(1), LABEL_SCHEMA, validator=_check_with_a_pasted_key,
        on_exhausted="return")
    done = bj("receipts", "labels", "--failed", "--ledger", str(ledger), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    line = _check_with_a_pasted_key.__code__.co_firstlineno + 1
    lines = done.stdout.splitlines()
    at = lines.index(f'          File "{__file__}", line {line}, in _check_with_a_pasted_key')
    assert " ".join(x.strip() for x in lines[:at]).endswith("validator raised KeyError: 'lable'")
    assert lines[at + 1] == "            return item[\"lable\"] == \"<redacted>\""
    assert "a1b2c3" not in done.stdout and "_acceptance" not in done.stdout


def _check_against_a_js_reference(item, task):
    raise ValueError(f"{item['verdict']} does not match the reference " + "great \ud83d")


def test_receipts_failed_show_a_lone_surrogate_in_a_validators_message_escaped(
        tmp_path: Path) -> None:
    """Half an emoji (as a JavaScript export cuts one) quoted by a validator cannot be encoded:
    shown as its escape, in JSON as JSON's own ``\\ud83d``, never a UnicodeEncodeError."""
    ledger = tmp_path / "js.sqlite"
    Session(CallableProvider(items_reply), ledger=ledger, repairs=0, replays=0).run_batch(
        "labels", review_tasks(1), LABEL_SCHEMA, validator=_check_against_a_js_reference,
        on_exhausted="return")
    human = bj("receipts", "labels", "--failed", "--ledger", str(ledger), cwd=tmp_path)
    assert human.returncode == 0 and "great \\ud83d" in human.stdout, human.stderr
    done = bj("receipts", "labels", "--failed", "--json", "--ledger", str(ledger), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["errors"][0]["message"].endswith("great \ud83d")
