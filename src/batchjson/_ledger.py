"""The durable ledger: one SQLite file, the single source of truth for batches and receipts.

Every attempt is written *before* its call (in flight) and completed after. An accepted return and
its checkpoint rows are committed in one transaction; a rejected return admits nothing.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import _records as records
from ._errors import LedgerError
from ._migrations import migrate
from ._records import Receipt, Revision, _receipt, _revision, _uid, now
from ._tasks import Request


class Ledger:
    """Thread-safe access to the ledger file (``path=None`` keeps it in memory)."""

    def __init__(self, path: str | Path | None = None, *, busy_timeout: float = 30.0) -> None:
        self.path = records.ledger_path(path)  # refused (ConfigError) before any file is made
        target = ":memory:" if self.path is None else str(self.path)
        self._busy_timeout = busy_timeout
        try:
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None,
                                       timeout=busy_timeout)
            self._db.row_factory = sqlite3.Row
            self._lock = threading.RLock()
            if self.path is not None:
                self._wal()
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._lock:
                migrate(self._db)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(records.open_problem(self.path), path=self.path or ":memory:",
                              cause=exc) from exc

    def _wal(self) -> None:
        """Switch to WAL. The switch needs the file to itself and SQLite does not wait for it,
        so a ledger another process is creating or migrating is waited for, within the busy
        timeout, instead of failing with "database is locked"."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def __repr__(self) -> str:
        return f"Ledger({str(self.path) if self.path else ':memory:'})"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. A failure of the ledger itself (disk full, I/O error,
        read-only file, locked past the busy timeout) raises LedgerError naming the file and
        the cause; the rollback after a failure never replaces that cause."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._error("could not start a write", exc) from exc
            try:
                yield self._db
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error) and _is_ledger_fault(exc):
                    raise self._error("a write failed", exc) from exc
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise self._error("could not commit", exc) from exc

    def autocheckpoint(self, pages: int) -> None:
        """How many WAL pages a commit lets pile up before it copies them back into the file
        itself (0: never; a run's checkpointer thread does it instead, off the event loop)."""
        with self._lock:
            self._db.execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")

    def _rollback(self) -> None:
        """Undo what is left of a failed transaction; SQLite may already have undone it."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:  # the original failure is the one worth reporting
                pass

    def _error(self, what: str, exc: BaseException) -> LedgerError:
        return LedgerError(f"{what}; the run stopped before any further call"
                           f"{records.write_problem(self.path, exc)}", path=self.path or ":memory:",
                           cause=exc)

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:  # closed, corrupt, locked: a batchjson error, named
                raise LedgerError("could not be read", path=self.path or ":memory:",
                                  cause=exc) from exc

    # -- batches and revisions -------------------------------------------------------------
    def find_revision(self, name: str, fingerprint: str) -> Revision | None:
        rows = self._rows(_REVISION_SQL + " WHERE b.name = ? AND r.fingerprint = ?",
                          (name, fingerprint))
        return _revision(rows[0]) if rows else None

    def revisions(self, name: str | None = None) -> list[Revision]:
        if name is None:
            return [_revision(r) for r in self._rows(_REVISION_SQL + " ORDER BY r.id")]
        return [_revision(r) for r in self._rows(_REVISION_SQL + " WHERE b.name = ? ORDER BY r.id",
                                                 (name,))]

    def batch_names(self) -> list[str]:
        return [r["name"] for r in self._rows("SELECT name FROM batches ORDER BY id")]

    def open_revision(self, name: str, fingerprint: str, components: Mapping[str, str],
                      requests: Sequence[Request], *, strict: bool,
                      validator: Mapping[str, Any] | None = None,
                      ) -> tuple[Revision, Revision | None]:
        """Make (or reuse) the revision for this content and mark it current.

        Returns (revision, superseded) where ``superseded`` is the previous current revision if it
        was unresolved and has now been marked superseded (never in a strict session).
        """
        stamp = now()
        with self.transaction() as db:
            batch_id, previous_id = self.batch_row(db, name, stamp)
            found = db.execute("SELECT id FROM revisions WHERE batch_id = ? AND fingerprint = ?",
                               (batch_id, fingerprint)).fetchone()
            if found is not None:
                revision_id = found["id"]
                db.execute("UPDATE revisions SET status = 'open', superseded_by = NULL, "
                           "supersede_reason = NULL, forget_id = NULL WHERE id = ?",
                           (revision_id,))  # a forgotten revision run again owes again
            else:
                number = db.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM revisions WHERE "
                                    "batch_id = ?", (batch_id,)).fetchone()[0]
                revision_id = db.execute(
                    "INSERT INTO revisions(batch_id, number, fingerprint, components, "
                    "validator_name, validator_version, validator_fingerprint, status, created_at) "
                    "VALUES (?,?,?,?,?,?,?, 'open', ?)",
                    (batch_id, number, fingerprint, json.dumps(dict(components)),
                     validator and validator["name"], validator and validator["version"],
                     components.get("validator"), stamp)).lastrowid
                self._insert_requests(db, revision_id, requests)
            superseded = None
            if previous_id is not None and previous_id != revision_id:
                if not strict and self._unresolved_count(db, previous_id) > 0:
                    old = json.loads(db.execute("SELECT components FROM revisions WHERE id = ?",
                                                (previous_id,)).fetchone()[0])
                    changed = [k for k in ("tasks", "schema", "validator", "pack", "instructions",
                                           "identity", "mode") if old.get(k) != components.get(k)]
                    reason = "changed: " + ", ".join(changed or ["content"])
                    db.execute("UPDATE revisions SET status = 'superseded', superseded_by = ?, "
                               "supersede_reason = ? WHERE id = ?",
                               (revision_id, reason, previous_id))
                    superseded = previous_id
            db.execute("UPDATE batches SET current_revision = ? WHERE id = ?",
                       (revision_id, batch_id))
        current = self._revision_by_id(revision_id)
        return current, (self._revision_by_id(superseded) if superseded else None)

    @staticmethod
    def batch_row(db: sqlite3.Connection, name: str, stamp: str) -> tuple[int, int | None]:
        """(batch id, current revision id) of batch ``name``, made if new; in ``db``'s
        transaction. Live runs and imports find their batch the same way."""
        row = db.execute("SELECT id, current_revision FROM batches WHERE name = ?",
                         (name,)).fetchone()
        if row is None:
            return db.execute("INSERT INTO batches(name, created_at) VALUES (?, ?)",
                              (name, stamp)).lastrowid, None
        return row["id"], row["current_revision"]

    def _revision_by_id(self, revision_id: int) -> Revision:
        return _revision(self._rows(_REVISION_SQL + " WHERE r.id = ?", (revision_id,))[0])

    @staticmethod
    def _insert_requests(db: sqlite3.Connection, revision_id: int,
                         requests: Sequence[Request]) -> None:
        db.executemany(
            "INSERT OR IGNORE INTO requests(revision_id, key, position, parent_key, task_ids, "
            "tasks) VALUES (?,?,?,?,?,?)",
            [(revision_id, r.key, r.position, r.parent_key, r.task_ids_json, r.tasks_json)
             for r in requests])

    def record_split(self, revision_id: int, parent: Request, children: Sequence[Request]) -> None:
        """Replace a leaf request by its halves; the parent stays on record as split."""
        with self.transaction() as db:
            db.execute("UPDATE requests SET split = 1 WHERE revision_id = ? AND key = ?",
                       (revision_id, parent.key))
            self._insert_requests(db, revision_id, children)

    def leaves(self, revision_id: int) -> list[Request]:
        rows = self._rows("SELECT key, tasks, position, parent_key FROM requests WHERE "
                          "revision_id = ? AND split = 0 ORDER BY position, id", (revision_id,))
        return [Request(r["key"], tuple(json.loads(r["tasks"])), r["position"], r["parent_key"],
                        tasks_json=r["tasks"]) for r in rows]  # the stored text is canonical

    def accepted_keys(self, keys: Sequence[str]) -> set[str]:
        """Keys with an accepted return, under any batch: evidence is content, not a name."""
        return {r[0] for r in self._by_keys(
            "SELECT DISTINCT request_key FROM attempts WHERE status = 'accepted' AND "
            "request_key IN ({marks})", keys)}

    def _by_keys(self, sql: str, keys: Sequence[str]) -> list[sqlite3.Row]:
        rows: list[sqlite3.Row] = []
        for start in range(0, len(keys), 500):  # under SQLite's bound-parameter limit
            chunk = list(keys[start:start + 500])
            rows += self._rows(sql.format(marks=",".join("?" * len(chunk))), chunk)
        return rows

    def no_such_batch(self, name: str) -> str | None:
        """Why ``name`` is not a batch here, listing those that are; None when it is one."""
        if self.batch_id(name) is not None:
            return None
        known = ", ".join(self.batch_names()) or "none yet"
        return f"no batch named {name!r} in this ledger (batches: {known})"

    def batch_id(self, name: str) -> int | None:
        rows = self._rows("SELECT id FROM batches WHERE name = ?", (name,))
        return rows[0]["id"] if rows else None

    @staticmethod
    def _unresolved_count(db: sqlite3.Connection, revision_id: int) -> int:
        return db.execute(_UNRESOLVED_SQL.format(select="COUNT(*)") + " AND q.revision_id = ?",
                          (revision_id,)).fetchone()[0]

    # -- attempts ------------------------------------------------------------------------------
    def attempt_counts(self, keys: Sequence[str]) -> dict[str, int]:
        """How many attempts each exact request has had so far (any batch, any run)."""
        return {r[0]: r[1] for r in self._by_keys(
            "SELECT request_key, COUNT(*) FROM attempts WHERE request_key IN ({marks}) "
            "GROUP BY request_key", keys)}

    @staticmethod
    def op_begin(db: sqlite3.Connection, batch_id: int, revision_id: int, request: Request,
                 kind: str, provider: str | None, model: str | None,
                 source: str | None = None, *, owner: str | None = None,
                 estimated_input_tokens: int | None = None,
                 cost_floor: float | None = None, stamp: str | None = None) -> int:
        """Write an in-flight receipt; it is committed before the call is sent. ``source`` is
        the provider's answer source (``providers.base.answer_source``); ``stamp``, when given,
        is its start time (the claim written with it shares one clock reading)."""
        return db.execute(
            "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, status, "
            "provider, model, started_at, uid, owner, estimated_input_tokens, cost_floor, "
            "source) VALUES (?,?,?,?,?, 'in_flight', ?,?,?,?,?,?,?,?)",
            (batch_id, revision_id, request.key, request.task_ids_json, kind, provider, model,
             stamp or now(), _uid(), owner, estimated_input_tokens, cost_floor, source)).lastrowid

    @staticmethod
    def op_drop(db: sqlite3.Connection, attempt_id: int) -> None:
        """Undo an in-flight receipt in the transaction that wrote it (its request turned out
        to be claimed by another runner or accepted): it never leaves that transaction."""
        db.execute("DELETE FROM attempts WHERE id = ? AND status = 'in_flight'", (attempt_id,))

    def finish_attempt(self, attempt_id: int, status: str, *, errors: Sequence[Mapping] = (),
                       raw: str | None = None, usage: Mapping[str, Any] | None = None,
                       sent_at: str | None = None) -> None:
        """Complete a receipt that admits nothing: rejected, provider_error or cancelled.

        Synchronous, for a run that is unwinding; ``sent_at=None`` on a cancelled receipt says
        its call was never sent, so it is not counted as a call.
        """
        if status == "accepted":
            raise ValueError("use op_accept for an accepted return: it also writes the checkpoint")
        with self.transaction() as db:
            self._finish(db, attempt_id, status, errors, raw, usage or {}, sent_at=sent_at)

    @classmethod
    def op_accept(cls, db: sqlite3.Connection, attempt_id: int, batch_id: int, request_key: str,
                  items: Mapping[str, Any], raw: str, usage: Mapping[str, Any],
                  sent_at: str | None = None) -> bool:
        """Mark the receipt accepted and admit every item, inside the caller's transaction.

        Checkpoint rows are written once and never re-pointed: if another runner's return for
        this request was admitted first, this one is kept as a paid return that admitted nothing
        (``already_accepted``) and False is returned.
        """
        stamp = now()
        rows = [(batch_id, request_key, task_id, attempt_id, json.dumps(item), stamp)
                for task_id, item in items.items()]
        sql = ("INSERT INTO checkpoint(batch_id, request_key, task_id, attempt_id, item, "
               "committed_at) VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING")
        added = (db.execute(sql, rows[0]) if len(rows) == 1 else db.executemany(sql, rows)).rowcount
        if rows and added == 0:  # every row was already there: another return came first
            first = db.execute("SELECT attempt_id FROM checkpoint WHERE request_key = ? AND "
                               "batch_id = ? LIMIT 1", (request_key, batch_id)).fetchone()[0]
            cls._finish(db, attempt_id, "rejected", [{
                "type": "already_accepted", "task_id": None,
                "message": f"attempt {first} of another runner was admitted first; this "
                "return was paid for but admits nothing"}], raw, usage, stamp, sent_at)
            return False
        cls._finish(db, attempt_id, "accepted", (), raw, usage, stamp, sent_at)
        return True

    @classmethod
    def op_finish(cls, db: sqlite3.Connection, attempt_id: int, status: str,
                  errors: Sequence[Mapping], raw: str | None,
                  usage: Mapping[str, Any], sent_at: str | None = None) -> None:
        if status == "accepted":
            raise ValueError("use op_accept for an accepted return")
        cls._finish(db, attempt_id, status, errors, raw, usage, sent_at=sent_at)

    @staticmethod
    def _finish(db: sqlite3.Connection, attempt_id: int, status: str, errors: Sequence[Mapping],
                raw: str | None, usage: Mapping[str, Any], stamp: str | None = None,
                sent_at: str | None = None) -> None:
        # An 'abandoned' receipt may still be completed: its owner was presumed gone (lease
        # expired) but came back with the answer, which is the better account.
        cost = usage.get("cost")
        if cost is not None and not (isinstance(cost, (int, float)) and math.isfinite(cost)
                                     and cost >= 0):
            cost = None  # a NaN or negative cost is no cost at all; the account says unknown
        db.execute(
            "UPDATE attempts SET status = ?, errors = ?, raw = ?, input_tokens = ?, "
            "output_tokens = ?, cached_tokens = ?, cost = ?, model = COALESCE(?, model), "
            "finished_at = ?, sent_at = COALESCE(?, sent_at) WHERE id = ? "
            "AND status IN ('in_flight', 'abandoned')",
            (status, json.dumps(list(errors)) if errors else "[]", raw,
             usage.get("input_tokens"), usage.get("output_tokens"), usage.get("cached_tokens"),
             cost, usage.get("model"), stamp or now(), sent_at, attempt_id))

    # -- reading -------------------------------------------------------------------------------
    def attempts(self, name: str, *, failed: bool = False) -> list[Receipt]:
        """Receipts of a batch in call order (every revision)."""
        sql = _RECEIPT_SQL + " WHERE b.name = ?"
        if failed:
            sql += " AND a.status != 'accepted'"
        return [_receipt(r) for r in self._rows(sql + " ORDER BY a.id", (name,))]

    def checkpoint(self, name: str, revision_id: int | None = None) -> dict[str, Any]:
        """task_id -> accepted item for one revision of the batch (default: its current one).

        A run reads its own revision: another runner may have made a different one current.
        """
        if revision_id is None:
            rows = self._rows("SELECT current_revision FROM batches WHERE name = ?", (name,))
            if not rows or rows[0][0] is None:
                return {}
            revision_id = rows[0][0]
        rows = self._rows(
            "SELECT c.task_id, c.item, json_valid(c.item) FROM requests q JOIN checkpoint c "
            "ON c.request_key = q.key WHERE q.revision_id = ? AND q.split = 0 "
            "ORDER BY q.position, q.id, c.attempt_id", (revision_id,))
        if all(r[2] for r in rows):  # each item one JSON text (SQLite says, in C): one decode
            items = json.loads("[" + ",".join(r[1] for r in rows) + "]")
        else:  # joined, "1,2" next to "[3" and "4]" would shift values between tasks
            items = [json.loads(r[1]) for r in rows]
        return {r[0]: item for r, item in zip(rows, items, strict=True)}

    def current_tasks(self, name: str) -> tuple[str, dict[str, dict[str, Any]]]:
        """(identity rule, task_id -> task) of batch ``name``'s current revision: the rule as
        its key component says it (``"task_id,case_id"``, or ``"task_id+echoed"``)."""
        rows = self._rows("SELECT r.id, r.components FROM batches b JOIN revisions r ON r.id = "
                          "b.current_revision WHERE b.name = ?", (name,))
        if not rows:
            return "task_id", {}
        rule = json.loads(rows[0]["components"]).get("identity", "task_id")
        return rule, {t["task_id"]: t for r in self.leaves(rows[0]["id"]) for t in r.tasks}

    def has_legacy_keys(self) -> bool:
        """Whether any revision was keyed before the answer source joined request keys
        (its components have no "source"): only then do runs look for old-style keys."""
        return bool(self._rows(  # unreadable components: assume old, look (never skip)
            "SELECT EXISTS (SELECT 1 FROM revisions WHERE CASE WHEN json_valid(components) "
            "THEN json_extract(components, '$.source') IS NULL ELSE 1 END)")[0][0])

    def checkpoint_count(self, name: str | None = None) -> int:
        """``len(checkpoint(name))`` summed over one batch or all, without decoding items."""
        sql = ("SELECT COUNT(*) FROM (SELECT DISTINCT b.id, c.task_id FROM batches b "
               "JOIN requests q ON q.revision_id = b.current_revision JOIN checkpoint c "
               "ON c.request_key = q.key WHERE q.split = 0" + (" AND b.name = ?)" if name
                                                                else ")"))
        return self._rows(sql, (name,) if name else ())[0][0]

    def unresolved(self) -> list[sqlite3.Row]:
        """Leaf requests of open revisions with no accepted return for their exact key."""
        return self._rows(_UNRESOLVED_SQL.format(
            select="b.name AS batch, r.number AS revision, q.key, q.task_ids") +
            " ORDER BY b.id, r.number, q.position")

    def superseded(self) -> list[sqlite3.Row]:
        return self._rows(
            "SELECT b.name AS batch, r.number AS revision, r.supersede_reason AS reason, "
            "n.number AS superseded_by FROM revisions r JOIN batches b ON b.id = r.batch_id "
            "LEFT JOIN revisions n ON n.id = r.superseded_by WHERE r.status = 'superseded' "
            "ORDER BY b.id, r.number")

    def unresolved_under_validator(self, fingerprint: str) -> int:
        return self._rows(_UNRESOLVED_SQL.format(select="COUNT(*)") +
                          " AND r.validator_fingerprint = ?", (fingerprint,))[0][0]

    def spend(self, name: str | None = None) -> dict[str, Any]:
        """Calls, tokens and cost of every call ever made (for one batch or all): the same
        account as :meth:`cost_summary`, summed (accounts.py holds the one definition).

        A receipt whose call was never sent (cancelled before sending) is not a call; nor is a
        recheck. A call with no recorded cost (killed or interrupted before its answer, an error
        without usage, a model with no price) has an unknown cost: it is counted in
        ``unknown_cost_calls``, and ``cost_lower_bound_unknown`` is the least those calls cost
        (their prompt tokens at the model's input price); ``cost_lower_bound`` adds it to the
        known ``cost``.
        """
        from ._accounts import spend

        return spend(self, name)

    def number_validator(self, name: str, fingerprint: str, where: str | None,
                         by_identity: Sequence[str] = ()) -> int:
        """The version number of this content of ``name``: as recorded, or the next one."""
        with self.transaction() as db:
            row = db.execute("SELECT version FROM validators WHERE name = ? AND fingerprint = ?",
                             (name, fingerprint)).fetchone()
            if row is not None:
                return row[0]
            version = db.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM validators "
                                 "WHERE name = ?", (name,)).fetchone()[0]
            db.execute("INSERT INTO validators(name, version, fingerprint, where_defined, "
                       "defined_at, by_identity) VALUES (?,?,?,?,?,?)",
                       (name, version, fingerprint, where, now(), json.dumps(list(by_identity))))
            return version

    def validator_usage(self) -> list[dict[str, Any]]:
        """Every recorded validator version, with the sorted names of batches run under it."""
        out: dict[tuple[str, int], dict[str, Any]] = {}
        for r in self._rows(
                "SELECT v.name, v.version, v.fingerprint, v.where_defined, v.defined_at, "
                "b.name AS batch FROM validators v LEFT JOIN revisions r "
                "ON r.validator_fingerprint = v.fingerprint LEFT JOIN batches b "
                "ON b.id = r.batch_id ORDER BY v.name, v.version, b.name"):
            row = out.setdefault((r["name"], r["version"]), {
                k: r[k] for k in ("name", "version", "fingerprint", "where_defined",
                                  "defined_at")} | {"batches": []})
            if r["batch"] is not None and r["batch"] not in row["batches"]:
                row["batches"].append(r["batch"])
        return list(out.values())

    # -- recovery and accounts (recovery.py, merge.py, accounts.py hold the logic) -------------
    def import_receipts(self, path: str | Path, *, validators: Any = None) -> dict[str, Any]:
        """Import historical receipts (JSONL), rechecking every item; see docs/recovery.md."""
        from ._recovery import import_receipts

        return import_receipts(self, path, validators=validators)

    def export_receipts(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every attempt as an importable receipt, in call order."""
        from ._recovery import export_receipts

        return export_receipts(self, name)

    def merge(self, other: str | Path) -> dict[str, Any]:
        """Bring another ledger's batches, attempts and accepted values in (idempotent)."""
        from ._merge import merge_ledger

        return merge_ledger(self, other)

    def cost_summary(self, name: str | None = None) -> dict[str, Any]:
        """Per batch and in total: every attempt's calls, tokens and cost; see accounts.py."""
        from ._accounts import cost_summary

        return cost_summary(self, name)


_REVISION_SQL = (
    "SELECT r.id, r.batch_id, b.name AS batch, r.number, r.fingerprint, r.components, r.status, "
    "r.supersede_reason, r.validator_name, r.created_at FROM revisions r "
    "JOIN batches b ON b.id = r.batch_id")

_RECEIPT_SQL = (
    "SELECT a.*, b.name AS batch, r.number AS revision FROM attempts a "
    "JOIN batches b ON b.id = a.batch_id JOIN revisions r ON r.id = a.revision_id")

_UNRESOLVED_SQL = (
    "SELECT {select} FROM requests q JOIN revisions r ON r.id = q.revision_id "
    "JOIN batches b ON b.id = r.batch_id WHERE r.status = 'open' AND r.forget_id IS NULL "
    "AND q.split = 0 "
    "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.request_key = q.key "
    "AND a.status = 'accepted')")


_FAULTS = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_BUSY", "SQLITE_LOCKED",
           "SQLITE_CANTOPEN", "SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_PERM", "SQLITE_NOMEM")


def _is_ledger_fault(exc: sqlite3.Error) -> bool:
    """The file or disk failed (not a bad statement): the run cannot keep records any more."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    return name.startswith(_FAULTS)
