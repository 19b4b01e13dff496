"""The store: every statement batchjson runs on a ledger, as the dbos system database owns its
own. Its operations are grouped by what they serve, each concept building on those it needs: a
run's (``store_runs``), a call's (``store_calls``), a job's (``store_jobs``), a person's
(``store_admin``: import, export, merge, forget); and the accounts' reads (``store_accounts``).
A store for one database says how to talk to it: ``sqlite.SQLiteStore``, ``postgres.PostgresStore``.
"""

from __future__ import annotations

from .store_accounts import AccountStore
from .store_admin import AdminStore


class Store(AdminStore, AccountStore):
    """Every read and write of the ledger; a subclass connects it to one database."""
