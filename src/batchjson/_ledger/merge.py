"""Merging another ledger into this one, so every attempt ever made stays in one account: the
other ledger read, refused when it cannot be merged (``_session/merge.py`` rechecks it).

Attempts are matched by ``uid`` (unique across ledgers), revisions by (batch name, fingerprint),
requests by (revision, key) and validators by (name, fingerprint), so merging the same file twice
changes nothing. The other file is opened read-only; everything is written in one transaction.
A ledger with an unfinished batch job is refused (collect or cancel it there first): only its
own job row can collect what the job answers. A revision another ledger had forgotten stays
forgotten here, under a copy of its record; one forgotten here owes again when merged work on it
started or ended after its forgetting. A merge is an import: each accepted attempt of the other
ledger is rechecked as import rechecks a receipt (``_session/recovery.py``: its key, coverage,
identity, schema, the validator when given) and its stored values must follow from its raw
return; one that does not is merged as rejected, its values not admitted, and named in the
report (ours are never touched). The statements are the store's (``store_merge.py``); the
other ledger is read by ``sqlite.py`` (a file) or ``postgres.py`` (a database).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._errors import LedgerError
from .._providers.masking import public_url
from .records import ledger_path
from .sqlite import read_ledger_file
from .store import Store
from .unfinished import unfinished_jobs


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
            tables = theirs.tables()
        finally:
            theirs.close()
        _refuse_unfinished(tables, shown)
        return tables, shown, shown
    path = Path(other)
    if store.path is not None and path.exists() and path.resolve() == store.path.resolve():
        raise LedgerError(f"{path} is this ledger; merge another ledger into it", path=path)
    tables = read_ledger_file(path)
    _refuse_unfinished(tables, str(path))
    return tables, str(path), path.name


def _refuse_unfinished(tables: dict[str, Any], shown: str) -> None:
    """A job of the other ledger that may still answer is collected there, by its own job row:
    merged here, its receipts would stay in flight for ever. Refused before anything is
    written."""
    names = {b["id"]: b["name"] for b in tables["batches"]}
    problem = unfinished_jobs([{**dict(j), "batch": names.get(j["batch_id"])}
                               for j in tables["jobs"]], f"the ledger {shown}",
                              "merge it")
    if problem:
        raise LedgerError(problem, path=shown)
