"""The store's SQL for what a person asks beside running: import receipts, export them, merge
another ledger in, forget a batch; each one transaction. What judges what an import or a merge
brings in sits above the ledger (``_session/ledger.py``); the rules: docs/recovery.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

from .._canon import canonical_json
from .._content.keys import Keys, tasks_digest
from .._content.tasks import Request
from .records import now
from .store_base import Row, Tx
from .store_calls import _COMPLETE_BY_VALUES
from .store_jobs import JobStore
from .store_runs import CHECKPOINT_SQL, LATER_WORK_SQL, UNRESOLVED_SQL, VALIDATORS_SQL

EXPORT_FORMAT = "batchjson/receipt-1"
# The components that say how a receipt was judged (tasks and pack say what was asked).
JUDGING = ("schema", "validator", "instructions", "identity", "mode", "source", "unseen")
KEPT = (*JUDGING, "schema_doc", "schema_shape")  # the schema itself, so an export rechecks it
BESIDE_LIVE = "imported beside the batch's current revision"
ATTEMPT_COLUMNS = ("request_key", "task_ids", "kind", "status", "errors", "raw",
                   "input_tokens", "output_tokens", "cached_tokens", "cost", "provider",
                   "model", "started_at", "finished_at", "uid", "sent_at", "owner", "source",
                   "estimated_input_tokens", "cost_floor")
IMPORTS_SQL = ("INSERT INTO imports(digest, attempt_id, source, line, outcome, imported_at) "
               "VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING")
FORGETS_SQL = ("INSERT INTO forgets(batch_id, forgotten_at, forgotten_by, via, revisions, "
               "requests, items) VALUES (?,?,?,?,?,?,?)")
MERGED = ("batches", "revisions", "requests", "attempts", "attempts_completed",
          "checkpoint_rows", "validators", "imports")


class AdminStore(JobStore):
    """Imported receipts and the revisions they go to; the export; a merge; forgetting."""

    def imported_before(self, tx: Tx, digest: str, uid: str | None
                        ) -> tuple[Row | None, Row | None]:
        """In ``tx``: (line, source) of a line with this digest imported before, and (id,
        batch_id, status) of the attempt with global id ``uid``; each None when there is none."""
        done = self._exec(tx, "SELECT line, source FROM imports WHERE digest = ?",
                          (digest,)).fetchone()
        held = None if not uid else self._exec(
            tx, "SELECT id, batch_id, status FROM attempts WHERE uid = ?", (uid,)).fetchone()
        return done, held

    def accepted_items(self, tx: Tx, batch_id: int, key: str) -> dict[str, str]:
        """task_id -> stored item JSON already accepted for this request of this batch."""
        return {r["task_id"]: r["item"] for r in self._exec(
            tx, "SELECT task_id, item FROM checkpoint WHERE batch_id = ? AND request_key = ?",
            (batch_id, key)).fetchall()}

    def record_import(self, tx: Tx, receipt: Mapping[str, Any], *, status: str,
                      errors: Sequence[Mapping], stored: Mapping[str, Any],
                      usage: Mapping[str, Any], completes: int | None = None) -> str:
        """Write one imported receipt in ``tx``: its attempt (of kind ``import``, or the
        in-flight attempt of the same call it ``completes``), its checkpoint rows if accepted,
        and the line's ``imports`` row. ``receipt``: batch_id, revision_id, request, provider,
        model, at, uid, source, digest, file, line, outcome, parts. Its outcome: the one given,
        or ``duplicate`` when another return for the request was admitted here first, whole or
        in part (the receipt then admits nothing)."""
        if completes is not None:
            attempt_id = completes
            self._exec(tx, "UPDATE attempts SET status = 'in_flight' WHERE id = ?", (completes,))
        else:
            request: Request = receipt["request"]
            attempt_id = self._insert(
                tx, "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                "status, provider, model, started_at, uid, sent_at, source) VALUES "
                "(?,?,?,?, 'import', 'in_flight', ?,?,?,?,?,?)",
                (receipt["batch_id"], receipt["revision_id"], request.key,
                 request.task_ids_json, receipt["provider"], receipt["model"], receipt["at"],
                 receipt["uid"], receipt["sent_at"], receipt["source"]))
        parts = receipt.get("parts")  # a partial receipt's: (request, accepted, rejected, raw)
        if parts is not None:  # split in the revision its attempt went to
            parts = (self._exec(tx, "SELECT revision_id FROM attempts WHERE id = ?",
                                (attempt_id,)).fetchone()[0], *parts)
        accepted = (receipt["batch_id"], (parts[2] if parts else receipt["request"]).key, stored)
        self.complete_call(tx, attempt_id, status, receipt["raw"], usage, errors=errors,
                           accepted=accepted if status in ("accepted", "partial") else None,
                           parts=parts)
        outcome = receipt["outcome"]
        if stored and self._exec(tx, "SELECT status FROM attempts WHERE id = ?", (attempt_id,)
                                 ).fetchone()[0] == "rejected":  # refused: admitted first
            outcome = "duplicate"
        self._exec(tx, IMPORTS_SQL, (receipt["digest"], attempt_id, receipt["file"],
                                     receipt["line"], outcome, now()))
        return outcome

    # -- the revisions imported attempts go to -------------------------------------------------
    def _revision_rows(self, tx: Tx, ids: Sequence[int]) -> list[Row]:
        """Per revision: id, number, status, components, supersede_reason, batch_id, batch,
        whether it is its batch's current one and the current one's number."""
        return self._by_keys(
            "SELECT r.id, r.number, r.status, r.components, r.supersede_reason, r.batch_id, "
            "b.name AS batch, CASE WHEN b.current_revision = r.id THEN 1 ELSE 0 END AS current, "
            "c.number AS current_number FROM revisions r JOIN batches b ON b.id = r.batch_id "
            "LEFT JOIN revisions c ON c.id = b.current_revision WHERE r.id IN ({marks})",
            list(ids), tx)

    # -- export --------------------------------------------------------------------------------
    def _export_receipts(self, name: str | None = None) -> list[dict[str, Any]]:
        where, args = (" WHERE b.name = ?", (name,)) if name else ("", ())
        numbers: dict[str, int] = {}
        out = []
        for row in self._read(EXPORT_SQL + where + " ORDER BY a.id", args):
            numbers[row["batch"]] = numbers.get(row["batch"], 0) + 1
            out.append(receipt_of(row, numbers[row["batch"]]))
        return out

    # -- merging another ledger in ------------------------------------------------------------
    def merge_tables(self, theirs: Mapping[str, Sequence[Row]], source: str) -> dict[str, Any]:
        """Bring another ledger's rows (``ledger.other_tables``) in, in one transaction, named
        ``source`` in the reasons written: what was added, how many attempts were here."""
        added = dict.fromkeys(MERGED, 0)
        with self.transaction(whole="the merge") as tx:
            self._merge_validators(tx, theirs["validators"], added)
            ours = {row[0]: row[1] for row in self._exec(  # our batches' current revisions
                tx, "SELECT id, current_revision FROM batches").fetchall()}
            batch_map = {b["id"]: self._batch_row(tx, b["name"], b["created_at"])[0]
                         for b in theirs["batches"]}
            added["batches"] = len(set(batch_map.values()) - ours.keys())
            revision_map = self._merge_revisions(tx, theirs, batch_map, ours, source, added)
            self._merge_requests(tx, theirs["requests"], revision_map, added)
            attempt_map, present = self._merge_attempts(tx, theirs["attempts"], batch_map,
                                                        revision_map, added)
            for c in theirs["checkpoint"]:
                added["checkpoint_rows"] += self._exec(tx, CHECKPOINT_SQL, (
                    batch_map[c["batch_id"]], c["request_key"], c["task_id"],
                    attempt_map[c["attempt_id"]], c["item"], c["committed_at"])).rowcount
            for i in theirs["imports"]:
                added["imports"] += self._exec(tx, IMPORTS_SQL, (
                    i["digest"], attempt_map.get(i["attempt_id"]), i["source"], i["line"],
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
            self._exec(tx, VALIDATORS_SQL, (v["name"], version, v["fingerprint"],
                                            v["where_defined"], v["defined_at"], v["by_identity"]))
            added["validators"] += 1

    def _merge_revisions(self, tx: Tx, theirs: Mapping[str, Sequence[Row]],
                         batch_map: dict[int, int], ours: Mapping[int, int | None], source: str,
                         added: dict) -> dict[int, int]:
        revision_map: dict[int, int] = {}
        inserted: list[Row] = []
        for r in theirs["revisions"]:
            batch_id = batch_map[r["batch_id"]]
            found = self._revision_with(tx, batch_id, r["fingerprint"])
            if found is not None:
                revision_map[r["id"]] = found
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
            current = ours.get(batch_map[r["batch_id"]])
            if r["status"] == "open" and current is not None:
                # Beside a batch of ours the merged revision is on record, not owed: the batch
                # keeps working on its current revision (as an import beside it does).
                self._mark_superseded(tx, revision_map[r["id"]], current, f"merged from "
                                      f"{source} beside the batch's current revision")
        self._carry_forgets(tx, theirs["forgets"], inserted, revision_map, batch_map)
        for b in theirs["batches"]:
            if batch_map[b["id"]] not in ours and b["current_revision"] is not None:
                self._make_current(tx, batch_map[b["id"]], revision_map[b["current_revision"]])
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
                carried[record["id"]] = self._insert(tx, FORGETS_SQL, (
                    batch_map[record["batch_id"]], record["forgotten_at"],
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
                    self._exec(tx, _COMPLETE_BY_VALUES, (
                        a["status"], a["errors"], self._raw(a["raw"]), a["input_tokens"],
                        a["output_tokens"], a["cached_tokens"], a["cost"], a["model"],
                        a["finished_at"], None, row["id"]))
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
        """A ``forgets`` row says who, when, how and what; nothing is written when nothing is
        owed."""
        with self.transaction() as tx:
            owed = self._exec(tx, UNRESOLVED_SQL.format(select="r.number AS revision, q.task_ids")
                              + " AND b.name = ?", (name,)).fetchall()
            if not owed:
                return None
            revisions = sorted({r["revision"] for r in owed})
            items = len({t for r in owed for t in json.loads(r["task_ids"])})
            batch_id = self._exec(tx, "SELECT id FROM batches WHERE name = ?",
                                  (name,)).fetchone()[0]
            forget_id = self._insert(tx, FORGETS_SQL, (batch_id, stamp, by, via,
                                                       json.dumps(revisions), len(owed), items))
            self._exec(tx, f"UPDATE revisions SET forget_id = ? WHERE batch_id = ? AND number IN "
                       f"({','.join('?' * len(revisions))})", (forget_id, batch_id, *revisions))
        return {"batch": name, "revisions": revisions, "requests": len(owed), "items": items,
                "by": by, "via": via, "at": stamp}

    def forgotten(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every forgetting (of one batch, or all), oldest first: batch, at, by, via, revisions,
        requests, items, and ``in_effect``: how many of its revisions no work has reopened since."""
        return [{**dict(r), "revisions": json.loads(r["revisions"])} for r in self._read(
            'SELECT b.name AS batch, f.forgotten_at AS at, f.forgotten_by AS "by", f.via, '
            "f.revisions, f.requests, f.items, (SELECT COUNT(*) FROM revisions r WHERE "
            f"r.forget_id = f.id AND NOT {LATER_WORK_SQL}) AS in_effect "
            "FROM forgets f JOIN batches b ON b.id = f.batch_id"
            + (" WHERE b.name = ?" if name is not None else "") + " ORDER BY f.id",
            (name,) if name is not None else ())]


# -- where imported attempts go: one revision per batch and way of judging (docs/recovery.md,
# "Import rules"), every admitted item visible in ``values`` and ``status``.
@dataclass
class Group:
    """Receipts of one batch judged alike: one revision."""

    batch: str
    components: dict[str, str]
    own: bool
    validator_name: str | None
    tasks: dict[str, dict] = field(default_factory=dict)  # canonical JSON -> task, in order
    pack: int = 0
    current_there: bool = False  # an export of the revision current where it was exported
    revision_id: int | None = None


@dataclass
class Placement:
    """Where one import puts its attempts: each line's group (by line number); per batch,
    whether it was new when the import began; per revision touched, its lines (as
    ``revision_for`` places them) and whether it was current where it was exported."""

    lines_read: InitVar[Iterable[Any]]
    groups: dict[int, Group] = field(default_factory=dict)
    fresh: dict[str, bool] = field(default_factory=dict)
    lines: dict[int, list[int]] = field(default_factory=dict)
    current_there: dict[int, bool] = field(default_factory=dict)

    def __post_init__(self, lines_read: Iterable[Any]) -> None:
        by_key: dict[tuple[str, str], Group] = {}
        for line in lines_read:
            judged = {k: v for k, v in line.components.items() if k in KEPT}
            key = (line.record["batch"], Keys(line.components).revision if line.own
                   else canonical_json([judged, line.record.get("validator")]))
            if key not in by_key:
                by_key[key] = Group(line.record["batch"], line.components if line.own else judged,
                                    line.own, line.record.get("validator"))
            group = self.groups[line.number] = by_key[key]
            for task in line.tasks:
                group.tasks.setdefault(canonical_json(task), task)
            group.pack = max(group.pack, len(line.tasks))
            group.current_there |= line.own and line.record.get("current") is True


def revision_for(store: AdminStore, tx: Any, line: Any, placed: Placement) -> tuple[int, int]:
    """The batch and revision an imported line's attempt goes to: one of the batch holding its
    request, else its group's (found or made once per import)."""
    name, stamp, group = line.record["batch"], now(), placed.groups[line.number]
    batch_id, current = store._batch_row(tx, name, stamp)
    placed.fresh.setdefault(name, current is None)
    held = store._exec(tx, "SELECT r.id FROM revisions r JOIN requests q ON q.revision_id = r.id "
                       "WHERE r.batch_id = ? AND q.key = ? ORDER BY CASE WHEN r.id = ? THEN 0 "
                       "ELSE 1 END, r.id LIMIT 1",  # the group's revision first
                       (batch_id, line.request.key, group.revision_id or 0)).fetchone()
    if held is not None:
        revision_id = held[0]
    else:
        if group.revision_id is None:
            group.revision_id = _group_revision(store, tx, batch_id, current, group,
                                                placed.fresh[name], stamp)
            placed.current_there[group.revision_id] = group.current_there
        revision_id, request = group.revision_id, line.request
        store._exec(tx, "INSERT INTO requests(revision_id, key, position, parent_key, task_ids, "
                    "tasks) VALUES (?,?, (SELECT COUNT(*) FROM requests WHERE revision_id = ?), "
                    "NULL, ?, ?) ON CONFLICT DO NOTHING",  # after its others
                    (revision_id, request.key, revision_id, request.task_ids_json,
                     request.tasks_json))
    placed.lines.setdefault(revision_id, []).append(line.number)
    return batch_id, revision_id


def _group_revision(store: AdminStore, tx: Any, batch_id: int, current: int | None, group: Group,
                    fresh: bool, stamp: str) -> int:
    """The revision with the group's content; else the batch's current revision when an
    earlier import made it and judged alike (a history file imported again as it grows);
    else a new one: open for a batch new to the ledger, beside a live batch superseded."""
    components = group.components if group.own else {  # an export's: as it was exported
        **group.components, "tasks": tasks_digest(list(group.tasks.values())),
        "pack": str(group.pack)}
    fingerprint = Keys(components).revision
    found = store._revision_with(tx, batch_id, fingerprint)
    if found is not None:
        return found
    if current is not None and not group.own:
        theirs, imports_only = store._exec(  # made by an import: no attempt but imported ones
            tx, "SELECT components, NOT EXISTS (SELECT 1 FROM attempts WHERE revision_id = ? "
            "AND kind != 'import') FROM revisions WHERE id = ?", (current, current)).fetchone()
        theirs = json.loads(theirs)
        if imports_only and "source" not in theirs and {
                k: v for k, v in theirs.items() if k in KEPT} == group.components:
            return current
    revision_id = store._add_revision(tx, batch_id, fingerprint, components, stamp,
                                     validator=(group.validator_name, None),
                                     superseded_by=None if fresh else current,
                                     reason=BESIDE_LIVE)
    if current is None:
        store._make_current(tx, batch_id, revision_id)
    return revision_id


def settle(store: AdminStore, tx: Any, placed: Placement,
           admitted: Mapping[int, int]) -> list[dict[str, Any]]:
    """For each batch new to the ledger that this import gave several revisions, make one
    current (the one current where it was exported, else the most admitted items, else the
    latest line) and record the others beside it; then describe every revision touched.
    ``admitted``: how many items each line (by number) admitted."""
    items = {i: sum(admitted.get(n, 0) for n in lines) for i, lines in placed.lines.items()}
    rows = {r["id"]: r for r in store._revision_rows(tx, list(placed.lines))}
    by_batch: dict[str, list[int]] = {}
    for revision_id in placed.lines:
        by_batch.setdefault(rows[revision_id]["batch"], []).append(revision_id)
    for name, ids in by_batch.items():
        made = [i for i in ids if rows[i]["status"] == "open" and placed.fresh.get(name)]
        if len(made) < 2:
            continue
        winner = max(made, key=lambda i: (placed.current_there.get(i, False), items[i],
                                          max(placed.lines[i])))
        store._make_current(tx, rows[winner]["batch_id"], winner)
        best = json.loads(rows[winner]["components"])
        for other in (i for i in made if i != winner):
            mine = json.loads(rows[other]["components"])
            differ = [k for k in JUDGING if mine.get(k) != best.get(k)] or ["the tasks asked"]
            store._mark_superseded(tx, other, winner, f"imported beside revision "
                                   f"{rows[winner]['number']}: its receipts differ in "
                                   f"{', '.join(differ)}")
    rows = {r["id"]: r for r in store._revision_rows(tx, list(placed.lines))}
    return [{"batch": row["batch"], "revision": row["number"], "current": bool(row["current"]),
             "current_revision": row["current_number"], "lines": placed.lines[row["id"]],
             "admitted_items": items[row["id"]],
             "reason": "" if row["current"] else (row["supersede_reason"] or "")}
            for row in (rows[i] for ids in by_batch.values() for i in ids)]


# -- batchjson's own export format ----------------------------------------------------------
def _identity_names(joined: str, tasks: list[dict]) -> list[str]:
    """The identity field names a revision's components hold joined by commas. A field's own
    name may hold a comma ("a,b"), so the parts are regrouped into names the tasks carry."""
    parts = joined.split(",")
    keys = set(tasks[0]) if tasks else set()

    def regroup(start: int) -> list[str] | None:
        if start == len(parts):
            return []
        for end in range(len(parts), start, -1):
            name = ",".join(parts[start:end])
            rest = regroup(end) if name in keys else None
            if rest is not None:
                return [name, *rest]
        return None

    return (regroup(0) if len(parts) <= 32 else None) or parts


def receipt_of(row: Mapping[str, Any], number: int) -> dict[str, Any]:
    """One attempt row (with its batch, revision number and components, validator name,
    whether its revision is current and its request's tasks) as an importable receipt."""
    components = json.loads(row["components"])
    tasks = json.loads(row["tasks"]) if row["tasks"] else []
    return {
        "format": EXPORT_FORMAT, "batch": row["batch"], "receipt": number,
        "revision": row["revision"], "current": bool(row["current"]), "uid": row["uid"],
        "kind": row["kind"], "status": row["status"], "tasks": tasks,
        "raw": row["raw"], "source": row["source"],
        "identity": _identity_names(
            components.get("identity", "task_id").removesuffix("+echoed"), tasks),
        "identity_echo": components.get("identity", "").endswith("+echoed"),
        "mode": components.get("mode", "items"), "validator": row["validator_name"],
        "errors": json.loads(row["errors"]) if row["errors"] else [],
        "input_tokens": row["input_tokens"], "output_tokens": row["output_tokens"],
        "cached_tokens": row["cached_tokens"], "cost": row["cost"],
        "provider": row["provider"], "model": row["model"], "at": row["started_at"],
        "finished_at": row["finished_at"], "request_key": row["request_key"],
        "components": components,
        "schema": json.loads(components.get("schema_doc") or components.get("schema_shape")
                             or "null"),
    }


EXPORT_SQL = (
    "SELECT a.*, b.name AS batch, r.number AS revision, r.components, r.validator_name, "
    "CASE WHEN b.current_revision = a.revision_id THEN 1 ELSE 0 END AS current, "
    "q.tasks FROM attempts a JOIN batches b ON b.id = a.batch_id "
    "JOIN revisions r ON r.id = a.revision_id LEFT JOIN requests q "
    "ON q.revision_id = a.revision_id AND q.key = a.request_key")
