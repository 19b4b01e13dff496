"""Group commit: ledger writes from concurrent calls share one transaction per loop turn.

Sixty-four calls finishing together would otherwise pay sixty-four commits on the event
loop. Each write still runs whole or not at all, and its caller resumes only after the
transaction holding it has committed, so "receipt before call" and "accepted attempt and
checkpoint together" hold exactly as with one transaction per write.

A store whose commits wait on a server (``Store.commits_off_loop``: PostgreSQL) commits each group
on a thread of its own, one group at a time and in order, so the event loop goes on sending and
judging calls meanwhile; the writes queued in the meantime form the next group.

If one write fails on its own (a bug in that write), the group is undone and each write runs again
in a transaction of its own. If the ledger itself fails (disk full, I/O error, read-only file,
locked past the busy timeout) every queued write fails with that LedgerError, and so does every
later one: the run stops before any further call.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._errors import LedgerError
from .._ledger.store import Store
from .._ledger.store_base import Later

Op = Callable[[Any], Any]  # a write: given the store's open transaction, it runs there
Outcome = tuple[asyncio.Future | None, Any, BaseException | None]
Committed = tuple[list[Outcome], LedgerError | None]  # and the ledger's failure, if it failed


class _Landing:
    """A group being committed off the loop: its outcomes once ``ready``."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.committed: Committed = ([], None)
        self.handed_out = False


class GroupCommit:
    """Queue ledger operations; commit them together on the next turn of the event loop."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: list[tuple[Op, asyncio.Future | None]] = []
        self._failures: list[BaseException] = []  # every failed write, awaited or not
        self._scheduled = False
        self._landing: _Landing | None = None  # the group committing off the loop, if any
        self._thread: ThreadPoolExecutor | None = None
        self.broken: LedgerError | None = None
        self.flushes = 0

    def submit(self, op: Op) -> asyncio.Future:
        """Queue a write; ``raise_failures`` reports it if it fails and nobody awaits it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self.broken is not None:  # the ledger failed: nothing more is written or sent
            future.set_exception(self.broken)
            future.exception()
            return future
        self._pending.append((op, future))
        self._schedule()
        return future

    def queue(self, op: Op) -> None:
        """Queue a write nobody waits for (a record of a judged return, a released claim): no
        future is made for it; ``raise_failures`` reports it if it fails."""
        if self.broken is not None:
            self._failures.append(self.broken)
            return
        self._pending.append((op, None))
        self._schedule()

    async def run(self, op: Op) -> Any:
        """Queue a write and wait until the transaction holding it has committed."""
        return await self.submit(op)

    def flush_now(self) -> None:
        """Commit whatever is queued, now (the run is ending or unwinding), after the group
        committing off the loop, if any."""
        if self._landing is not None:
            self._land(self._landing)
        self._scheduled = False
        live = self._take()
        if live:
            self._hand_out(self._commit(live))

    def close(self) -> None:
        """Commit whatever is queued; the thread of off-loop commits ends."""
        self.flush_now()
        if self._thread is not None:
            self._thread.shutdown(wait=False)
            self._thread = None

    def raise_failures(self) -> None:
        """Raise the ledger's failure, else the first write that failed: a run never ends as if
        its records were kept."""
        failures, self._failures = self._failures, []
        if self.broken is not None:
            raise self.broken
        if failures:
            raise failures[0]

    def _schedule(self) -> None:
        if not self._scheduled and self._landing is None:  # a landing group schedules the next
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _take(self) -> list[tuple[Op, asyncio.Future | None]]:
        batch, self._pending = self._pending, []
        return [(op, fut) for op, fut in batch  # a cancelled waiter's write never runs
                if fut is None or not fut.cancelled()]

    def _flush(self) -> None:
        self._scheduled = False
        live = self._take()
        if not live:
            return
        if not self._store.commits_off_loop:
            self._hand_out(self._commit(live))
            return
        landing = self._landing = _Landing()
        loop = asyncio.get_running_loop()

        def commit() -> None:
            landing.committed = self._commit(live)
            landing.ready.set()

        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="batchjson-commit")
        done = loop.run_in_executor(self._thread, commit)
        done.add_done_callback(lambda _: self._landed(landing))

    def _landed(self, landing: _Landing) -> None:
        if not landing.handed_out:  # else flush_now handed it out already
            self._land(landing)
        if self._pending:
            self._schedule()

    def _land(self, landing: _Landing) -> None:
        landing.ready.wait()
        self._landing = None
        landing.handed_out = True
        self._hand_out(landing.committed)

    def _commit(self, live: list[tuple[Op, asyncio.Future | None]]) -> Committed:
        """Commit the group (on the loop, or off it): each write's outcome, never raised."""
        try:
            return self._together(live), None
        except LedgerError as exc:
            return [(fut, None, exc) for _, fut in live], exc
        except Exception:  # one write failed: undo them all, then run each on its own
            return self._one_by_one(live)

    def _hand_out(self, committed: Committed) -> None:
        """On the loop: each waiter resumes with its write's outcome."""
        outcomes, broken = committed
        if broken is not None and self.broken is None:
            self.broken = broken
        self.flushes += 1
        for fut, result, error in outcomes:
            if error is not None:
                self._failures.append(error)
            if fut is None or fut.done():
                continue
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)
                fut.exception()  # reported by raise_failures, not as "never retrieved"

    def _together(self, live: list[tuple[Op, asyncio.Future | None]]) -> list[Outcome]:
        """The common case: every write in one transaction, no per-write savepoints. The
        outcomes are handed out only after COMMIT has returned."""
        with self._store.call_transaction() as db:
            results = [op(db) for op, _ in live]
            results = [_outcome(result) for result in results]  # every write sent first
        return [(fut, result, None) for (_, fut), result in zip(live, results, strict=True)]

    def _one_by_one(self, live: list[tuple[Op, asyncio.Future | None]]) -> Committed:
        """After a failure: each write whole or not at all, in a transaction of its own."""
        outcomes: list[Outcome] = []
        broken = self.broken
        for op, fut in live:
            if broken is not None:
                outcomes.append((fut, None, broken))
                continue
            try:
                with self._store.call_transaction() as db:
                    result = _outcome(op(db))
                outcomes.append((fut, result, None))
            except LedgerError as exc:
                broken = exc
                outcomes.append((fut, None, exc))
            except Exception as exc:  # this write alone failed and is reported to its caller
                outcomes.append((fut, None, exc))
        return outcomes, broken


def _outcome(result: Any) -> Any:
    return result.result() if isinstance(result, Later) else result
