"""The store: every statement batchjson runs on a ledger, grouped by what it serves, each concept
building on those it needs: a run's (``store_runs``), a call's (``store_calls``), a job's
(``store_jobs``), a person's (``store_admin``: import, export, merge, forget), the accounts'
(``store_accounts``). ``sqlite.SQLiteStore`` and ``postgres.PostgresStore`` connect it."""

from __future__ import annotations

from .store_accounts import AccountStore
from .store_admin import AdminStore


class Store(AdminStore, AccountStore):
    """Every read and write of the ledger; a subclass connects it to one database."""
