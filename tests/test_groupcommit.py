"""Group commit keeps each write whole: a failing write is undone alone, never half-applied."""

from __future__ import annotations

import asyncio

import pytest

from batchjson import Ledger
from batchjson._errors import LedgerError
from batchjson._ledger.store import Store
from batchjson._replay.groupcommit import CONFLICT_TRIES, GroupCommit


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
            writes.submit(lambda db, k=k: db.execute("INSERT INTO t VALUES (?)", (k,)).lastrowid)
            for k in "abc"))

    assert asyncio.run(main()) == [1, 2, 3]
    assert writes.flushes == 1 and rows(store) == ["a", "b", "c"]


def test_writes_queued_within_the_window_share_one_transaction():
    """Calls ending a moment apart (not in one loop turn) share one commit while a window is
    set; each write's caller resumes only once that commit is done."""
    store = _ledger_with_table()
    writes = GroupCommit(store)
    writes.window = 0.05

    async def main():
        first = writes.submit(lambda db: db.execute("INSERT INTO t VALUES ('a')"))
        await asyncio.sleep(0.01)  # other turns of the loop pass
        assert not first.done()
        second = writes.submit(lambda db: db.execute("INSERT INTO t VALUES ('b')"))
        await asyncio.gather(first, second)

    asyncio.run(main())
    assert writes.flushes == 1 and rows(store) == ["a", "b"]


def test_a_write_flushed_now_does_not_wait_for_its_window():
    """A run unwinding (or splitting a request) commits at once, whatever the window."""
    store = _ledger_with_table()
    writes = GroupCommit(store)
    writes.window = 60.0

    async def main():
        receipt = writes.submit(lambda db: db.execute("INSERT INTO t VALUES ('a')"))
        writes.flush_now()
        assert receipt.done() and rows(store) == ["a"]

    asyncio.run(main())
    assert writes.flushes == 1


def test_a_failing_write_is_undone_whole_and_the_others_still_commit():
    store = _ledger_with_table()
    writes = GroupCommit(store)

    def half_then_fail(db):
        db.execute("INSERT INTO t VALUES ('half')")
        raise RuntimeError("second statement failed")

    async def main():
        ok1 = writes.submit(lambda db: db.execute("INSERT INTO t VALUES ('x')"))
        bad = writes.submit(half_then_fail)
        ok2 = writes.submit(lambda db: db.execute("INSERT INTO t VALUES ('y')"))
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
        return await writes.submit(lambda db: db.execute("INSERT INTO t VALUES ('r')").rowcount)

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


class Conflict(Exception):
    """A database's word that a write met another's at that moment (a deadlock)."""


def _conflicting(monkeypatch: pytest.MonkeyPatch) -> tuple[Store, GroupCommit, list[int]]:
    """A store whose conflicts are :class:`Conflict`, its group commit, and a list of tries."""
    store = _ledger_with_table()
    monkeypatch.setattr(type(store), "conflicts", (Conflict,))
    return store, GroupCommit(store), []


def test_a_write_that_fails_alone_for_meeting_another_hosts_write_is_run_again(monkeypatch):
    """A deadlock on PostgreSQL can pick the same write as its victim when it runs alone after
    its group failed. Fault: that write reported failed (a paid answer left unrecorded) though
    running it again commits it."""
    store, writes, tries = _conflicting(monkeypatch)

    def deadlocked_twice(db):
        tries.append(1)
        db.execute("INSERT INTO t VALUES ('kept')")
        if len(tries) <= 2:  # in its group, then alone once more
            raise Conflict("deadlock detected")
        return "done"

    async def main():
        return await asyncio.gather(writes.submit(deadlocked_twice),
                                    writes.submit(lambda db: db.execute(
                                        "INSERT INTO t VALUES ('other')")))

    done, _ = asyncio.run(main())
    assert done == "done" and len(tries) == 3
    assert rows(store) == ["kept", "other"]  # each once: the failed tries were undone


def test_a_write_that_keeps_meeting_other_hosts_writes_stops_the_run_with_a_ledger_error(
        monkeypatch):
    """Fault: after its tries the database's own exception (psycopg's) reached the caller and
    left the public API; a write never recorded must stop the run as a failed ledger does."""
    store, writes, tries = _conflicting(monkeypatch)

    def always_deadlocked(db):
        tries.append(1)
        db.execute("INSERT INTO t VALUES ('never')")
        raise Conflict("deadlock detected")

    async def main():
        return await asyncio.gather(writes.submit(always_deadlocked), return_exceptions=True)

    [failed] = asyncio.run(main())
    assert isinstance(failed, LedgerError) and isinstance(failed.cause, Conflict)
    assert "3 times" in str(failed) and len(tries) == 1 + CONFLICT_TRIES
    assert rows(store) == [] and writes.broken is failed  # nothing more is written or sent
    with pytest.raises(LedgerError):
        writes.raise_failures()


def test_postgresql_says_a_deadlock_or_serialization_failure_may_pass_when_run_again(postgres):
    import psycopg

    from batchjson._ledger.postgres import TRANSIENT

    ledger = Ledger(postgres.database("conflicts"))
    store = ledger.store
    assert {e.sqlstate for e in store.conflicts} == TRANSIENT
    assert isinstance(psycopg.errors.DeadlockDetected("deadlock detected"), store.conflicts)
    assert not isinstance(psycopg.errors.UniqueViolation("duplicate key"), store.conflicts)
    ledger.close()


def test_a_write_waits_at_most_its_share_of_a_call_after_the_model_speeds_up():
    """A model dropping from 1 s calls to 1 ms ones: no write waits longer than its share
    (COMMIT_SHARE) of the call that set its wait, as the run's average catches up."""
    from types import SimpleNamespace

    from batchjson._replay.replay import COMMIT_SHARE, Replayer

    replayer = SimpleNamespace(writes=SimpleNamespace(window=0.0), _call_seconds=0.0,
                               _answered_at=0.0, _sending=63)
    for _ in range(64):
        Replayer._share_commits(replayer, 1.0)
    waits = []
    for _ in range(200):
        Replayer._share_commits(replayer, 0.001)
        waits.append(replayer.writes.window)
    assert max(waits) <= COMMIT_SHARE * 0.001 + 1e-12
    assert waits[-1] > 0  # 63 calls of 1 ms in flight: one is due within the wait


def test_a_write_waits_for_answers_coming_bunched_never_for_answers_apart(monkeypatch):
    """Four calls of a second in flight: a write waits only when its call answered within the
    wait of the one before (calls sent together answering together); never for answers apart,
    and never once no call is left in flight."""
    from types import SimpleNamespace

    from batchjson._replay import replay

    clock = [100.0]
    monkeypatch.setattr(replay, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    replayer = SimpleNamespace(writes=SimpleNamespace(window=0.0), _call_seconds=0.0,
                               _answered_at=0.0, _sending=4)
    waits = []
    for gap in (0.5, 0.001, 0.001, 0.3, 0.002):
        clock[0] += gap
        replay.Replayer._share_commits(replayer, 1.0)
        waits.append(replayer.writes.window)
    assert waits == [0.0, replay.COMMIT_WAIT, replay.COMMIT_WAIT, 0.0, replay.COMMIT_WAIT]
    replayer._sending = 0
    clock[0] += 0.001
    replay.Replayer._share_commits(replayer, 1.0)
    assert replayer.writes.window == 0.0
