"""The ledger: the one source of truth for batches, receipts and accepted values.

This package owns everything about it. ``store.Store`` holds every SQL statement batchjson runs
(its ``store_*`` modules, by what they serve); ``sqlite.SQLiteStore`` connects it to a SQLite
file and holds what is SQLite's own (PRAGMAs, WAL, the one schema and its version);
``postgres.PostgresStore`` to a PostgreSQL database that runners on many hosts share. Beside the
store, and importing it (never the facade), are the ledger's rows as values (``records``),
claims (``claims``), re-judging (``rejudge``), forgetting (``forgetting``), recovery: import
and export (``recovery``), where imported attempts go (``import_revisions``) and merging
(``merge``). ``ledger.Ledger`` is the facade over the store. It stores what it is given (costs,
floors, verdicts, masked URLs): the accounts, evidence and advice that price it sit above, in
the session. No module outside this package holds SQL.

May import acceptance (to re-judge stored returns), content, fingerprints and the flat modules;
never the providers, the replay loop, the session or a face.
"""

from .ledger import Ledger

__all__ = ["Ledger"]
