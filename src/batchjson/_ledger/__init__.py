"""The ledger: the one source of truth for batches, receipts and accepted values.

This package owns everything about it. ``store.Store`` holds every SQL statement batchjson runs
(its ``store_*`` modules, by what they serve); ``sqlite.SQLiteStore`` connects it to a SQLite
file and holds what is SQLite's own (PRAGMAs, WAL, the one schema and its version);
``postgres.PostgresStore`` to a PostgreSQL database that runners on many hosts share. Beside the
store, and importing it (never the facade), are the ledger's rows as values (``records``),
claims (``claims``), the accounts (``accounts``), evidence (``evidence``), forgetting
(``forgetting``), batchjson's own export (``export``), where imported attempts go
(``import_revisions``) and the other ledger a merge reads (``merge``). ``ledger.Ledger`` is the
facade over the store, and pack-size advice (``advice``) is a read-only view over it.
No module outside this package holds SQL.

It stores what it is given (verdicts, costs): it judges nothing, so it never imports acceptance
(re-judging, import and merge judge in the session: ``rejudge``, ``recovery``, ``merge``). May
import providers, content, fingerprints and the flat modules; never the replay loop, the session
or a face.
"""

from .ledger import Ledger

__all__ = ["Ledger"]
