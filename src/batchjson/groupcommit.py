"""Group commit: ledger writes from concurrent calls share one transaction per loop turn.

Sixty-four calls finishing together would otherwise pay sixty-four SQLite commits on the event
loop. Each write still runs whole or not at all (if any write fails, all are undone and each runs
again in a transaction of its own), and its caller resumes only after the transaction holding it
has committed, so "receipt before call" and "accepted attempt and checkpoint together" hold
exactly as with one transaction per write.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from .ledger import Ledger

Op = Callable[[sqlite3.Connection], Any]
Outcome = tuple[asyncio.Future, Any, BaseException | None]


class GroupCommit:
    """Queue ledger operations; flush them together on the next turn of the event loop.

    A write nobody waits for yet (the receipt of a call opened ahead, the record of a judged
    return) may wait up to ``linger`` seconds for company: fewer, larger transactions. A write
    somebody awaits, or :meth:`hurry`, brings the flush forward to the next turn.
    """

    def __init__(self, ledger: Ledger, linger: float = 0.005) -> None:
        self._ledger = ledger
        self._pending: list[tuple[Op, asyncio.Future]] = []
        self._failures: list[BaseException] = []  # every failed write, awaited or not
        self._scheduled: asyncio.Handle | asyncio.TimerHandle | None = None
        self._soon = False
        self.linger = linger
        self.flushes = 0

    def submit(self, op: Op, *, urgent: bool = True) -> asyncio.Future:
        """Queue a write; ``raise_failures`` reports it if nobody awaits it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((op, future))
        if urgent:
            self.hurry()
        elif self._scheduled is None:
            self._scheduled = loop.call_later(self.linger, self._flush)
        return future

    def hurry(self) -> None:
        """Flush on the next turn of the loop: somebody is waiting for a queued write."""
        if self._soon or not self._pending:
            return
        if self._scheduled is not None:
            self._scheduled.cancel()
        self._scheduled = asyncio.get_running_loop().call_soon(self._flush)
        self._soon = True

    async def run(self, op: Op) -> Any:
        """Queue a write and wait until the transaction holding it has committed."""
        return await self.submit(op)

    def flush_now(self) -> None:
        """Commit whatever is queued, now (the run is ending or unwinding)."""
        self._flush()

    def raise_failures(self) -> None:
        """Raise the first write that failed: a run never ends as if its records were kept."""
        failures, self._failures = self._failures, []
        if failures:
            raise failures[0]

    def _flush(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()  # flush_now() may run ahead of a scheduled flush
        self._scheduled, self._soon = None, False
        batch, self._pending = self._pending, []
        live = [(op, fut) for op, fut in batch if not fut.cancelled()]  # cancelled: never ran
        if not live:
            return
        try:
            outcomes = self._together(live)
        except Exception:  # one write failed: undo them all, then run each on its own
            outcomes = self._one_by_one(live)
        self.flushes += 1
        for fut, result, error in outcomes:
            if fut.done():
                continue
            if error is None:
                fut.set_result(result)
            else:
                self._failures.append(error)
                fut.set_exception(error)
                fut.exception()  # reported by raise_failures, not as "never retrieved"

    def _together(self, live: list[tuple[Op, asyncio.Future]]) -> list[Outcome]:
        """The common case: every write in one transaction, no per-write savepoints."""
        with self._ledger.transaction() as db:
            return [(fut, op(db), None) for op, fut in live]

    def _one_by_one(self, live: list[tuple[Op, asyncio.Future]]) -> list[Outcome]:
        """After a failure: each write whole or not at all, in a transaction of its own."""
        outcomes: list[Outcome] = []
        for op, fut in live:
            try:
                with self._ledger.transaction() as db:
                    outcomes.append((fut, op(db), None))
            except Exception as exc:  # this write alone failed and is reported to its caller
                outcomes.append((fut, None, exc))
        return outcomes
