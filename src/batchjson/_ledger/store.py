"""The store: the one owner of the ledger's SQL, as the dbos system database owns its own.

``Store`` is every statement batchjson runs on a ledger, grouped by what it serves (the
``store_*`` modules): a run's batches, revisions, requests and accepted values
(``store_runs``), the writes of each call and its claim (``store_calls``), imports and the
export (``store_imports``), merging and forgetting (``store_merge``), the accounts and advice
(``store_views``), the ledger's own cost budget (``store_budget``), provider batch jobs
(``store_jobs``), the live hosts that share the rate limits (``store_hosts``). Each kind of write is
one method: those that take ``tx`` run inside the caller's transaction (so the group commit
can put many calls' writes in one), the others open their own. A store for one database says
how to talk to it: ``sqlite.SQLiteStore``, ``postgres.PostgresStore``.
"""

from __future__ import annotations

from .store_calls import CallStore
from .store_hosts import HostStore
from .store_imports import ImportStore
from .store_jobs import JobStore
from .store_merge import MergeStore
from .store_runs import RunStore
from .store_views import ViewStore


class Store(HostStore, ImportStore, JobStore, CallStore, RunStore, MergeStore, ViewStore):
    """Every read and write of the ledger; a subclass connects it to one database."""
