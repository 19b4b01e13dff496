"""The store's SQL for the ledger's live hosts: who paces to a share of the account's limits.

Every session on a ledger is one host of it: a row (``hosts``) with a lease, renewed while
the session runs, as claims are. The sessions alive on a ledger divide the account's rate
limits between them; a host is gone as a claim's owner is (``claims._owner_gone``: on this
machine when its process or session has ended, on any machine when its lease has expired),
and its row is deleted by the next host that counts.
"""

from __future__ import annotations

from .claims import Owner, _owner_gone
from .records import now
from .store_base import StoreBase, Tx

JOIN_SQL = ("INSERT INTO hosts(owner, host, pid, lease_expires_at, joined_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET "
            "lease_expires_at = excluded.lease_expires_at")


class HostStore(StoreBase):
    """The live hosts of the ledger, each renewing its own row."""

    def hosts(self, tx: Tx, owner: Owner, *, leaving: bool = False) -> int:
        """Renew ``owner``'s row (written if new), or delete it when it is ``leaving`` (the
        other hosts take its share at their next count); then count the hosts alive. The rows
        of hosts that are gone are deleted (in one order, so hosts deleting the same rows never
        wait on each other in a circle)."""
        at = self._clock(tx)
        if leaving:
            self._exec(tx, "DELETE FROM hosts WHERE owner = ?", (owner.id,))
        else:
            self._exec(tx, JOIN_SQL, (owner.id, owner.host, owner.pid,
                                      at + self.lease_seconds, now()))
        rows = self._exec(tx, "SELECT owner, host, pid, lease_expires_at FROM hosts").fetchall()
        gone = sorted(row[0] for row in rows if row[0] != owner.id
                      and _owner_gone(row[0], row[1], row[2], row[3], at))
        for name in gone:
            self._exec(tx, "DELETE FROM hosts WHERE owner = ?", (name,))
        return len(rows) - len(gone)
