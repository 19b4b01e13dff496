"""Group commit: ledger writes from concurrent calls share one transaction per loop turn, or per
``window`` when the writes of other calls are due within it.

Each write's caller resumes only after the transaction holding it committed, so "receipt before
call" holds; a write's ``Later`` is read once every write is sent, and a ``Later`` it gives once
the group has committed. One failing write undoes the group and each runs again alone; a failing
ledger fails every queued and later write, so no call follows a lost record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .._errors import LedgerError
from .._ledger.store import Store
from .._ledger.store_base import Later

Op = Callable[[Any], Any]  # a write: given the store's open transaction, it runs there
Outcome = tuple[asyncio.Future | None, Any, BaseException | None]


class GroupCommit:
    """Queue ledger operations; commit them together on the next turn of the event loop, or
    ``window`` seconds after the first of them: a transaction's fixed cost (BEGIN, COMMIT, the
    pages every write touches) is then shared by the writes of the calls that end meanwhile."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: list[tuple[Op, asyncio.Future | None]] = []
        self._failures: list[BaseException] = []  # every failed write, awaited or not
        self._scheduled: asyncio.Handle | None = None
        self.window = 0.0  # seconds a write waits for others to share its transaction
        self.broken: LedgerError | None = None
        self.flushes = 0

    def submit(self, op: Op) -> asyncio.Future:
        """Queue a write: awaited, the transaction holding it has committed."""
        future = asyncio.get_running_loop().create_future()
        self.queue(op, future)
        return future

    def queue(self, op: Op, future: asyncio.Future | None = None) -> None:
        """Queue a write; with no ``future``, one nobody waits for (a record of a judged return,
        a released claim). ``raise_failures`` reports it if it fails."""
        if self.broken is not None:  # the ledger failed: nothing more is written or sent
            _hand_out(future, None, self.broken)
            return
        self._pending.append((op, future))
        if self._scheduled is None:
            loop = asyncio.get_running_loop()
            self._scheduled = (loop.call_later(self.window, self.flush_now) if self.window > 0
                               else loop.call_soon(self.flush_now))

    def raise_failures(self) -> None:
        """Raise the ledger's failure, else the first failed write: no run ends as if kept."""
        failures, self._failures = self._failures, []
        if self.broken is not None:
            raise self.broken
        if failures:
            raise failures[0]

    def flush_now(self) -> None:
        """Commit whatever is queued (when its window ends, or now: the run is unwinding)."""
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
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
            _hand_out(fut, result, error)

    def _together(self, live: list[tuple[Op, asyncio.Future | None]]) -> list[Outcome]:
        """Every write in one transaction, no savepoints; outcomes handed out after COMMIT."""
        with self._store.transaction(calls=True) as db:
            results = [op(db) for op, _ in live]
            for i, result in enumerate(results):  # each outcome read once every write is sent
                if isinstance(result, Later):
                    results[i] = result()
        return [_committed(fut, result) for (_, fut), result in zip(live, results, strict=True)]

    def _one_by_one(self, live: list[tuple[Op, asyncio.Future | None]]) -> list[Outcome]:
        """After a failure: each write whole or not at all, in a transaction of its own."""
        outcomes: list[Outcome] = []
        for op, fut in live:
            if self.broken is not None:
                outcomes.append((fut, None, self.broken))
                continue
            outcomes.append(self._alone(op, fut))
        return outcomes

    def _alone(self, op: Op, fut: asyncio.Future | None) -> Outcome:
        """One write in a transaction of its own (:func:`committed`)."""
        try:
            return _committed(fut, committed(self._store, op))
        except LedgerError as exc:
            self.broken = exc
            return fut, None, exc
        except Exception as exc:  # this write alone failed and is reported to its caller
            return fut, None, exc


def committed(store: Store, write: Op, *, calls: bool = True) -> Any:
    """``write`` in a transaction of its own (``calls``: side by side with other hosts' calls;
    else one that reads before it writes), run again while it fails only for meeting another
    host's write at that moment (``Store.conflicts``: a deadlock on PostgreSQL), up to
    :data:`CONFLICT_TRIES` times, then a LedgerError: never a database's own exception."""
    tries = 1
    while True:
        try:
            with store.transaction(calls=calls) as db:
                result = write(db)
                return result() if isinstance(result, Later) else result
        except store.conflicts as exc:
            if tries >= CONFLICT_TRIES:
                raise LedgerError(f"a write met other hosts' writes {tries} times over (a "
                                  "deadlock each time) and was not recorded; the run stopped "
                                  "before any further call: re-run to resume", cause=exc
                                  ) from exc
            tries += 1


CONFLICT_TRIES = 3  # a write that deadlocks alone, against another host's, is run this often


def _committed(fut: asyncio.Future | None, result: Any) -> Outcome:
    """A write's outcome read once its group has committed: a failure there is its own."""
    try:
        return fut, result() if isinstance(result, Later) else result, None
    except Exception as exc:  # noqa: BLE001 - reported to its caller, as a write's own failure
        return fut, None, exc


def _hand_out(fut: asyncio.Future | None, result: Any, error: BaseException | None) -> None:
    """A write's outcome to its waiter, if any; a failure is reported by ``raise_failures``
    (which raises a broken ledger first), not as "never retrieved"."""
    if fut is None or fut.done():
        return
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)
        fut.exception()
