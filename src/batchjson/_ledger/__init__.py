"""The ledger: the one source of truth for batches, receipts and accepted values.

This package owns everything about it. ``store.Store`` holds every SQL statement batchjson runs
(its ``store_*`` modules, by what they serve); ``sqlite.SQLiteStore`` connects it to a SQLite
file and holds what is SQLite's own (PRAGMAs, WAL, the one schema and its version);
``postgres.PostgresStore`` to a PostgreSQL database that runners on many hosts share. Beside the
store, and importing it (never the facade), are the ledger's rows as values (``records``),
claims (``claims``), forgetting (``forgetting``), batchjson's own export (``export``), where
imported attempts go (``import_revisions``) and the other ledger a merge reads (``merge``).
``ledger.Ledger`` is the facade over the store. No module outside this package holds SQL.

It stores what it is given (costs, floors, verdicts, masked URLs): it judges and prices nothing.
The accounts, evidence and advice that price it, and the re-judging, import and merge that
judge, sit above it in the session. May import content, fingerprints and the flat modules;
never acceptance, the providers, the replay loop, the session or a face.
"""

from .ledger import Ledger

__all__ = ["Ledger"]
