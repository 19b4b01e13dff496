"""No call without a committed receipt: when the ledger cannot be written (disk full, locked past
the busy timeout, read-only) the run stops before any further call with a LedgerError naming the
ledger and the cause; what was committed stays, and a re-run resumes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from batchjson import CallableProvider, Ledger, Session
from batchjson._errors import LedgerError
from tests.helpers import LABEL_SCHEMA, ConcurrentModel, items_reply, review_tasks

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

DISK_FULL = textwrap.dedent("""
    import json, os, resource, signal, sys
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    path = sys.argv[1]
    calls = []

    def model(call):
        calls.append(call.request_key)
        return items_reply(call)

    session = Session(CallableProvider(model, source="test-model"), ledger=path,
                      concurrency=16)  # the ledger is created here
    sizes = [os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p)]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    limit = max(sizes) + 600_000
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    error = None
    try:
        session.run_batch("r", review_tasks(400), LABEL_SCHEMA)
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"calls": len(calls), "error": error}), flush=True)
""")


def test_a_full_disk_stops_the_run_before_any_call_without_a_receipt(tmp_path):
    path = tmp_path / "ledger.sqlite"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(path)], env=ENV,
                          capture_output=True, text=True, cwd=os.getcwd(), timeout=120)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["error"] is not None and out["error"].startswith("LedgerError")
    assert str(path) in out["error"]  # names the ledger
    assert "disk" in out["error"] or "full" in out["error"]  # and the OS/SQLite cause
    assert "IntegrityError" not in out["error"] and "no transaction" not in out["error"]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        receipts = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
        accepted = db.execute("SELECT COUNT(*) FROM attempts WHERE status = 'accepted'"
                              ).fetchone()[0]
    assert 0 < out["calls"] <= receipts  # every call that went out had a committed receipt
    assert accepted < 400

    model = ConcurrentModel(delay=0)
    session = Session(CallableProvider(model, source="test-model"), ledger=path,
                      concurrency=16)  # the same model answering: one answer source
    result = session.run_batch("r", review_tasks(400), LABEL_SCHEMA)  # space again: resumes
    assert result.status == "resolved" and len(result.values) == 400
    assert len(model.sent) == 400 - accepted  # nothing accepted before is paid again
    spend = session.ledger.spend("r")
    assert spend["accepted"] == 400
    session.close()


def test_a_ledger_locked_past_the_busy_timeout_stops_the_run(tmp_path):
    path = tmp_path / "l.sqlite"
    sent = []
    holder: list[sqlite3.Connection] = []

    def model(call):
        sent.append(call.request_key)
        if len(sent) == 1:  # another process takes the write lock and keeps it
            other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            other.execute("BEGIN IMMEDIATE")
            holder.append(other)
        return items_reply(call)

    session = Session(CallableProvider(model), ledger=Ledger(path, busy_timeout=0.05),
                      concurrency=1)
    try:
        with pytest.raises(LedgerError, match="locked") as raised:
            session.run_batch("r", review_tasks(5), LABEL_SCHEMA)
        assert str(path) in str(raised.value)
        assert len(sent) == 1  # no further call once the ledger could not be written
    finally:
        for other in holder:
            other.execute("ROLLBACK")
            other.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0] >= len(sent)
    session.close()


def test_a_read_only_ledger_refuses_before_any_call():
    sent = []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call)))
    session.ledger.store._db.execute("PRAGMA query_only = ON")  # every write now fails
    with pytest.raises(LedgerError, match="readonly|read-only|query_only") as raised:
        session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert ":memory:" in str(raised.value) and sent == []


def test_rollback_after_a_failed_write_keeps_the_real_cause():
    ledger = Ledger(None)
    with pytest.raises(LedgerError) as raised, ledger.store.transaction() as db:
        db.execute("PRAGMA query_only = ON")
        db.execute("INSERT INTO batches(name, created_at) VALUES ('x', 'now')")
    assert "readonly" in str(raised.value) and "no transaction" not in str(raised.value)
    assert isinstance(raised.value.cause, sqlite3.Error)
    ledger.store._db.execute("PRAGMA query_only = OFF")
    with ledger.store.transaction() as db:  # the ledger is usable again, nothing half-done
        db.execute("INSERT INTO batches(name, created_at) VALUES ('y', 'now')")
    assert ledger.batch_names() == ["y"]
