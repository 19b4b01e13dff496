"""The store's SQL for merging another ledger in and for forgetting a batch.

A merge matches attempts by ``uid`` (unique across ledgers), revisions by (batch name,
fingerprint), requests by (revision, key) and validators by (name, fingerprint), so merging the
same file twice changes nothing; everything is written in one transaction. The other ledger's
rows are read by ``sqlite._read_ledger_file`` (another ledger is a file, whatever this store is).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .store_base import Row, StoreBase, Tx
from .store_runs import LATER_WORK_SQL, UNRESOLVED_SQL

ATTEMPT_COLUMNS = ("request_key", "task_ids", "kind", "status", "errors", "raw",
                   "input_tokens", "output_tokens", "cached_tokens", "cost", "provider",
                   "model", "started_at", "finished_at", "uid", "sent_at", "owner", "source",
                   "estimated_input_tokens", "cost_floor")
MERGED = ("batches", "revisions", "requests", "attempts", "attempts_completed",
          "checkpoint_rows", "validators", "imports")


class MergeStore(StoreBase):
    """Merging another ledger's rows; forgetting a batch and reading what was forgotten."""

    def merge_tables(self, theirs: Mapping[str, Sequence[Row]], source: str) -> dict[str, Any]:
        """Bring another ledger's rows (table -> rows, as ``read_ledger_file`` gives them) in,
        in one transaction; ``source`` names it in the reasons it writes. Returns what was
        added and how many attempts were already here."""
        added = dict.fromkeys(MERGED, 0)
        with self.transaction(whole="the merge") as tx:
            self._merge_validators(tx, theirs["validators"], added)
            batch_map, new_batches = self._merge_batches(tx, theirs["batches"], added)
            revision_map = self._merge_revisions(tx, theirs, batch_map, new_batches, source,
                                                 added)
            self._merge_requests(tx, theirs["requests"], revision_map, added)
            attempt_map, present = self._merge_attempts(tx, theirs["attempts"], batch_map,
                                                        revision_map, added)
            for c in theirs["checkpoint"]:
                added["checkpoint_rows"] += self._exec(
                    tx, "INSERT INTO checkpoint(batch_id, request_key, task_id, attempt_id, "
                    "item, committed_at) VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                    (batch_map[c["batch_id"]], c["request_key"], c["task_id"],
                     attempt_map[c["attempt_id"]], c["item"], c["committed_at"])).rowcount
            for i in theirs["imports"]:
                added["imports"] += self._exec(
                    tx, "INSERT INTO imports(digest, attempt_id, source, line, outcome, "
                    "imported_at) VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                    (i["digest"], attempt_map.get(i["attempt_id"]), i["source"], i["line"],
                     i["outcome"], i["imported_at"])).rowcount
        return {"added": added, "attempts_already_present": present}

    def _merge_validators(self, tx: Tx, validators: Sequence[Row], added: dict) -> None:
        for v in validators:
            if self._exec(tx, "SELECT 1 FROM validators WHERE name = ? AND fingerprint = ?",
                          (v["name"], v["fingerprint"])).fetchone():
                continue
            version = v["version"]
            if self._exec(tx, "SELECT 1 FROM validators WHERE name = ? AND version = ?",
                          (v["name"], version)).fetchone():
                version = self._exec(tx, "SELECT MAX(version) + 1 FROM validators WHERE "
                                     "name = ?", (v["name"],)).fetchone()[0]
            self._exec(tx, "INSERT INTO validators(name, version, fingerprint, where_defined, "
                       "defined_at, by_identity) VALUES (?,?,?,?,?,?)",
                       (v["name"], version, v["fingerprint"], v["where_defined"],
                        v["defined_at"], v["by_identity"]))
            added["validators"] += 1

    def _merge_batches(self, tx: Tx, batches: Sequence[Row],
                       added: dict) -> tuple[dict[int, int], set[int]]:
        batch_map: dict[int, int] = {}
        new_batches: set[int] = set()
        for b in batches:
            row = self._exec(tx, "SELECT id FROM batches WHERE name = ?",
                             (b["name"],)).fetchone()
            if row is None:
                batch_map[b["id"]] = self._insert(
                    tx, "INSERT INTO batches(name, created_at) VALUES (?, ?)",
                    (b["name"], b["created_at"]))
                new_batches.add(b["id"])
                added["batches"] += 1
            else:
                batch_map[b["id"]] = row["id"]
        return batch_map, new_batches

    def _merge_revisions(self, tx: Tx, theirs: Mapping[str, Sequence[Row]],
                         batch_map: dict[int, int], new_batches: set[int], source: str,
                         added: dict) -> dict[int, int]:
        current = {row["id"]: row["current_revision"] for row in self._exec(
            tx, "SELECT id, current_revision FROM batches").fetchall()}  # ours, before merging
        revision_map: dict[int, int] = {}
        inserted: list[Row] = []
        for r in theirs["revisions"]:
            batch_id = batch_map[r["batch_id"]]
            row = self._exec(tx, "SELECT id FROM revisions WHERE batch_id = ? AND "
                             "fingerprint = ?", (batch_id, r["fingerprint"])).fetchone()
            if row is not None:
                revision_map[r["id"]] = row["id"]
                continue
            number = r["number"]
            if self._exec(tx, "SELECT 1 FROM revisions WHERE batch_id = ? AND number = ?",
                          (batch_id, number)).fetchone():
                number = self._exec(tx, "SELECT MAX(number) + 1 FROM revisions WHERE "
                                    "batch_id = ?", (batch_id,)).fetchone()[0]
            version = self._exec(tx, "SELECT version FROM validators WHERE name = ? AND "
                                 "fingerprint = ?", (r["validator_name"],
                                                     r["validator_fingerprint"])).fetchone()
            revision_map[r["id"]] = self._insert(
                tx, "INSERT INTO revisions(batch_id, number, fingerprint, components, "
                "validator_name, validator_version, validator_fingerprint, status, "
                "supersede_reason, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (batch_id, number, r["fingerprint"], r["components"], r["validator_name"],
                 # the number this ledger gives its validator (a clashing one was renumbered)
                 version["version"] if version is not None else r["validator_version"],
                 r["validator_fingerprint"], r["status"], r["supersede_reason"],
                 r["created_at"]))
            inserted.append(r)
            added["revisions"] += 1
        for r in inserted:
            if r["superseded_by"] is not None:
                self._exec(tx, "UPDATE revisions SET superseded_by = ? WHERE id = ?",
                           (revision_map[r["superseded_by"]], revision_map[r["id"]]))
            ours = current.get(batch_map[r["batch_id"]])
            if r["status"] == "open" and ours is not None:
                # Beside a batch of ours the merged revision is on record, not owed: the batch
                # keeps working on its current revision (as an import beside it does).
                self._exec(tx, "UPDATE revisions SET status = 'superseded', superseded_by = ?, "
                           "supersede_reason = ? WHERE id = ?",
                           (ours, f"merged from {source} beside the batch's current revision",
                            revision_map[r["id"]]))
        self._carry_forgets(tx, theirs["forgets"], inserted, revision_map, batch_map)
        for b in theirs["batches"]:
            if b["id"] in new_batches and b["current_revision"] is not None:
                self._exec(tx, "UPDATE batches SET current_revision = ? WHERE id = ?",
                           (revision_map[b["current_revision"]], batch_map[b["id"]]))
        return revision_map

    def _carry_forgets(self, tx: Tx, forgets: Sequence[Row], revisions: Sequence[Row],
                       revision_map: Mapping[int, int], batch_map: Mapping[int, int]) -> None:
        """Revisions another ledger had forgotten stay forgotten here, under a copy of its
        record (who, when, how), renumbered as the revisions were."""
        by_id = {f["id"]: f for f in forgets}
        carried: dict[int, int] = {}
        for r in revisions:
            record = by_id.get(r["forget_id"])
            if record is None:
                continue
            if record["id"] not in carried:
                carried[record["id"]] = self._insert(
                    tx, "INSERT INTO forgets(batch_id, forgotten_at, forgotten_by, via, "
                    "revisions, requests, items) VALUES (?,?,?,?,?,?,?)",
                    (batch_map[record["batch_id"]], record["forgotten_at"],
                     record["forgotten_by"], record["via"], "[]", record["requests"],
                     record["items"]))
            self._exec(tx, "UPDATE revisions SET forget_id = ? WHERE id = ?",
                       (carried[record["id"]], revision_map[r["id"]]))
        for ours in carried.values():
            numbers = [n for (n,) in self._exec(tx, "SELECT number FROM revisions WHERE "
                                                "forget_id = ? ORDER BY number", (ours,))]
            self._exec(tx, "UPDATE forgets SET revisions = ? WHERE id = ?",
                       (json.dumps(numbers), ours))

    def _merge_requests(self, tx: Tx, requests: Sequence[Row], revision_map: dict[int, int],
                        added: dict) -> None:
        for q in requests:
            revision_id = revision_map[q["revision_id"]]
            added["requests"] += self._exec(
                tx, "INSERT INTO requests(revision_id, key, position, parent_key, task_ids, "
                "tasks, split) VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (revision_id, q["key"], q["position"], q["parent_key"], q["task_ids"],
                 q["tasks"], q["split"])).rowcount
            if q["split"]:  # halved there: the halves are the leaves here too
                self._exec(tx, "UPDATE requests SET split = 1 WHERE revision_id = ? AND key = ?",
                           (revision_id, q["key"]))

    def _merge_attempts(self, tx: Tx, attempts: Sequence[Row], batch_map: dict[int, int],
                        revision_map: dict[int, int], added: dict) -> tuple[dict[int, int], int]:
        attempt_map: dict[int, int] = {}
        present = 0
        for a in attempts:
            row = self._exec(tx, "SELECT id, status FROM attempts WHERE uid = ?",
                             (a["uid"],)).fetchone()
            if row is not None:
                attempt_map[a["id"]] = row["id"]
                present += 1
                if row["status"] == "in_flight" and a["status"] != "in_flight":
                    # Merged while that call was in flight there; it has finished since: its
                    # outcome, tokens and cost are facts learned later, not a second call.
                    self._exec(
                        tx, "UPDATE attempts SET status = ?, errors = ?, raw = ?, "
                        "input_tokens = ?, output_tokens = ?, cached_tokens = ?, cost = ?, "
                        "model = ?, finished_at = ? WHERE id = ? AND status = 'in_flight'",
                        (a["status"], a["errors"], self._raw(a["raw"]), a["input_tokens"],
                         a["output_tokens"], a["cached_tokens"], a["cost"], a["model"],
                         a["finished_at"], row["id"]))
                    added["attempts_completed"] += 1
                continue
            attempt_map[a["id"]] = self._insert(
                tx, f"INSERT INTO attempts(batch_id, revision_id, {', '.join(ATTEMPT_COLUMNS)}) "
                f"VALUES ({', '.join('?' * (len(ATTEMPT_COLUMNS) + 2))})",
                [batch_map[a["batch_id"]], revision_map[a["revision_id"]],
                 *(self._raw(a[c]) if c == "raw" else a[c] for c in ATTEMPT_COLUMNS)])
            added["attempts"] += 1
        return attempt_map, present

    # -- forgetting ----------------------------------------------------------------------------
    def _forget(self, name: str, *, via: str, by: str, stamp: str) -> dict[str, Any] | None:
        """Mark every revision of batch ``name`` that still owes as forgotten, in one
        transaction with a ``forgets`` row saying who, when, how and what stopped being owed.
        None when nothing is owed (then nothing is written)."""
        with self.transaction() as tx:
            owed = self._exec(tx, UNRESOLVED_SQL.format(select="r.number AS revision, q.task_ids")
                              + " AND b.name = ?", (name,)).fetchall()
            if not owed:
                return None
            revisions = sorted({r["revision"] for r in owed})
            items = len({t for r in owed for t in json.loads(r["task_ids"])})
            batch_id = self._exec(tx, "SELECT id FROM batches WHERE name = ?",
                                  (name,)).fetchone()[0]
            forget_id = self._insert(
                tx, "INSERT INTO forgets(batch_id, forgotten_at, forgotten_by, via, revisions, "
                "requests, items) VALUES (?,?,?,?,?,?,?)",
                (batch_id, stamp, by, via, json.dumps(revisions), len(owed), items))
            self._exec(tx, f"UPDATE revisions SET forget_id = ? WHERE batch_id = ? AND number IN "
                       f"({','.join('?' * len(revisions))})", (forget_id, batch_id, *revisions))
        return {"batch": name, "revisions": revisions, "requests": len(owed), "items": items,
                "by": by, "via": via, "at": stamp}

    def forgotten(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every forgetting on record (of one batch, or all), oldest first: batch, at, by, via,
        revisions, requests, items, and ``in_effect``, how many of its revisions still stand
        forgotten (no work on them started since: a later run of one reopens it)."""
        return [{"batch": r[0], "at": r[1], "by": r[2], "via": r[3],
                 "revisions": json.loads(r[4]), "requests": r[5], "items": r[6],
                 "in_effect": r[7]} for r in self._read(
            "SELECT b.name, f.forgotten_at, f.forgotten_by, f.via, f.revisions, f.requests, "
            "f.items, (SELECT COUNT(*) FROM revisions r WHERE r.forget_id = f.id "
            f"AND NOT {LATER_WORK_SQL}) AS in_effect "
            "FROM forgets f JOIN batches b ON b.id = f.batch_id"
            + (" WHERE b.name = ?" if name is not None else "") + " ORDER BY f.id",
            (name,) if name is not None else ())]
