"""Group commit: ledger writes from concurrent calls share one transaction per loop turn.

Sixty-four calls finishing together would otherwise pay sixty-four SQLite commits on the event
loop. Each write still runs whole or not at all (a savepoint each), and its caller resumes only
after the transaction holding it has committed, so "receipt before call" and "accepted attempt
and checkpoint together" hold exactly as with one transaction per write.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from .ledger import Ledger

Op = Callable[[sqlite3.Connection], Any]


class GroupCommit:
    """Queue ledger operations; flush them together on the next turn of the event loop."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._pending: list[tuple[Op, asyncio.Future]] = []
        self._unawaited: list[asyncio.Future] = []
        self._scheduled = False
        self.flushes = 0

    def submit(self, op: Op) -> asyncio.Future:
        """Queue a write for the next flush; ``raise_failures`` reports it if nobody awaits it."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((op, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    async def run(self, op: Op) -> Any:
        """Queue a write and wait until the transaction holding it has committed."""
        return await self.submit(op)

    def flush_now(self) -> None:
        """Commit whatever is queued, now (the run is ending or unwinding)."""
        self._flush()

    def raise_failures(self) -> None:
        for future in self._unawaited:
            if future.done() and not future.cancelled() and future.exception() is not None:
                raise future.exception()
        self._unawaited.clear()

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
        self._unawaited.extend(fut for _, fut in batch)
        live = [(op, fut) for op, fut in batch if not fut.cancelled()]  # cancelled: never ran
        if not live:
            return
        outcomes: list[tuple[asyncio.Future, Any, BaseException | None]] = []
        try:
            with self._ledger.transaction() as db:
                for op, fut in live:
                    db.execute("SAVEPOINT write")
                    try:
                        outcomes.append((fut, op(db), None))
                    except Exception as exc:  # this write alone is undone and reported
                        db.execute("ROLLBACK TO write")
                        outcomes.append((fut, None, exc))
                    db.execute("RELEASE write")
        except Exception as exc:  # the commit itself failed: nothing in it happened
            for _, fut in live:
                if not fut.done():
                    fut.set_exception(exc)
            return
        self.flushes += 1
        for fut, result, error in outcomes:
            if fut.done():
                continue
            if error is None:
                fut.set_result(result)
            else:
                fut.set_exception(error)
