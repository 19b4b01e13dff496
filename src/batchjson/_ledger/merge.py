"""The other ledger a merge brings in: a file (opened read-only, ``sqlite.py``) or a database
(``postgres.py``), refused before anything is written when it is this ledger or holds an
unfinished batch job (only its own job row can collect what the job answers). The session
rechecks its attempts (``_session/merge.py``); the store writes them (``store_merge.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._errors import LedgerError
from .._secrets import public_url
from .records import ledger_path
from .sqlite import _read_ledger_file
from .store import Store
from .unfinished import _unfinished_jobs


def other_tables(store: Store, other: str | Path) -> tuple[dict[str, Any], str, str]:
    """The other ledger's tables (a ledger file or a ``postgresql://`` URL), with how the report
    names it and the label its merged rows keep; refused when it is this ledger or holds an
    unfinished batch job."""
    if isinstance(other, str) and isinstance(ledger_path(other), str):
        from .postgres import PostgresStore

        shown = public_url(other, user=False)
        if other == getattr(store, "url", None):
            raise LedgerError(f"{shown} is this ledger; merge another ledger into it", path=shown)
        theirs = PostgresStore(other)
        try:
            tables = theirs._tables()
        finally:
            theirs._close()
        _refuse_unfinished(tables, shown)
        return tables, shown, shown
    path = Path(other)
    if store.path is not None and path.exists() and path.resolve() == store.path.resolve():
        raise LedgerError(f"{path} is this ledger; merge another ledger into it", path=path)
    tables = _read_ledger_file(path)
    _refuse_unfinished(tables, str(path))
    return tables, str(path), path.name


def _refuse_unfinished(tables: dict[str, Any], shown: str) -> None:
    """A job of the other ledger that may still answer is collected there, by its own job row:
    merged here, its receipts would stay in flight for ever. Refused before anything is
    written."""
    names = {b["id"]: b["name"] for b in tables["batches"]}
    problem = _unfinished_jobs([{**dict(j), "batch": names.get(j["batch_id"])}
                               for j in tables["jobs"]], f"the ledger {shown}",
                              "merge it")
    if problem:
        raise LedgerError(problem, path=shown)
