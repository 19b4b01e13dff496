"""Group commit: ledger writes from concurrent calls share one transaction per loop turn.

Sixty-four calls finishing together would otherwise pay sixty-four SQLite commits on the event
loop. Each write still runs whole or not at all, and its caller resumes only after the
transaction holding it has committed, so "receipt before call" and "accepted attempt and
checkpoint together" hold exactly as with one transaction per write.

If one write fails on its own (a bug in that write), the group is undone and each write runs again
in a transaction of its own. If the ledger itself fails (disk full, I/O error, read-only file,
locked past the busy timeout) every queued write fails with that LedgerError, and so does every
later one: the run stops before any further call.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import LedgerError
from ._ledger import Ledger

Op = Callable[[sqlite3.Connection], Any]
Outcome = tuple[asyncio.Future | None, Any, BaseException | None]


class GroupCommit:
    """Queue ledger operations; commit them together on the next turn of the event loop."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._pending: list[tuple[Op, asyncio.Future | None]] = []
        self._failures: list[BaseException] = []  # every failed write, awaited or not
        self._scheduled = False
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
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def queue(self, op: Op) -> None:
        """Queue a write nobody waits for (a record of a judged return, a released claim): no
        future is made for it; ``raise_failures`` reports it if it fails."""
        if self.broken is not None:
            self._failures.append(self.broken)
            return
        self._pending.append((op, None))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def run(self, op: Op) -> Any:
        """Queue a write and wait until the transaction holding it has committed."""
        return await self.submit(op)

    def flush_now(self) -> None:
        """Commit whatever is queued, now (the run is ending or unwinding)."""
        self._flush()

    def raise_failures(self) -> None:
        """Raise the ledger's failure, else the first write that failed: a run never ends as if
        its records were kept."""
        failures, self._failures = self._failures, []
        if self.broken is not None:
            raise self.broken
        if failures:
            raise failures[0]

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        live = [(op, fut) for op, fut in batch  # a cancelled waiter's write never runs
                if fut is None or not fut.cancelled()]
        if not live:
            return
        try:
            outcomes = self._together(live)
        except LedgerError as exc:
            self.broken = exc
            outcomes = [(fut, None, exc) for _, fut in live]
        except Exception:  # one write failed: undo them all, then run each on its own
            outcomes = self._one_by_one(live)
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
        with self._ledger.transaction() as db:
            results = [op(db) for op, _ in live]
        return [(fut, result, None) for (_, fut), result in zip(live, results, strict=True)]

    def _one_by_one(self, live: list[tuple[Op, asyncio.Future | None]]) -> list[Outcome]:
        """After a failure: each write whole or not at all, in a transaction of its own."""
        outcomes: list[Outcome] = []
        for op, fut in live:
            if self.broken is not None:
                outcomes.append((fut, None, self.broken))
                continue
            try:
                with self._ledger.transaction() as db:
                    result = op(db)
                outcomes.append((fut, result, None))
            except LedgerError as exc:
                self.broken = exc
                outcomes.append((fut, None, exc))
            except Exception as exc:  # this write alone failed and is reported to its caller
                outcomes.append((fut, None, exc))
        return outcomes


class Checkpointer:
    """Copies the ledger's WAL back into its file on a thread of its own while a run goes.

    SQLite's automatic checkpoint runs inside the COMMIT that crosses 1,000 WAL pages: a copy
    and two fsyncs, stalling the event loop (and every call waiting on it) for milliseconds
    several times a run. Here a thread with its own connection runs a passive checkpoint (it
    never blocks a writer) every ``interval`` seconds, and sqlite3 lets go of the GIL while it
    works; the loop's commits checkpoint only every ``RUN_AUTOCHECKPOINT`` pages, finding most
    of them copied already. What the WAL holds is as durable as before; a
    checkpoint that fails (full disk) is left to the next one, and to the commits, which
    report the ledger's failure themselves.
    """

    def __init__(self, ledger: Ledger, interval: float = 0.2) -> None:
        self._ledger = ledger
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Checkpointer:
        if self._ledger.path is not None:
            try:  # the file the ledger has open, wherever the working directory is now
                file = self._ledger._rows("PRAGMA database_list")[0]["file"]
                if not file:
                    return self
                self._ledger.autocheckpoint(RUN_AUTOCHECKPOINT)
            except sqlite3.Error:  # a ledger that cannot take the setting checkpoints as before
                return self
            self._thread = threading.Thread(target=self._serve, args=(file,),
                                            name="batchjson-checkpoint", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread; commits checkpoint for themselves again."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            self._ledger.autocheckpoint(DEFAULT_AUTOCHECKPOINT)
        except sqlite3.Error:  # the ledger was closed meanwhile: nothing to restore
            pass

    def _serve(self, file: str) -> None:
        try:  # mode=rw: a checkpointer never creates a file
            db = sqlite3.connect(Path(file).as_uri() + "?mode=rw", uri=True, timeout=0,
                                 isolation_level=None)
        except sqlite3.Error:
            return
        try:
            while not self._stop.wait(self._interval):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    pass
        finally:
            db.close()


DEFAULT_AUTOCHECKPOINT = 1000  # SQLite's own default, in WAL pages
# While a run goes: the thread copies pages alongside the commits, but the WAL only starts over
# once a checkpoint has copied every frame with no commit in between, which a busy run never
# leaves time for. So a commit still checkpoints, rarely, and then finds little left to copy.
RUN_AUTOCHECKPOINT = 4000
