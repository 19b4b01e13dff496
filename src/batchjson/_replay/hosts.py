"""This session as one live host of its ledger, so that the hosts on one account divide its rate
limits instead of each sending at all of them."""

from __future__ import annotations

from .._errors import LedgerError
from .._ledger.store import Store
from .._ledger.store_base import Tx
from .._ledger.store_calls import Owner
from .pacing import Pacer

COUNT_SECONDS = 1.0  # the longest a run paces to a stale count of the hosts


class HostShare:
    """One session's row among the ledger's hosts, and its pacer's share of the limits."""

    def __init__(self, store: Store, session_id: str, pacer: Pacer) -> None:
        self.store = store
        self.pacer = pacer
        self.owner = Owner.start(session_id)

    def count(self, tx: Tx) -> None:
        """Renew this host's row in ``tx`` and take its share of the hosts counted alive."""
        self.pacer.share(self.store.hosts(tx, self.owner))

    def join(self) -> None:
        """Counted from the session's start, so hosts started together pace to their share from
        their first call; a ledger that cannot be written now is left to the first run to report."""
        try:
            with self.store.transaction(calls=True) as tx:
                self.count(tx)
        except LedgerError:
            pass

    def leave(self) -> None:
        """The session ends: the other hosts take its share at their next count."""
        self.owner.stop()
        try:
            with self.store.transaction(calls=True) as tx:
                self.store.hosts(tx, self.owner, leaving=True)
        except LedgerError:
            pass  # its row is dropped as a gone host's anyway
