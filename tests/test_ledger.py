"""The ledger is the single source of truth: receipts before calls, one-transaction commits,
versioned schema, and nothing lost across a crash."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from batchjson import CallableProvider, Ledger, Session
from batchjson._errors import LedgerError
from batchjson._ledger.sqlite import SCHEMA_VERSION
from tests.helpers import (
    LABEL_SCHEMA,
    answer,
    ctrl_c_in_a_live_loop,
    items_reply,
    ledger_rows,
    review_tasks,
)


def test_receipt_is_in_flight_while_the_call_runs(tmp_path):
    seen = []

    def model(call):
        with sqlite3.connect(tmp_path / "l.sqlite") as other:  # another reader, mid-call
            seen.append(other.execute("SELECT status, kind FROM attempts").fetchall())
        return items_reply(call)

    session = Session(CallableProvider(model), ledger=tmp_path / "l.sqlite")
    session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert seen == [[("in_flight", "initial")]]
    assert [r.status for r in session.ledger.attempts("r")] == ["accepted"]


def test_an_accepted_call_is_written_in_four_statements_on_sqlite(tmp_path):
    """A ceiling on the hot path, counted, never timed: the receipt, the claim (which says
    whether the ledger has a budget), the checkpoint row and the completion; the group's
    BEGIN and COMMIT are shared by the calls of a turn. Fault: a statement more for every
    call (the budget read apart, a claim read back)."""
    session = Session(CallableProvider(items_reply), ledger=tmp_path / "l.sqlite",
                      concurrency=8)
    store, counted, inside = session.ledger.store, [], []
    calls_transaction = store._calls_transaction

    @contextlib.contextmanager
    def counting():
        with calls_transaction() as tx:
            inside.append(True)
            try:
                yield tx
            finally:
                inside.clear()

    store._calls_transaction = counting
    store._db.set_trace_callback(lambda sql: inside and counted.append(" ".join(sql.split()[:4])))
    result = session.run_batch("r", review_tasks(40), LABEL_SCHEMA, pack=1)
    assert result.status == "resolved" and result.calls == 40
    statements = [s for s in counted if s not in ("BEGIN IMMEDIATE", "COMMIT")]
    # beside the calls' own: the run's few (its host's row joined and read, its claims let go)
    assert len(statements) <= 4 * 40 + 5, sorted(set(statements))


def test_a_calls_statements_on_sqlite_build_no_temporary_b_tree(tmp_path):
    """Each row a call writes is checked without a b-tree made for it: an IN list of more than
    two constants in a CHECK, or RETURNING, has SQLite build one for every row (a page
    allocated and filled each time). Fault: ``status IN (...)`` back in the schema."""
    session = Session(CallableProvider(items_reply), ledger=tmp_path / "l.sqlite",
                      concurrency=4)
    store, seen = session.ledger.store, set()
    store._db.set_trace_callback(seen.add)
    assert session.run_batch("r", review_tasks(8), LABEL_SCHEMA, pack=1).status == "resolved"
    store._db.set_trace_callback(None)
    written = [sql for sql in seen if sql.startswith(("INSERT INTO attempts", "UPDATE attempts",
                                                      "INSERT INTO checkpoint",
                                                      "INSERT INTO claims"))]
    assert len(written) >= 4 * 8  # receipt, claim, completion, checkpoint row: each call's
    for sql in written:
        ops = {row[1] for row in store._db.execute("EXPLAIN " + sql).fetchall()}
        assert "OpenEphemeral" not in ops, sql


def test_file_ledger_uses_wal_and_records_schema_version(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    with sqlite3.connect(tmp_path / "l.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_ledger_is_refused_untouched(tmp_path):
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match="upgrade batchjson"):
        Ledger(path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_in_memory_ledger_is_private_to_its_session():
    one, two = Session(CallableProvider(items_reply)), Session(CallableProvider(items_reply))
    one.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert one.ledger.batch_names() == ["r"] and two.ledger.batch_names() == []


def test_interrupt_inside_a_live_loop_cancels_calls_and_commits_nothing():
    """As in Jupyter: a loop is running, so the batch runs on a worker thread; Ctrl-C lands in
    the caller's thread and must unwind the worker, closing every in-flight receipt."""
    import _thread

    sent = []

    async def hang(call):
        sent.append(call)
        if len(sent) == 2:  # both calls are out: now the user presses Ctrl-C
            _thread.interrupt_main()
        await asyncio.sleep(30)

    session = Session(CallableProvider(hang))

    async def cell():
        return session.run_batch("r", review_tasks(2), LABEL_SCHEMA)

    assert ctrl_c_in_a_live_loop(cell) < 10  # did not wait out the 30 s calls
    assert [r.status for r in session.ledger.attempts("r")] == ["cancelled", "cancelled"]
    assert session.ledger.checkpoint("r") == {}
    assert session.evidence.minimum_exact_retry_calls == 2


CRASH_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

    async def slow(call):
        if call.tasks[0]["candidate_id"].endswith("127"):
            return items_reply(call)  # the first request lands at once
        print("waiting", flush=True)
        await asyncio.sleep(60)

    provider = CallableProvider(slow)
    provider.source_key = lambda: "one-model"  # the re-run answers from the same source
    session = Session(provider, ledger=sys.argv[1], concurrency=4)
    session.run_batch("r", review_tasks(4), LABEL_SCHEMA)
""")


def _statuses(path) -> list[str]:
    """Attempt statuses as another process sees them (empty until the ledger exists)."""
    if isinstance(path, Path):
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                return sorted(r[0] for r in db.execute("SELECT status FROM attempts"))
        except sqlite3.Error:
            return []
    try:
        return sorted(r[0] for r in ledger_rows(path, "SELECT status FROM attempts"))
    except LedgerError:  # its schema is still being made
        return []


def test_killed_process_loses_nothing_and_rerun_completes(ledger_at):
    path = ledger_at()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, str(path)], env=env,
                            stdout=subprocess.PIPE, cwd=os.getcwd())
    assert proc.stdout.readline().strip() == b"waiting"
    deadline = time.monotonic() + 20  # poll the file: the accept and three begins are on disk
    while _statuses(path) != ["accepted", "in_flight", "in_flight", "in_flight"]:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    provider = CallableProvider(items_reply)
    provider.source_key = lambda: "one-model"
    session = Session(provider, ledger=path)
    statuses = sorted(r.status for r in session.ledger.attempts("r"))
    assert statuses == ["accepted", "in_flight", "in_flight", "in_flight"]
    assert len(session.ledger.checkpoint("r")) == 1
    assert session.evidence.minimum_exact_retry_calls == 3
    result = session.run_batch("r", review_tasks(4), LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 3


def test_validator_versions_are_numbered_by_the_ledger_across_restarts(ledger_at):
    path = ledger_at()

    def make(threshold):
        namespace = {"THRESHOLD": threshold}
        exec("def check(item, task):\n    if len(item) < THRESHOLD:\n        raise ValueError('x')",
             namespace)
        return namespace["check"]

    first = Session(ledger=path)
    assert first.validators.version_of(make(1)).version == 1
    first.close()
    second = Session(ledger=path)  # a kernel restart with edited logic
    assert second.validators.version_of(make(2)).version == 2
    second.close()
    third = Session(ledger=path)  # and back to the first logic
    assert third.validators.version_of(make(1)).version == 1
    rows = [(r["name"], r["version"]) for r in third.ledger.validator_usage()]
    assert rows == [("check", 1), ("check", 2)]


def test_a_provider_raising_keyboard_interrupt_leaves_no_in_flight_receipt():
    def interrupting(call):
        raise KeyboardInterrupt

    session = Session(CallableProvider(interrupting))
    with pytest.raises(KeyboardInterrupt):
        session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    assert [r.status for r in session.ledger.attempts("r")] == ["cancelled"]


def test_value_count_matches_the_checkpoint_for_one_batch_and_all():
    session = Session(CallableProvider(items_reply))
    session.run_batch("a", review_tasks(3), LABEL_SCHEMA, pack=2)
    session.run_batch("b", review_tasks(2, case="gold-pair-079"), LABEL_SCHEMA)
    session.run_batch("b", review_tasks(1, case="gold-pair-079"), LABEL_SCHEMA)  # revision 2
    ledger = session.ledger
    assert ledger.store.value_count("a") == len(ledger.checkpoint("a")) == 3
    assert ledger.store.value_count("b") == len(ledger.checkpoint("b")) == 1
    assert ledger.store.value_count() == 4 == session.evidence.summary()["usable_results"]


def test_value_count_counts_a_task_once_when_two_batches_hold_its_answer(tmp_path):
    ours = Session(CallableProvider(items_reply), ledger=tmp_path / "ours.sqlite")
    ours.run_batch("a", review_tasks(3), LABEL_SCHEMA, pack=2)
    theirs = Session(CallableProvider(items_reply), ledger=tmp_path / "theirs.sqlite")
    theirs.run_batch("b", review_tasks(3), LABEL_SCHEMA, pack=2)  # the same requests
    theirs.close()
    ours.ledger.merge(tmp_path / "theirs.sqlite")
    store = ours.ledger.store
    assert len(store._read("SELECT task_id FROM checkpoint", ())) == 6  # each key, two batches
    assert store.value_count("a") == store.value_count("b") == 3
    assert store.value_count() == 6


KILL_AT = textwrap.dedent("""
    import os, signal, sys
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

    point, seen = sys.argv[2], []

    def maybe_die(here):
        if here == point:
            seen.append(here)
            if len(seen) == 3:  # two of these went through; die on the third
                os.kill(os.getpid(), signal.SIGKILL)


    def claiming(store, *args):
        opened = take(store, *args)
        maybe_die("claim")  # inside the transaction of the claim and its receipt
        return opened

    def claiming_at_commit(store, *args):  # PostgreSQL's claim in one statement
        opened = take_at_commit(store, *args)
        if opened is not None:
            maybe_die("claim")
        return opened

    def accepting(store, tx, attempt_id, status, *args, **kwargs):
        out = accept(store, tx, attempt_id, status, *args, **kwargs)
        if status == "accepted":
            maybe_die("accept")  # accepted and checkpointed, not yet committed
        return out

    def model(call):
        maybe_die("send")  # claim and receipt committed, the call is out
        return items_reply(call)

    session = Session(CallableProvider(model, source="test-model"), ledger=sys.argv[1],
                      concurrency=2)
    store = type(session.ledger.store)  # SQLite's or PostgreSQL's
    take, take_at_commit, accept = store._open, store._claim_at_commit, store.complete_call
    store._open, store._claim_at_commit = claiming, claiming_at_commit
    store.complete_call = accepting
    session.run_batch("r", review_tasks(6), LABEL_SCHEMA)
""")


@pytest.mark.parametrize("point", ["claim", "send", "accept"])
def test_a_kill_at_any_point_leaves_a_consistent_ledger_and_rerun_spends_nothing_twice(
        ledger_at, point):
    path = ledger_at()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", KILL_AT, str(path), point], env=env,
                          cwd=os.getcwd(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    if isinstance(path, Path):
        assert ledger_rows(path, "PRAGMA integrity_check") == [("ok",)]
    assert ledger_rows(path, "SELECT COUNT(*) FROM attempts a WHERE status = 'accepted' AND "
                       "NOT EXISTS (SELECT 1 FROM checkpoint c WHERE c.attempt_id = a.id)"
                       ) == [(0,)]
    (accepted_before,), = ledger_rows(path, "SELECT COUNT(*) FROM attempts WHERE status = "
                                      "'accepted'")
    sent = []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call),
                                       source="test-model"), ledger=path, concurrency=2)
    result = session.run_batch("r", review_tasks(6), LABEL_SCHEMA)
    assert result.status == "resolved" and len(sent) == 6 - accepted_before
    receipts = session.ledger.attempts("r")
    assert "in_flight" not in {r.status for r in receipts}  # the killed runner's: abandoned
    accepted = [r.request_key for r in receipts if r.status == "accepted"]
    assert len(accepted) == len(set(accepted)) == 6  # no request paid for twice
    session.close()


def ledger_at_schema(path, version: int) -> None:
    """A ledger file as an earlier batchjson left it: a table with a row, and its version."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE attempts (id INTEGER PRIMARY KEY, request_key TEXT)")
    db.execute("INSERT INTO attempts(request_key) VALUES ('k')")
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()


@pytest.mark.parametrize("version", [1, 6, SCHEMA_VERSION - 1])
def test_a_ledger_an_earlier_batchjson_wrote_is_refused_saying_what_to_do_and_left_as_it_was(
        tmp_path, version):
    path = tmp_path / "old.sqlite"
    ledger_at_schema(path, version)
    before = path.read_bytes()
    for opening in (lambda: Ledger(path), lambda: Session(CallableProvider(items_reply),
                                                          ledger=path)):
        with pytest.raises(LedgerError) as raised:
            opening()
        said = str(raised.value)
        assert f"schema version {version} was written by an earlier batchjson" in said
        assert f"reads only schema {SCHEMA_VERSION}" in said and "nothing was changed" in said
        assert f"batchjson export --jsonl --ledger {path}" in said  # with the version that
        assert "batchjson import receipts.jsonl --ledger" in said  # wrote it, then here
    assert path.read_bytes() == before
    ours = Ledger(tmp_path / "new.sqlite")
    with pytest.raises(LedgerError, match=f"schema version {version} was written by an "
                       "earlier batchjson"):
        ours.merge(path)
    assert ours.batch_names() == []
    ours.close()


def test_the_cli_refuses_an_older_ledger_with_exit_3_and_what_to_do(tmp_path):
    path = tmp_path / "old.sqlite"
    ledger_at_schema(path, 6)
    for args in (["status"], ["receipts", "r"], ["merge", str(path), "--ledger",
                                                 str(tmp_path / "new.sqlite")]):
        if args[0] != "merge":
            args = [*args, "--ledger", str(path)]
        done = subprocess.run([sys.executable, "-m", "batchjson", *args], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 3 and "Traceback" not in done.stderr, args
        assert "was written by an earlier batchjson" in done.stderr
        assert "batchjson export --jsonl" in done.stderr


def test_a_fresh_ledger_has_no_answers_of_unknown_source_to_look_for(tmp_path, ledger_at):
    """Runs look answers up under the key without an answer source only when the ledger holds
    an imported receipt of another system (its answer source unknown)."""
    session = Session(CallableProvider(items_reply, source="test-model"), ledger=ledger_at())
    session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert not session.ledger.store.has_sourceless_answers()
    exported = tmp_path / "ours.jsonl"  # batchjson's own export names its source
    exported.write_text("".join(json.dumps(r) + "\n" for r in session.ledger.export_receipts()))
    other = Ledger(ledger_at("other"))
    other.import_receipts(exported)
    assert not other.store.has_sourceless_answers()
    tasks = review_tasks(1, case="gold-pair-090")
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps({"batch": "f", "tasks": tasks, "status": "ok",
                                   "raw": json.dumps({"items": [
                                       {"task_id": t["task_id"]} | answer(t) for t in tasks]})})
                       + "\n")
    other.import_receipts(foreign)
    assert other.store.has_sourceless_answers()
    other.close()
    session.close()


def test_a_checkpoint_row_that_is_not_one_json_text_never_lends_its_values_to_other_tasks():
    """Items are decoded together; a row that is not one JSON text (a hand edit, a file merged
    in) must fail as itself, never shift values onto other tasks of the same request."""
    session = Session(CallableProvider(items_reply, source="test-model"))
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA, pack=3)
    with session.ledger.store.transaction() as db:
        ids = [r[0] for r in db.execute("SELECT task_id FROM checkpoint ORDER BY task_id")]
        # three rows that, joined, read as three values
        for task_id, text in zip(ids, ['{"verdict": "x"},{"verdict": "y"}', "[3", "4]"],
                                 strict=True):
            db.execute("UPDATE checkpoint SET item = ? WHERE task_id = ?", (text, task_id))
    with pytest.raises(ValueError):
        session.ledger.checkpoint("r")
    session.close()
