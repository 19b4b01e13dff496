"""The command line: the demo resolves and resumes; status and receipts read a ledger."""

from __future__ import annotations

import json
import sqlite3

import pytest

from batchjson import CallableProvider, Session
from batchjson.cli import main
from batchjson.ledger import Ledger
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


def test_demo_resolves_with_faults_then_resumes_with_zero_calls(tmp_path, capsys):
    ledger = tmp_path / "demo.sqlite"
    assert main(["demo", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "first run:  <BatchResult 'review' rev 1: resolved, 60/60 accepted" in out
    assert "rejected returns kept as failure receipts" in out
    assert "resumed from the ledger with 0 new call(s)." in out

    assert main(["status", "review", "--ledger", str(ledger)]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["unresolved_requests"] == 0 and status["usable_results"] == 60
    assert status["rejected_returns"] >= 1 and status["cost"] > 0

    assert main(["receipts", "review", "--ledger", str(ledger), "--failed", "--raw"]) == 0
    receipts = capsys.readouterr().out
    assert "rejected" in receipts and "raw: " in receipts and "accepted" not in receipts


def test_missing_ledger_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["status", "--ledger", str(tmp_path / "nope.sqlite")])
    assert "no ledger at" in capsys.readouterr().err


def test_status_and_receipts_name_what_is_wrong_with_their_input(tmp_path, capsys):
    ledger = tmp_path / "demo.sqlite"
    assert main(["demo", "--ledger", str(ledger)]) == 0
    capsys.readouterr()
    not_sqlite = tmp_path / "notes.json"
    not_sqlite.write_text('{"a": 1}')
    other_db = tmp_path / "other.db"
    sqlite3.connect(other_db).execute("CREATE TABLE t (x)").connection.close()
    cases = [
        (["status", "reveiw", "--ledger", str(ledger)],
         "no batch named 'reveiw' in this ledger (batches: review)"),
        (["receipts", "nope", "--ledger", str(ledger)], "no batch named 'nope'"),
        (["status", "--ledger", str(not_sqlite)], "is not a SQLite file"),
        (["status", "--ledger", str(tmp_path)], "is a directory"),
        (["receipts", "review", "--ledger", str(other_db)], "not a batchjson ledger"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err
    tables = sqlite3.connect(other_db).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("t",)]  # the wrong file was not turned into a ledger


def test_demo_never_clears_a_ledger_that_holds_other_batches(tmp_path, capsys):
    ledger = tmp_path / "work.sqlite"
    Session(CallableProvider(items_reply), ledger=ledger).run_batch(
        "labels", review_tasks(1), LABEL_SCHEMA)
    with pytest.raises(SystemExit):
        main(["demo", "--ledger", str(ledger)])
    assert "holds batches other than the demo's (labels)" in capsys.readouterr().err
    assert Ledger(ledger).batch_names() == ["labels"]
    assert main(["demo", "--ledger", str(tmp_path / "demo.sqlite")]) == 0
    assert main(["demo", "--ledger", str(tmp_path / "demo.sqlite")]) == 0  # its own: reset
