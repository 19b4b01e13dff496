"""The store's SQL for the ledger's own cost budget: one ceiling for every runner on the ledger.

A person sets it (``batchjson budget --cost 50``). Every runner reserves each call's worst case
on it in the transaction that writes the call's receipt and claim, and settles it to what the
call cost in the transaction that completes the receipt; a call whose runner died is settled
at its worst case when its claim is taken over. So what every host has spent plus what its
calls in flight may still cost never passes the ceiling, whichever host made the calls. The
ledger keeps the sums (``spent``, ``reserved``) beside the ceiling; each receipt keeps what was
reserved for it (``attempts.reserved``).
"""

from __future__ import annotations

from typing import Any

from .store_base import StoreBase, Tx

# One row (id 1) while a budget is set.
RESERVE_SQL = ("UPDATE budget SET reserved = reserved + ? WHERE id = 1 "
               "AND spent + reserved + ? <= cost RETURNING id")

# Settling one receipt (before its status changes): what it held comes off ``reserved`` if it
# was in flight; its charge goes to ``spent``, less what was charged when it was abandoned.
SETTLE_SQL = (
    "UPDATE budget SET "
    "reserved = CASE WHEN reserved > a.held THEN reserved - a.held ELSE 0 END, "
    "spent = spent + ? - a.charged FROM (SELECT "
    "CASE WHEN status = 'in_flight' THEN reserved ELSE 0 END AS held, "
    "CASE WHEN status = 'abandoned' THEN reserved ELSE 0 END AS charged FROM attempts "
    "WHERE id = ? AND reserved IS NOT NULL AND status IN ('in_flight', 'abandoned')) AS a "
    "WHERE budget.id = 1")

# Receipts of a runner that is gone are charged their worst case: nothing says they cost less.
ABANDON_SQL = ("UPDATE budget SET reserved = CASE WHEN reserved > ? THEN reserved - ? ELSE 0 "
               "END, spent = spent + ? WHERE id = 1")


class BudgetStore(StoreBase):
    """The ledger's cost budget: set and read by a person, reserved and settled by calls."""

    def _shared_budget(self) -> dict[str, Any] | None:
        """The ledger's budget (cost, spent, reserved, left, set_at, set_by), or None."""
        rows = self._read("SELECT cost, spent, reserved, set_at, set_by FROM budget WHERE id = 1")
        if not rows:
            return None
        row = rows[0]
        left = max(0.0, row["cost"] - row["spent"] - row["reserved"])
        return {"cost": row["cost"], "spent": row["spent"], "reserved": row["reserved"],
                "left": left, "set_at": row["set_at"], "set_by": row["set_by"]}

    def _set_shared_budget(self, cost: float | None, *, by: str, stamp: str) -> None:
        """Set the ceiling (what was spent under an earlier one still counts), or with
        ``cost=None`` remove the budget."""
        with self.transaction() as tx:
            if cost is None:
                self._exec(tx, "DELETE FROM budget WHERE id = 1")
                self._exec(tx, "UPDATE attempts SET reserved = NULL WHERE reserved IS NOT NULL "
                           "AND status IN ('in_flight', 'abandoned')")
                return
            self._exec(tx, "INSERT INTO budget(id, cost, spent, reserved, set_at, set_by) "
                       "VALUES (1, ?, 0, 0, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                       "cost = excluded.cost, set_at = excluded.set_at, "
                       "set_by = excluded.set_by", (cost, stamp, by))

    def _reserve_shared(self, tx: Tx, attempt_id: int, amount: float | None,
                        budgeted: bool | None = None) -> bool:
        """Reserve ``amount`` (a call's worst case; None: not priced) for the receipt just
        written, in ``tx``. False when the ledger has a budget that cannot hold it (or it has
        one and the call is not priced); with no budget, the receipt holds nothing.
        ``budgeted``: whether the ledger has a budget, if the caller read it in ``tx``."""
        if budgeted is not False:
            if amount is not None and self._exec(tx, RESERVE_SQL, (amount, amount)).fetchall():
                return True
            if self._exec(tx, "SELECT 1 FROM budget WHERE id = 1").fetchone() is not None:
                return False
        if amount is not None:
            self._exec(tx, "UPDATE attempts SET reserved = NULL WHERE id = ?", (attempt_id,))
        return True

    def _settle_shared(self, tx: Tx, attempt_id: int, charge: float) -> None:
        """Charge a receipt's call to the ledger's budget as it completes (before its status
        changes): ``charge`` is what it cost, or its worst case when that is unknown."""
        self._exec(tx, SETTLE_SQL, (charge, attempt_id))

    def _charge_abandoned(self, tx: Tx, held: float) -> None:
        if held:
            self._exec(tx, ABANDON_SQL, (held, held, held))
