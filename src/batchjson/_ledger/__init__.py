"""The ledger: the one source of truth for batches, receipts and accepted values. It stores what
it is given (costs, verdicts, masked URLs) and judges and prices nothing: ``store.Store`` holds
its SQL, ``sqlite`` and ``postgres`` connect it to one database, ``ledger.Ledger`` is its facade.
"""

from .ledger import Ledger

__all__ = ["Ledger"]
