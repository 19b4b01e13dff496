"""A ledger file that cannot be opened says what is wrong with it and what to do: not a SQLite
file, a SQLite file cut short, a read-only place (a read-only mount, for `status` and for a
run), a URL where a file path belongs."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from batchjson import CallableProvider, LedgerError, Session, SimulatedModel
from batchjson._ledger.sqlite import _write_problem
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

ROOT = Path(__file__).resolve().parents[1]


def bj(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def ledger_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real ledger with a few receipts, closed (its WAL folded back into the file)."""
    path = tmp_path_factory.mktemp("whole") / "ledger.sqlite"
    session = Session(CallableProvider(items_reply), ledger=path)
    session.run_batch("r", review_tasks(40), LABEL_SCHEMA)
    session.close()
    return path.read_bytes()


@pytest.mark.parametrize("keep", [50, 4096, 0.5])
def test_a_truncated_ledger_is_called_cut_short_not_a_stranger(
        tmp_path: Path, ledger_bytes: bytes, keep: float) -> None:
    cut = ledger_bytes[:int(len(ledger_bytes) * keep) if keep < 1 else int(keep)]
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(cut)
    done = bj("status", "--ledger", str(path), cwd=tmp_path)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert "is a SQLite file cut short" in done.stderr and "not a SQLite file" not in done.stderr
    assert "restore it from a backup" in done.stderr
    with pytest.raises(LedgerError, match="cut short") as raised:
        Session(CallableProvider(items_reply), ledger=path)
    assert "not a SQLite file" not in str(raised.value)
    assert path.read_bytes() == cut  # nothing was written to it


def test_a_file_that_is_not_sqlite_is_named_so_with_what_it_starts_with(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("my notes, not a database\n" * 40)
    done = bj("status", "--ledger", str(path), cwd=tmp_path)
    assert done.returncode == 3
    assert "is not a SQLite file (it starts b'my notes, not a '" in done.stderr


def test_a_write_failing_on_a_read_only_ledger_says_read_only() -> None:
    said = _write_problem(None, sqlite3.OperationalError("attempt to write a readonly database"))
    assert "read-only" in said and "writable" in said
    assert _write_problem(None, sqlite3.OperationalError("database or disk is full")) == ""


def _unshare_works() -> bool:
    """Whether this machine lets an unprivileged user namespace mount a tmpfs (Linux)."""
    if shutil.which("unshare") is None or sys.platform != "linux":
        return False
    with tempfile.TemporaryDirectory() as where:
        probe = subprocess.run(["unshare", "-rm", "mount", "-t", "tmpfs", "none", where],
                               capture_output=True, timeout=30)
    return probe.returncode == 0


READ_ONLY_MOUNT = textwrap.dedent("""
    set -e
    mount -t tmpfs none "$MNT"
    "$PY" -c "$MAKE"
    mount -o remount,ro "$MNT"
    echo "--- status"
    "$PY" -m batchjson status --ledger "$MNT/ledger.sqlite" || echo "exit=$?"
    echo "--- run"
    "$PY" -c "$RUN" || echo "exit=$?"
    echo "--- new"
    "$PY" -c "$NEW" || echo "exit=$?"
""")
MAKE = ("import os; from batchjson import Session, CallableProvider; "
        "from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks; "
        "s = Session(CallableProvider(items_reply), ledger=os.environ['MNT'] + '/ledger.sqlite');"
        " s.run_batch('r', review_tasks(3), LABEL_SCHEMA); s.close()")
RUN = ("import os; from batchjson import Session, CallableProvider, LedgerError; "
       "from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks\n"
       "try:\n"
       "    Session(CallableProvider(items_reply), ledger=os.environ['MNT'] + '/ledger.sqlite')"
       ".run_batch('r2', review_tasks(3), LABEL_SCHEMA)\n"
       "except LedgerError as exc:\n"
       "    print('LedgerError:', exc)")
NEW = RUN.replace("/ledger.sqlite", "/runs/new.sqlite")


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare -rm to mount a read-only tmpfs")
def test_a_ledger_on_a_read_only_mount_says_read_only_for_status_and_for_a_run(
        tmp_path: Path) -> None:
    mount = tmp_path / "mnt"
    mount.mkdir()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "MNT": str(mount), "PY": sys.executable,
           "MAKE": MAKE, "RUN": RUN, "NEW": NEW, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", READ_ONLY_MOUNT], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status, run, new = done.stdout.split("--- ")[1:]
    said = done.stderr
    assert "exit=3" in status
    assert f"{mount}/ledger.sqlite is on a read-only file system" in said
    assert "copy it to a writable directory" in said and "not a SQLite file" not in said
    assert "LedgerError:" in run and "is on a read-only file system" in run
    assert "LedgerError:" in new and "would be on a read-only file system" in new
    assert "Traceback" not in said


FULL_TMPDIR = textwrap.dedent("""
    set -e
    mount -t tmpfs -o size=64k none "$MNT"
    TMPDIR="$MNT" SQLITE_TMPDIR="$MNT" "$PY" -c "$BIG"
""")
# 30,000 tasks with long ids: SQLite's DISTINCT over them outgrows its 2 MB cache, which on
# a disk-backed temp store spills to a file in TMPDIR; batchjson's own spool is kept in memory
# here so that only SQLite could meet the full TMPDIR.
BIG = textwrap.dedent("""
    import json, os
    from batchjson import CallableProvider, LedgerError, Session
    from batchjson._content import tasks as spool
    spool.SPILL_CHARS = 1 << 30
    tasks = [{"task_id": f"{i:06d}" + "x" * 120, "prompt": f"label {i}"} for i in range(30000)]
    def answer(call):
        return json.dumps({"items": [{"task_id": t["task_id"], "label": "ok"}
                                     for t in call.tasks]})
    schema = {"type": "object", "properties": {"label": {"type": "string"}}}
    try:
        result = Session(CallableProvider(answer), ledger=os.environ["LEDGER"]).run_batch(
            "big", tasks, schema, pack=50)
        print(result.status, len(result.values), result.calls)
    except LedgerError as exc:
        print("LedgerError:", exc)
""")


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare -rm to mount a small tmpfs")
def test_a_full_tmpdir_midrun_is_no_ledger_fault_and_every_call_is_recorded(
        tmp_path: Path) -> None:
    """SQLite keeps its temporaries in memory: a full TMPDIR (64 KB) is not reported as the
    ledger's disk being full, and the run records and resolves every task."""
    mount, ledger = tmp_path / "tmp", tmp_path / "ledger.sqlite"
    mount.mkdir()
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "MNT": str(mount), "PY": sys.executable,
           "BIG": BIG, "LEDGER": str(ledger), "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", FULL_TMPDIR], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.split() == ["resolved", "30000", "600"], done.stdout
    db = sqlite3.connect(ledger)
    try:
        assert db.execute("SELECT status, COUNT(*) FROM attempts GROUP BY status").fetchall() == [
            ("accepted", 600)]
    finally:
        db.close()


def test_a_full_ledger_disk_is_named_as_the_ledgers_own_before_any_call(
        tmp_path: Path) -> None:
    """SQLITE_FULL on the ledger (here: its page limit reached) names the ledger's directory
    and what to do; the run stops before a call is sent."""
    path, sent = tmp_path / "runs" / "ledger.sqlite", []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call)),
                      ledger=path)
    db = session.ledger.store._db
    db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}")
    with pytest.raises(LedgerError) as raised:
        session.run_batch("r", review_tasks(40), LABEL_SCHEMA)
    assert f"the disk holding {path.parent} is full: free space there, or move the ledger" in (
        str(raised.value)) and sent == []


def test_a_ledger_path_starting_with_a_tilde_is_in_the_home_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Session(ledger="~/x.sqlite")`` keeps the ledger where a shell would, never in a
    directory literally named ``~`` under the current one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    Session(SimulatedModel(answer=lambda t: {"verdict": "match"}), ledger="~/runs.sqlite").close()
    assert (tmp_path / "home" / "runs.sqlite").exists() and not (tmp_path / "~").exists()
