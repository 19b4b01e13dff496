"""The ``Ledger`` facade over the store: what a person reads and decides (batchjson's own code
reads them here too), and the other ledger a merge reads. The public ``batchjson.Ledger``
(``_session/ledger.py``) extends it with what judges or prices: import, merge, the accounts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._checks import batch_name, is_amount
from .._content.tasks import Request
from .._errors import ConfigError, InvalidBatch, LedgerError
from .._money import cost_value
from .._secrets import public_url
from .records import Receipt, Revision, _who, ledger_path, now
from .sqlite import SQLiteStore, _read_ledger_file
from .store import Store
from .store_jobs import _unfinished_jobs


class Ledger:
    """The ledger's facade over its store: what it holds, never what that cost in dollars."""

    def __init__(self, path: str | Path | None = None, *, busy_timeout: float = 30.0,
                 lease: float | None = None) -> None:
        target = ledger_path(path)  # refused (ConfigError) before any file is made
        lease = _lease(lease)
        if isinstance(target, str):  # a postgresql:// URL
            from .postgres import PostgresStore

            self.path: Path | None = None
            self.store: Store = PostgresStore(target)
        else:
            self.path = target
            self.store = SQLiteStore(self.path, busy_timeout=busy_timeout)
        if lease is not None:
            self.store.lease_seconds = lease

    @property
    def where(self) -> str:
        """The ledger as batchjson shows it: its file, ``:memory:``, or its URL with any
        password masked."""
        return str(self.store._where)

    def __repr__(self) -> str:
        return f"Ledger({self.where})"

    def close(self) -> None:
        self.store._close()

    # -- reading -------------------------------------------------------------------------------
    def attempts(self, name: str, *, failed: bool = False) -> list[Receipt]:
        """Receipts of a batch in call order (every revision)."""
        return self.store._receipts(batch_name(name), failed=failed)

    def checkpoint(self, name: str, revision_id: int | None = None) -> dict[str, Any]:
        """task_id -> accepted item for one revision of the batch (default: its current one; a
        run reads its own, as another runner may have made a different one current)."""
        return self.store._checkpoint(batch_name(name), revision_id)

    def batch_names(self) -> list[str]:
        """Every batch's name, in the order they were made."""
        return self.store._batch_names()

    def revisions(self, name: str | None = None, *, fingerprint: str | None = None,
                  revision_id: int | None = None, status: str | None = None,
                  current: bool = False) -> list[Revision]:
        """Revisions in the order they were made: every one, or those of batch ``name``, of
        the content ``fingerprint``, with id ``revision_id``, of ``status`` (``open``,
        ``superseded``); ``current``: only the one each batch works on."""
        return self.store._revisions(batch_name(name), fingerprint=fingerprint,
                                     revision_id=revision_id, status=status, current=current)

    def leaves(self, revision_id: int) -> list[Request]:
        """The requests of a revision that are sent (split ones give way to their halves)."""
        return self.store._leaves(revision_id)

    def no_such_batch(self, name: str) -> str | None:
        """Why ``name`` is not a batch here, listing those that are; None when it is one."""
        names = self.store._batch_names()
        return None if batch_name(name) in names else (
            f"no batch named {name!r} in this ledger (batches: {', '.join(names) or 'none yet'})")

    def validator_usage(self) -> list[dict[str, Any]]:
        """Every recorded validator version, with the sorted names of batches run under it."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for r in self.store._validator_rows():
            row = out.setdefault((r["name"], r["version"]), {
                k: r[k] for k in ("name", "version", "fingerprint", "where_defined",
                                  "defined_at")} | {"batches": []})
            if r["batch"] is not None and r["batch"] not in row["batches"]:
                row["batches"].append(r["batch"])
        return list(out.values())

    # -- a person's decisions ---------------------------------------------------------------
    def budget(self) -> dict[str, Any] | None:
        """The ledger's own cost budget (cost, spent, reserved, left, set_at, set_by), or None.
        Every runner on the ledger holds it together, beside any budget of its own session."""
        return self.store._shared_budget()

    def set_budget(self, cost: float | None) -> None:
        """Set the ledger's cost budget in USD (what was spent under it still counts), or
        remove it with None. Runs reserve each call's worst case on it with the call's claim;
        a run already going when it is set refuses its next call (re-run it)."""
        cost = cost_value(cost)
        self.store._set_shared_budget(cost, by=_who(), stamp=now())

    def forget(self, name: str, *, via: str, by: str | None = None) -> dict[str, Any] | None:
        """Stop every revision of batch ``name`` from owing requests (only a person does:
        docs/design.md, "Forgetting"): the record (batch, revisions, requests, items, by, via,
        at), or None when it owes nothing. An unknown batch, or one a job may still answer
        (and bill), is an InvalidBatch."""
        problem = self.no_such_batch(name) or self.store._jobs_in_the_way(name, "forget it")
        if problem:
            raise InvalidBatch(problem)
        return self.store._forget(name, via=via, by=by or _who(), stamp=now())

    def export_receipts(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every attempt (of one batch, or all) as an importable receipt, in call order; an
        InvalidBatch while a job may still answer (its receipts would leave without it)."""
        problem = self.store._jobs_in_the_way(batch_name(name), "export it")
        if problem:
            raise InvalidBatch(problem)
        return self.store._export_receipts(name)


def _lease(value: Any) -> float | None:
    if value is not None and not is_amount(value, positive=True):
        raise ConfigError(f"lease must be a number of seconds > 0, got {value!r}; e.g. "
                          "Ledger('postgresql://host/db', lease=30)")
    return None if value is None else float(value)


def other_tables(store: Store, other: str | Path) -> tuple[dict[str, Any], str, str]:
    """The other ledger's tables (a ledger file or a ``postgresql://`` URL), how the report names
    it and the label its merged rows keep; refused when it is this ledger or holds a job that
    may still answer (collected only there: merged here, its receipts would stay in flight)."""
    if isinstance(other, str) and isinstance(ledger_path(other), str):
        from .postgres import PostgresStore

        shown = label = public_url(other, user=False)
        if other == getattr(store, "url", None):
            raise LedgerError(f"{shown} is this ledger; merge another ledger into it", path=shown)
        theirs = PostgresStore(other)
        try:
            tables = theirs._tables()
        finally:
            theirs._close()
    else:
        path = Path(other)
        if store.path is not None and path.exists() and path.resolve() == store.path.resolve():
            raise LedgerError(f"{path} is this ledger; merge another ledger into it", path=path)
        tables, shown, label = _read_ledger_file(path), str(path), path.name
    names = {b["id"]: b["name"] for b in tables["batches"]}
    problem = _unfinished_jobs([{**dict(j), "batch": names.get(j["batch_id"])}
                               for j in tables["jobs"]], f"the ledger {shown}", "merge it")
    if problem:
        raise LedgerError(problem, path=shown)
    return tables, shown, label
