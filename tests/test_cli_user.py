"""The command line as a user meets it: identity fields in exported values, a missing ledger
named as given, a call that was never sent shown as costing nothing."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from batchjson import CallableProvider, Ledger, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks
from tests.test_forget import bj


def labelled(path: Path, identity: str | None) -> None:
    session = Session(CallableProvider(items_reply, source="m"), ledger=path)
    session.run_batch("labels", review_tasks(3), LABEL_SCHEMA, pack=3, identity=identity)
    session.close()


def test_values_csv_offers_the_identity_fields_of_each_task(tmp_path: Path):
    path = tmp_path / "l.sqlite"
    labelled(path, "task_id,case_id")
    plain = list(csv.reader(io.StringIO(bj("values", "labels", "--csv", "--ledger", str(path),
                                           cwd=tmp_path).stdout)))
    assert plain[0] == ["task_id", "verdict"]
    done = bj("values", "labels", "--csv", "--identity", "--ledger", str(path), cwd=tmp_path)
    rows = list(csv.reader(io.StringIO(done.stdout)))
    assert rows[0] == ["task_id", "case_id", "verdict"]
    assert rows[1][:2] == ["gold-pair-078::gold-pair-078-candidate-127", "gold-pair-078"]
    lines = bj("values", "labels", "--identity", "--ledger", str(path), cwd=tmp_path).stdout
    assert json.loads(lines.splitlines()[0])["identity"] == {"case_id": "gold-pair-078"}


def test_values_identity_under_the_default_identity_gives_every_task_field(tmp_path: Path):
    path = tmp_path / "l.sqlite"
    labelled(path, None)
    rows = list(csv.reader(io.StringIO(bj("values", "labels", "--csv", "--identity",
                                          "--ledger", str(path), cwd=tmp_path).stdout)))
    assert rows[0] == ["task_id", "candidate_id", "case_id", "verdict"]


def test_a_missing_ledger_given_with_ledger_is_not_told_to_pass_ledger(tmp_path: Path):
    given = bj("status", "--ledger", "missing.sqlite", cwd=tmp_path)
    assert given.returncode == 3
    assert "no ledger at missing.sqlite; check the path given to --ledger" in given.stderr
    assert "pass --ledger" not in given.stderr
    default = bj("status", cwd=tmp_path)
    assert "no ledger at .batchjson/ledger.sqlite;" in default.stderr
    assert "pass --ledger PATH to read another" in default.stderr


def test_a_call_cancelled_before_it_was_sent_costs_nothing_in_receipts(tmp_path: Path):
    path = tmp_path / "l.sqlite"
    labelled(path, None)
    ledger = Ledger(path)
    revision = ledger.revisions("labels")[0]
    request = ledger.leaves(revision.id)[0]
    with ledger.store.transaction() as db:  # a replay interrupted before its call was sent
        db.execute("INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                   "status, errors, provider, model, started_at, finished_at, uid) VALUES "
                   "(?,?,?,?, 'replay', 'cancelled', '[]', 'callable', 'm', ?, ?, 'u-unsent')",
                   (revision.batch_id, revision.id, request.key, request.task_ids_json,
                    "2026-12-01T10:00:00.000000+00:00", "2026-12-01T10:00:01.000000+00:00"))
    ledger.close()
    out = bj("receipts", "labels", "--ledger", str(path), cwd=tmp_path).stdout
    row = [line for line in out.splitlines() if " cancelled " in line][0]
    assert row.rstrip().endswith("$0.00 (not sent)") and "unknown" not in row
