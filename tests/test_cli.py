"""The command line: the demo resolves and resumes; status and receipts read a ledger."""

from __future__ import annotations

import json

import pytest

from batchjson.cli import main


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
