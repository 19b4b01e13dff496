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
        self._scheduled = False
        self.flushes = 0

    async def run(self, op: Op) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((op, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending, []
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
