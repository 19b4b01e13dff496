"""Merging another ledger into this one, so every attempt ever made stays in one account.

Attempts are matched by ``uid`` (unique across ledgers), revisions by (batch name, fingerprint),
requests by (revision, key) and validators by (name, fingerprint), so merging the same file twice
changes nothing. The other file is opened read-only; everything is written in one transaction.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from ._errors import LedgerError
from ._forgetting import carry_forgets
from ._ledger import Ledger
from ._migrations import SCHEMA_VERSION
from ._records import ledger_problem

_ATTEMPT_COLUMNS = ("request_key", "task_ids", "kind", "status", "errors", "raw",
                    "input_tokens", "output_tokens", "cached_tokens", "cost", "provider",
                    "model", "started_at", "finished_at", "uid", "sent_at", "owner", "source",
                    "estimated_input_tokens", "cost_floor")


def _read(path: Path) -> dict[str, list[sqlite3.Row]]:
    problem = ledger_problem(path)
    if problem:
        raise LedgerError(problem, path=path)
    db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version < SCHEMA_VERSION:
            raise LedgerError(f"{path} has ledger schema version {version}; open it once with "
                              f"this batchjson (batchjson status --ledger {path}) to upgrade it, "
                              "then merge", path=path)
        tables = {table: db.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
                  for table in ("batches", "revisions", "requests", "attempts", "validators",
                                "imports", "forgets")}
        # checkpoint has no rowid (schema 6): by accepting attempt (the order they were opened)
        tables["checkpoint"] = db.execute(
            "SELECT * FROM checkpoint ORDER BY attempt_id, task_id").fetchall()
        return tables
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"cannot read {path}: {exc}", path=path, cause=exc) from None
    finally:
        db.close()


def _our_version(db: sqlite3.Connection, revision: sqlite3.Row) -> Any:
    """The version number this ledger gives the revision's validator (a clashing number was
    renumbered when the validators came over)."""
    row = db.execute("SELECT version FROM validators WHERE name = ? AND fingerprint = ?",
                     (revision["validator_name"], revision["validator_fingerprint"])).fetchone()
    return row["version"] if row is not None else revision["validator_version"]


def merge_ledger(ledger: Ledger, other: str | Path) -> dict[str, Any]:
    """Bring the other ledger's batches, revisions, requests, attempts, accepted values and
    validators into ``ledger``; returns what was added."""
    path = Path(other)
    if ledger.path is not None and path.exists() and path.resolve() == ledger.path.resolve():
        raise LedgerError(f"{path} is this ledger; merge another ledger into it", path=path)
    theirs = _read(path)
    added = {k: 0 for k in ("batches", "revisions", "requests", "attempts",
                            "attempts_completed", "checkpoint_rows", "validators", "imports")}
    present = 0
    with ledger.transaction() as db:
        for v in theirs["validators"]:
            if db.execute("SELECT 1 FROM validators WHERE name = ? AND fingerprint = ?",
                          (v["name"], v["fingerprint"])).fetchone():
                continue
            version = v["version"]
            if db.execute("SELECT 1 FROM validators WHERE name = ? AND version = ?",
                          (v["name"], version)).fetchone():
                version = db.execute("SELECT MAX(version) + 1 FROM validators WHERE name = ?",
                                     (v["name"],)).fetchone()[0]
            db.execute("INSERT INTO validators(name, version, fingerprint, where_defined, "
                       "defined_at, by_identity) VALUES (?,?,?,?,?,?)",
                       (v["name"], version, v["fingerprint"], v["where_defined"],
                        v["defined_at"], v["by_identity"]))
            added["validators"] += 1
        batch_map: dict[int, int] = {}
        new_batches: set[int] = set()
        for b in theirs["batches"]:
            row = db.execute("SELECT id FROM batches WHERE name = ?", (b["name"],)).fetchone()
            if row is None:
                batch_map[b["id"]] = db.execute(
                    "INSERT INTO batches(name, created_at) VALUES (?, ?)",
                    (b["name"], b["created_at"])).lastrowid
                new_batches.add(b["id"])
                added["batches"] += 1
            else:
                batch_map[b["id"]] = row["id"]
        current = {row["id"]: row["current_revision"] for row in db.execute(
            "SELECT id, current_revision FROM batches")}  # ours, before anything is merged
        revision_map: dict[int, int] = {}
        inserted_revisions: list[sqlite3.Row] = []
        for r in theirs["revisions"]:
            batch_id = batch_map[r["batch_id"]]
            row = db.execute("SELECT id FROM revisions WHERE batch_id = ? AND fingerprint = ?",
                             (batch_id, r["fingerprint"])).fetchone()
            if row is not None:
                revision_map[r["id"]] = row["id"]
                continue
            number = r["number"]
            if db.execute("SELECT 1 FROM revisions WHERE batch_id = ? AND number = ?",
                          (batch_id, number)).fetchone():
                number = db.execute("SELECT MAX(number) + 1 FROM revisions WHERE batch_id = ?",
                                    (batch_id,)).fetchone()[0]
            revision_map[r["id"]] = db.execute(
                "INSERT INTO revisions(batch_id, number, fingerprint, components, "
                "validator_name, validator_version, validator_fingerprint, status, "
                "supersede_reason, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (batch_id, number, r["fingerprint"], r["components"], r["validator_name"],
                 _our_version(db, r), r["validator_fingerprint"], r["status"],
                 r["supersede_reason"], r["created_at"])).lastrowid
            inserted_revisions.append(r)
            added["revisions"] += 1
        for r in inserted_revisions:
            if r["superseded_by"] is not None:
                db.execute("UPDATE revisions SET superseded_by = ? WHERE id = ?",
                           (revision_map[r["superseded_by"]], revision_map[r["id"]]))
            ours = current.get(batch_map[r["batch_id"]])
            if r["status"] == "open" and ours is not None:
                # Beside a batch of ours the merged revision is on record, not owed: the batch
                # keeps working on its current revision (as an import beside it does).
                db.execute("UPDATE revisions SET status = 'superseded', superseded_by = ?, "
                           "supersede_reason = ? WHERE id = ?",
                           (ours, f"merged from {path.name} beside the batch's current "
                            "revision", revision_map[r["id"]]))
        carry_forgets(db, theirs["forgets"], inserted_revisions, revision_map, batch_map)
        for b in theirs["batches"]:
            if b["id"] in new_batches and b["current_revision"] is not None:
                db.execute("UPDATE batches SET current_revision = ? WHERE id = ?",
                           (revision_map[b["current_revision"]], batch_map[b["id"]]))
        for q in theirs["requests"]:
            revision_id = revision_map[q["revision_id"]]
            cursor = db.execute(
                "INSERT OR IGNORE INTO requests(revision_id, key, position, parent_key, "
                "task_ids, tasks, split) VALUES (?,?,?,?,?,?,?)",
                (revision_id, q["key"], q["position"], q["parent_key"], q["task_ids"],
                 q["tasks"], q["split"]))
            added["requests"] += cursor.rowcount
            if q["split"]:  # halved there: the halves are the leaves here too
                db.execute("UPDATE requests SET split = 1 WHERE revision_id = ? AND key = ?",
                           (revision_id, q["key"]))
        attempt_map: dict[int, int] = {}
        for a in theirs["attempts"]:
            row = db.execute("SELECT id, status FROM attempts WHERE uid = ?",
                             (a["uid"],)).fetchone()
            if row is not None:
                attempt_map[a["id"]] = row["id"]
                present += 1
                if row["status"] == "in_flight" and a["status"] != "in_flight":
                    # Merged while that call was in flight there; it has finished since: its
                    # outcome, tokens and cost are facts learned later, not a second call.
                    db.execute(
                        "UPDATE attempts SET status = ?, errors = ?, raw = ?, input_tokens = ?, "
                        "output_tokens = ?, cached_tokens = ?, cost = ?, model = ?, "
                        "finished_at = ? WHERE id = ? AND status = 'in_flight'",
                        (a["status"], a["errors"], a["raw"], a["input_tokens"],
                         a["output_tokens"], a["cached_tokens"], a["cost"], a["model"],
                         a["finished_at"], row["id"]))
                    added["attempts_completed"] += 1
                continue
            values = [a[c] for c in _ATTEMPT_COLUMNS]
            attempt_map[a["id"]] = db.execute(
                f"INSERT INTO attempts(batch_id, revision_id, {', '.join(_ATTEMPT_COLUMNS)}) "
                f"VALUES ({', '.join('?' * (len(_ATTEMPT_COLUMNS) + 2))})",
                [batch_map[a["batch_id"]], revision_map[a["revision_id"]], *values]).lastrowid
            added["attempts"] += 1
        for c in theirs["checkpoint"]:
            cursor = db.execute(
                "INSERT OR IGNORE INTO checkpoint(batch_id, request_key, task_id, attempt_id, "
                "item, committed_at) VALUES (?,?,?,?,?,?)",
                (batch_map[c["batch_id"]], c["request_key"], c["task_id"],
                 attempt_map[c["attempt_id"]], c["item"], c["committed_at"]))
            added["checkpoint_rows"] += cursor.rowcount
        for i in theirs["imports"]:
            cursor = db.execute(
                "INSERT OR IGNORE INTO imports(digest, attempt_id, source, line, outcome, "
                "imported_at) VALUES (?,?,?,?,?,?)",
                (i["digest"], attempt_map.get(i["attempt_id"]), i["source"], i["line"],
                 i["outcome"], i["imported_at"]))
            added["imports"] += cursor.rowcount
    return {"source": str(path), "added": added, "attempts_already_present": present}
