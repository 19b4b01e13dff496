"""The ledger: the one source of truth for batches, receipts and accepted values.

``store.Store`` holds every SQL statement batchjson runs, grouped by what it serves (its
``store_*`` modules); ``sqlite.SQLiteStore`` and ``postgres.PostgresStore`` connect it to one
database; ``ledger.Ledger`` is the facade over it. It stores what it is given (costs, verdicts,
masked URLs) and judges and prices nothing: that sits above it, in the session.
"""

from .ledger import Ledger

__all__ = ["Ledger"]
