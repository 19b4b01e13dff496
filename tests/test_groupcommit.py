"""Group commit keeps each write whole: a failing write is undone alone, never half-applied."""

from __future__ import annotations

import asyncio

import pytest

from batchjson._ledger import Ledger
from batchjson._ledger.store import Store
from batchjson._replay.groupcommit import GroupCommit


def _ledger_with_table() -> Store:
    store = Ledger(None).store
    with store.transaction() as db:
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    return store


def rows(store: Store) -> list[str]:
    with store.transaction() as db:
        return [r[0] for r in db.execute("SELECT k FROM t ORDER BY k")]


def test_writes_of_one_turn_share_one_transaction():
    store = _ledger_with_table()
    writes = GroupCommit(store)

    async def main():
        return await asyncio.gather(*(
            writes.run(lambda db, k=k: db.execute("INSERT INTO t VALUES (?)", (k,)).lastrowid)
            for k in "abc"))

    assert asyncio.run(main()) == [1, 2, 3]
    assert writes.flushes == 1 and rows(store) == ["a", "b", "c"]


def test_a_failing_write_is_undone_whole_and_the_others_still_commit():
    store = _ledger_with_table()
    writes = GroupCommit(store)

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
    assert rows(store) == ["x", "y"]  # 'half' was rolled back with its failing write


def test_unawaited_failures_surface_when_the_run_checks():
    store = _ledger_with_table()
    writes = GroupCommit(store)

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
    store = _ledger_with_table()
    writes = GroupCommit(store)

    def half_then_fail(db):
        db.execute("INSERT INTO t VALUES ('half')")
        raise RuntimeError("queued record failed")

    async def main():
        writes.queue(lambda db: db.execute("INSERT INTO t VALUES ('q')"))
        writes.queue(half_then_fail)
        return await writes.run(lambda db: db.execute("INSERT INTO t VALUES ('r')").rowcount)

    assert asyncio.run(main()) == 1  # the awaited receipt committed despite its neighbour
    assert rows(store) == ["q", "r"]
    with pytest.raises(RuntimeError, match="queued record failed"):
        writes.raise_failures()


def test_after_the_ledger_fails_a_queued_write_is_reported_not_dropped():
    from batchjson._errors import LedgerError

    store = _ledger_with_table()
    writes = GroupCommit(store)
    writes.broken = LedgerError("disk full", path=":memory:")

    async def main():
        writes.queue(lambda db: db.execute("INSERT INTO t VALUES ('late')"))
        await asyncio.sleep(0)

    asyncio.run(main())
    assert rows(store) == []
    with pytest.raises(LedgerError, match="disk full"):
        writes.raise_failures()


def test_on_a_server_groups_commit_off_the_loop_one_at_a_time_and_in_order(postgres):
    """PostgreSQL's round trips are waited for on a thread: the event loop goes on meanwhile,
    the writes queued while a group commits form the next one, in order, and a flush that
    must happen now waits for the group in flight first."""
    store = Ledger(postgres.database("groups_off_the_loop")).store
    with store.transaction() as db:
        db.execute("CREATE TABLE t (k TEXT, n BIGSERIAL)")
    writes = GroupCommit(store)
    turns = []

    async def main():
        ticking = asyncio.ensure_future(_tick(turns))
        slow = writes.submit(lambda db: db.execute("SELECT pg_sleep(0.3)"))
        await asyncio.sleep(0.1)  # the slow group is in flight
        later = [writes.submit(lambda db, k=k: db.execute("INSERT INTO t(k) VALUES (%s)", (k,)))
                 for k in "abc"]
        await asyncio.gather(slow, *later)
        writes.queue(lambda db: db.execute("SELECT pg_sleep(0.2)"))
        await asyncio.sleep(0.05)  # that group is in flight; this record waits its turn
        writes.queue(lambda db: db.execute("INSERT INTO t(k) VALUES ('last')"))
        writes.close()
        ticking.cancel()

    asyncio.run(main())
    assert len(turns) >= 5  # the loop ran on while the server slept
    assert writes.flushes == 4  # slow; a, b, c together; the queued sleep; 'last' now
    with store.transaction() as db:
        assert [r[0] for r in db.execute("SELECT k FROM t ORDER BY n")] == [
            "a", "b", "c", "last"]
    store.close()


async def _tick(turns: list) -> None:
    while True:
        turns.append(None)
        await asyncio.sleep(0.02)
