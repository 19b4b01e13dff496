"""Group commit keeps each write whole: a failing write is undone alone, never half-applied."""

from __future__ import annotations

import asyncio

import pytest

from batchjson._groupcommit import GroupCommit
from batchjson._ledger import Ledger


def _ledger_with_table() -> Ledger:
    ledger = Ledger(None)
    with ledger.transaction() as db:
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    return ledger


def rows(ledger: Ledger) -> list[str]:
    return [r[0] for r in ledger._rows("SELECT k FROM t ORDER BY k")]


def test_writes_of_one_turn_share_one_transaction():
    ledger = _ledger_with_table()
    writes = GroupCommit(ledger)

    async def main():
        return await asyncio.gather(*(
            writes.run(lambda db, k=k: db.execute("INSERT INTO t VALUES (?)", (k,)).lastrowid)
            for k in "abc"))

    assert asyncio.run(main()) == [1, 2, 3]
    assert writes.flushes == 1 and rows(ledger) == ["a", "b", "c"]


def test_a_failing_write_is_undone_whole_and_the_others_still_commit():
    ledger = _ledger_with_table()
    writes = GroupCommit(ledger)

    def half_then_fail(db):
        db.execute("INSERT INTO t VALUES ('half')")
        raise RuntimeError("second statement failed")

    async def main():
        ok1 = writes.run(lambda db: db.execute("INSERT INTO t VALUES ('x')"))
        bad = writes.run(half_then_fail)
        ok2 = writes.run(lambda db: db.execute("INSERT INTO t VALUES ('y')"))
        return await asyncio.gather(ok1, bad, ok2, return_exceptions=True)

    first, failure, last = asyncio.run(main())
    assert isinstance(failure, RuntimeError)
    assert not isinstance(first, Exception) and not isinstance(last, Exception)
    assert rows(ledger) == ["x", "y"]  # 'half' was rolled back with its failing write


def test_unawaited_failures_surface_when_the_run_checks():
    ledger = _ledger_with_table()
    writes = GroupCommit(ledger)

    async def main():
        writes.submit(lambda db: db.execute("INSERT INTO nowhere VALUES (1)"))
        await asyncio.sleep(0)
        writes.flush_now()

    asyncio.run(main())
    with pytest.raises(Exception, match="nowhere"):
        writes.raise_failures()


def test_a_queued_write_that_fails_alone_is_undone_and_reported_when_the_run_checks():
    """Records nobody waits for (judged returns, released claims) join the same transaction as
    awaited receipts; one that fails is undone alone and still surfaces at the run's end."""
    ledger = _ledger_with_table()
    writes = GroupCommit(ledger)

    def half_then_fail(db):
        db.execute("INSERT INTO t VALUES ('half')")
        raise RuntimeError("queued record failed")

    async def main():
        writes.queue(lambda db: db.execute("INSERT INTO t VALUES ('q')"))
        writes.queue(half_then_fail)
        return await writes.run(lambda db: db.execute("INSERT INTO t VALUES ('r')").rowcount)

    assert asyncio.run(main()) == 1  # the awaited receipt committed despite its neighbour
    assert rows(ledger) == ["q", "r"]
    with pytest.raises(RuntimeError, match="queued record failed"):
        writes.raise_failures()


def test_after_the_ledger_fails_a_queued_write_is_reported_not_dropped():
    from batchjson._errors import LedgerError

    ledger = _ledger_with_table()
    writes = GroupCommit(ledger)
    writes.broken = LedgerError("disk full", path=":memory:")

    async def main():
        writes.queue(lambda db: db.execute("INSERT INTO t VALUES ('late')"))
        await asyncio.sleep(0)

    asyncio.run(main())
    assert rows(ledger) == []
    with pytest.raises(LedgerError, match="disk full"):
        writes.raise_failures()


def test_while_a_run_goes_its_wal_is_copied_into_the_ledger_file_by_the_checkpointer(tmp_path,
                                                                                     monkeypatch):
    """Commits the event loop waits on checkpoint rarely (the 2 MB written here is below their
    threshold); the checkpointer thread copies the pages, and afterwards commits checkpoint as
    before. It opens the ledger's own file, never a new one,
    even when the working directory changed since the ledger was opened."""
    import time

    from batchjson._groupcommit import RUN_AUTOCHECKPOINT, Checkpointer

    monkeypatch.chdir(tmp_path)
    ledger = Ledger("ledger.sqlite")
    file = tmp_path / "ledger.sqlite"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    checkpoints = Checkpointer(ledger, interval=0.01).start()
    try:
        assert ledger._rows("PRAGMA wal_autocheckpoint")[0][0] == RUN_AUTOCHECKPOINT
        before = file.stat().st_size
        with ledger.transaction() as db:
            db.execute("CREATE TABLE big (x TEXT)")
            db.executemany("INSERT INTO big VALUES (?)", [("x" * 1000,)] * 2000)
        deadline = time.monotonic() + 30
        while file.stat().st_size <= before + 1_000_000 and time.monotonic() < deadline:
            time.sleep(0.01)  # a checkpoint may be part-way through copying
        assert file.stat().st_size > before + 1_000_000  # the pages reached the file
    finally:
        checkpoints.stop()
    assert ledger._rows("PRAGMA wal_autocheckpoint")[0][0] == 1000
    assert list(elsewhere.iterdir()) == []
    ledger.close()
