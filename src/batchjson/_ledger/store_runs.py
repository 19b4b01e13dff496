"""The store's SQL for what a run reads and opens, what is owed, and re-judging's memory."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from .._canon import read_json
from .._content.tasks import Request
from .._sources import stop_types
from .records import Receipt, Revision, _receipt, _revision, _uid, now
from .store_base import Row, StoreBase, Tx

INSERT_ROWS = 2000  # rows a streamed insert writes per statement batch
JUDGED = ("tasks", "schema", "validator", "pack", "instructions", "identity", "mode")


class RunStore(StoreBase):
    """Batches, revisions and requests; accepted values; evidence; re-judging's memory."""

    # -- batches and revisions ---------------------------------------------------------------
    def _revisions(self, name: str | None = None, *, fingerprint: str | None = None,
                   revision_id: int | None = None, status: str | None = None,
                   current: bool = False) -> list[Revision]:
        """``Ledger.revisions``: one statement, each argument given one more filter."""
        where, args = _filters({"b.name": name, "r.fingerprint": fingerprint, "r.id": revision_id,
                                "r.status": status}, ["r.id = b.current_revision"] * current)
        return [_revision(r) for r in self._read(REVISION_SQL + where + " ORDER BY r.id", args)]

    def _batch_names(self) -> list[str]:
        return [r["name"] for r in self._read("SELECT name FROM batches ORDER BY id")]

    def _batch_row(self, tx: Tx, name: str, stamp: str) -> tuple[int, int | None]:
        """(batch id, current revision id) of batch ``name``, made if new, in ``tx``."""
        row = self._exec(tx, "SELECT id, current_revision FROM batches WHERE name = ?",
                         (name,)).fetchone()
        if row is None:
            return self._insert(tx, "INSERT INTO batches(name, created_at) VALUES (?, ?)",
                                (name, stamp)), None
        return row["id"], row["current_revision"]

    def open_revision(self, name: str, fingerprint: str, components: Mapping[str, str],
                      requests: Iterable[Request], *, strict: bool,
                      validator: Mapping[str, Any] | None = None,
                      ) -> tuple[Revision, Revision | None]:
        """This content's revision, made current, and the one it superseded (never ``strict``)."""
        stamp = now()
        with self.transaction() as tx:
            batch_id, previous_id = self._batch_row(tx, name, stamp)
            revision_id = self._revision_with(tx, batch_id, fingerprint)
            if revision_id is not None:
                self._exec(tx, "UPDATE revisions SET status = 'open', superseded_by = NULL, "
                           "supersede_reason = NULL, forget_id = NULL WHERE id = ?",
                           (revision_id,))  # a forgotten revision run again owes again
            else:
                revision_id = self._add_revision(
                    tx, batch_id, fingerprint, components, stamp,
                    validator=(validator["name"], validator["version"]) if validator else None)
                self._insert_requests(tx, revision_id, requests)
            superseded = (self._supersede(tx, previous_id, revision_id, components)
                          if previous_id not in (None, revision_id) and not strict else None)
            self._make_current(tx, batch_id, revision_id)
        [current] = self._revisions(revision_id=revision_id)
        return current, (self._revisions(revision_id=superseded)[0] if superseded else None)

    def _revision_with(self, tx: Tx, batch_id: int, fingerprint: str) -> int | None:
        row = self._exec(tx, "SELECT id FROM revisions WHERE batch_id = ? AND fingerprint = ?",
                         (batch_id, fingerprint)).fetchone()
        return row["id"] if row is not None else None

    def _add_revision(self, tx: Tx, batch_id: int, fingerprint: str,
                     components: Mapping[str, str], stamp: str, *,
                     validator: tuple[str | None, int | None] | None = None,
                     superseded_by: int | None = None, reason: str | None = None) -> int:
        """A new revision numbered after the batch's others, open unless ``superseded_by``."""
        number = self._exec(tx, "SELECT COALESCE(MAX(number), 0) + 1 FROM revisions WHERE "
                            "batch_id = ?", (batch_id,)).fetchone()[0]
        name, version = validator or (None, None)
        return self._insert(
            tx, "INSERT INTO revisions(batch_id, number, fingerprint, components, "
            "validator_name, validator_version, validator_fingerprint, status, superseded_by, "
            "supersede_reason, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (batch_id, number, fingerprint, json.dumps(dict(components)), name, version,
             components.get("validator"), "open" if superseded_by is None else "superseded",
             superseded_by, reason if superseded_by is not None else None, stamp))

    def _supersede(self, tx: Tx, previous_id: int, revision_id: int,
                   components: Mapping[str, str]) -> int | None:
        """The previous revision superseded, naming what changed; None (left) if it owed nothing."""
        owed = self._exec(tx, UNRESOLVED_SQL.format(select="COUNT(*)") + " AND q.revision_id = ?",
                          (previous_id,)).fetchone()[0]
        if not owed:
            return None
        old = json.loads(self._exec(tx, "SELECT components FROM revisions WHERE id = ?",
                                    (previous_id,)).fetchone()[0])
        changed = [k for k in JUDGED if old.get(k) != components.get(k)]
        self._mark_superseded(tx, previous_id, revision_id,
                              "changed: " + ", ".join(changed or ["content"]))
        return previous_id

    def _mark_superseded(self, tx: Tx, revision_id: int, by: int, reason: str) -> None:
        self._exec(tx, "UPDATE revisions SET status = 'superseded', superseded_by = ?, "
                   "supersede_reason = ? WHERE id = ?", (by, reason, revision_id))

    def _make_current(self, tx: Tx, batch_id: int, revision_id: int) -> None:
        self._exec(tx, "UPDATE batches SET current_revision = ? WHERE id = ?",
                   (revision_id, batch_id))

    def _insert_requests(self, tx: Tx, revision_id: int, requests: Iterable[Request]) -> None:
        """``requests`` (a list, or a stream of a million) in ``tx``."""
        self._stream(tx, REQUESTS_SQL, ((revision_id, r.key, r.position, r.parent_key,
                                         r.task_ids_json, r.tasks_json) for r in requests))

    def _stream(self, tx: Tx, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """``sql`` for each of ``rows`` (a stream) in ``tx``, :data:`INSERT_ROWS` at a time."""
        rows = iter(rows)
        while chunk := list(islice(rows, INSERT_ROWS)):
            self._many(tx, sql, chunk)

    def record_split(self, revision_id: int, parent: Request, children: Sequence[Request]) -> None:
        """Replace a leaf request by its halves; the parent stays on record as split."""
        with self.transaction() as tx:
            self._exec(tx, "UPDATE requests SET split = 1 WHERE revision_id = ? AND key = ?",
                       (revision_id, parent.key))
            self._insert_requests(tx, revision_id, children)

    def _leaves(self, revision_id: int) -> list[Request]:
        return [Request(r["key"], tuple(read_json(r["tasks"])), r["position"], r["parent_key"],
                        tasks_json=r["tasks"]) for r in self._read(
            "SELECT key, tasks, position, parent_key FROM requests WHERE revision_id = ? AND "
            "split = 0 ORDER BY position, id", (revision_id,))]

    def leaf_pages(self, revision_id: int, positions: int) -> Iterator[list[Row]]:
        """A revision's leaf requests as stored, ``positions`` positions a page: a request and
        its halves share a position, so no page holds a half of one an earlier page held."""
        last = self._read("SELECT MAX(position) FROM requests WHERE revision_id = ?",
                          (revision_id,))[0][0]
        for start in range(0, -1 if last is None else last + 1, positions):
            yield self._read("SELECT key, tasks, task_ids, position, parent_key FROM requests "
                             "WHERE revision_id = ? AND split = 0 AND position >= ? AND "
                             "position < ? ORDER BY position, id",
                             (revision_id, start, start + positions))

    # -- attempts and accepted values ----------------------------------------------------------
    def accepted_keys(self, keys: Sequence[str]) -> set[str]:
        """Keys with an accepted return, under any batch: evidence is content, not a name."""
        return {r[0] for r in self._by_keys(
            "SELECT DISTINCT request_key FROM attempts WHERE status = 'accepted' AND "
            "request_key IN ({marks})", keys)}

    def attempts_so_far(self, keys: Sequence[str]
                        ) -> tuple[dict[str, int], dict[str, set[str]], dict[str, list[str]]]:
        """Of each request among ``keys`` (any batch, any run): its attempts so far, the stop
        reasons its returns were rejected for (``_sources.stop_types``), and the tasks a return
        accepted in part rejected (a run splits it the same way)."""
        counts = {r[0]: r[1] for r in self._by_keys(
            "SELECT request_key, COUNT(*) FROM attempts WHERE request_key IN ({marks}) "
            "GROUP BY request_key", keys)}
        found: dict[str, set[str]] = {}
        parted: dict[str, list[str]] = {}
        for key, status, errors in self._by_keys(
                "SELECT request_key, status, errors FROM attempts WHERE request_key IN "
                "({marks}) AND status IN ('rejected', 'partial') ORDER BY id", keys):
            if status == "partial":
                parted[key] = list(dict.fromkeys(e["task_id"] for e in json.loads(errors)))
            else:  # (an empty set: rejected for no stop of the provider's)
                found.setdefault(key, set()).update(stop_types(errors))
        return counts, found, parted

    def _receipts(self, name: str, *, failed: bool = False) -> list[Receipt]:
        sql = RECEIPT_SQL + " WHERE b.name = ?" + (" AND a.status != 'accepted'" if failed else "")
        return [_receipt(r) for r in self._read(sql + " ORDER BY a.id", (name,))]

    def _checkpoint(self, name: str, revision_id: int | None = None) -> dict[str, Any]:
        rows = self._read(  # of ``revision_id``, else of the batch's current revision
            f"SELECT c.task_id, c.item, {self.dialect.json_valid.format('c.item')}, q.position, "
            "COALESCE(o.task_ids, q.task_ids) FROM requests q JOIN checkpoint c "
            "ON c.request_key = q.key "
            f"{ROOT_JOIN} WHERE q.revision_id = COALESCE(?, "
            "(SELECT current_revision FROM batches WHERE name = ?)) AND q.split = 0 "
            "ORDER BY q.position, q.id, c.attempt_id", (revision_id, name))
        if all(r[2] for r in rows):  # each item one JSON text (the database says): one decode
            items = read_json("[" + ",".join(r[1] for r in rows) + "]")
        else:  # joined, "1,2" next to "[3" and "4]" would shift values between tasks
            items = [read_json(r[1]) for r in rows]
        # a request's items (a split one's parts too) in its tasks' order, not its rows' (a
        # pack's rows come in task_id order: t10 before t8); the latest accepted row wins
        roots = {r[3]: r[4] for r in rows}
        order = {(at, t): n for at, root in roots.items() for n, t in enumerate(json.loads(root))}
        ranked = sorted(range(len(rows)), key=lambda i: (rows[i][3], order.get(
            (rows[i][3], rows[i][0]), -1)))  # stable: a task's later rows stay later
        return {rows[i][0]: items[i] for i in ranked}

    def value_count(self, name: str | None = None, *, revision_id: int | None = None) -> int:
        """Tasks with an accepted value, of one revision, else ``name``'s (or every) current one.
        A revision's leaf requests partition its tasks, so the distinct count is taken per request
        (a key's rows under several batches counted once) and no set of every task is built."""
        where, args = ("= ?", (revision_id,)) if revision_id is not None else (
            "IN (SELECT current_revision FROM batches" + (" WHERE name = ?)" if name else ")"),
            (name,) if name else ())
        return self._read(
            "SELECT COALESCE(SUM((SELECT COUNT(DISTINCT c.task_id) FROM checkpoint c "
            "WHERE c.request_key = q.key)), 0) FROM requests q WHERE q.split = 0 "
            "AND q.revision_id " + where, args)[0][0]

    def revision_values(self, revision_id: int, *,
                        page: tuple[tuple[int, int], int] | None = None,
                        task: tuple[str, str] | None = None) -> list[Row]:
        """A revision's leaf requests in task order with their values in commit order (the
        latest wins): (position, id, task_id, item, the task ids of the request, else of the one
        it was split from). ``page``:
        (after (position, id), limit) leaf requests; else ``task``: (request key, task_id)."""
        leaves, join, args = LEAVES_SQL, "", [revision_id]
        if page is not None:  # a range of requests_in_order: each page costs only its own rows
            (position, request_id), limit = page
            leaves += " AND (position, id) > (?, ?) ORDER BY position, id LIMIT ?"
            args += [position, request_id, limit]
        elif task is not None:
            leaves, join = leaves + " AND key = ?", " AND c.task_id = ?"
            args += list(task)
        return self._read(
            "SELECT q.position, q.id, c.task_id, c.item, COALESCE(o.task_ids, q.task_ids) FROM "
            f"({leaves}) q LEFT JOIN checkpoint c ON c.request_key = q.key{join} {ROOT_JOIN} "
            "ORDER BY q.position, q.id, c.attempt_id", args)

    def revision_lookup(self, revision_id: int) -> tuple[list[tuple[str, str]], set[str]]:
        """(key, task_ids JSON) of a revision's leaf requests, and those accepted (whole)."""
        rows = self._read("SELECT q.key, q.task_ids, EXISTS (SELECT 1 FROM checkpoint c WHERE "
                          "c.request_key = q.key) FROM requests q WHERE q.revision_id = ? AND "
                          "q.split = 0", (revision_id,))
        return [(r[0], r[1]) for r in rows], {r[0] for r in rows if r[2]}

    # -- what is owed --------------------------------------------------------------------------
    def unresolved(self, name: str | None = None, *, validator: str | None = None
                   ) -> list[Row]:
        """Leaf requests of open revisions (of ``name``, ``validator``) with no accepted return."""
        where, args = _filters({"b.name": name, "r.validator_fingerprint": validator},
                               joined="AND")
        return self._read(UNRESOLVED_SQL.format(
            select="b.name AS batch, r.number AS revision, q.key, q.task_ids")
            + where + " ORDER BY b.id, r.number, q.position", args)

    # -- validator versions --------------------------------------------------------------------
    def number_validator(self, name: str, fingerprint: str, where: str | None,
                         by_identity: Sequence[str] = ()) -> int:
        """The version number of this content of ``name``: as recorded, or the next one."""
        with self.transaction() as tx:
            row = self._exec(tx, "SELECT version FROM validators WHERE name = ? AND "
                             "fingerprint = ?", (name, fingerprint)).fetchone()
            if row is not None:
                return row[0]
            version = self._exec(tx, "SELECT COALESCE(MAX(version), 0) + 1 FROM validators "
                                 "WHERE name = ?", (name,)).fetchone()[0]
            self._exec(tx, VALIDATORS_SQL, (name, version, fingerprint, where, now(),
                                            json.dumps(list(by_identity))))
            return version

    def _validator_rows(self) -> list[Row]:
        return self._read(
            "SELECT v.name, v.version, v.fingerprint, v.where_defined, v.defined_at, "
            "b.name AS batch FROM validators v LEFT JOIN revisions r "
            "ON r.validator_fingerprint = v.fingerprint LEFT JOIN batches b "
            "ON b.id = r.batch_id ORDER BY v.name, v.version, b.name")

    # -- re-judging's memory -------------------------------------------------------------------
    def record_seen(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Remember what the model saw for each request key: (request_key, seen_key) pairs."""
        with self.transaction() as tx:
            self._stream(tx, SEEN_SQL, pairs)

    def task_file(self, digest: str, holds: tuple[str, int, Sequence[str]] | None = None
                  ) -> tuple[str, int, list[str]] | None:
        """What a tasks file of ``digest`` holds (``holds``, remembered first), or None."""
        if holds is not None:
            with self.transaction() as tx:
                self._exec(tx, "INSERT INTO task_files(digest, tasks, count, fields) VALUES "
                           "(?, ?, ?, ?) ON CONFLICT DO NOTHING",
                           (digest, holds[0], holds[1], json.dumps(list(holds[2]))))
        rows = self._read("SELECT tasks, count, fields FROM task_files WHERE digest = ?",
                          (digest,))
        return (rows[0][0], rows[0][1], json.loads(rows[0][2])) if rows else None

    def completed_revision(self, name: str, fingerprint: str) -> tuple[int, int, int] | None:
        """(id, number, leaves) of ``name``'s revision ``fingerprint`` if it has nothing to do."""
        rows = self._read(
            "SELECT r.id, r.number, COUNT(q.id), COUNT(a.request_key) FROM batches b "
            "JOIN revisions r ON r.id = b.current_revision JOIN requests q ON "
            "q.revision_id = r.id AND q.split = 0 LEFT JOIN (SELECT DISTINCT request_key FROM "
            "attempts WHERE status = 'accepted') a ON a.request_key = q.key WHERE b.name = ? "
            "AND r.fingerprint = ? AND r.status = 'open' AND r.forget_id IS NULL "
            "GROUP BY r.id, r.number", (name, fingerprint))
        return (rows[0][0], rows[0][1], rows[0][2]) if rows and rows[0][2] == rows[0][3] else None

    def earlier_returns(self, seen_keys: Sequence[str], sourceless_keys: Sequence[str] = ()
                        ) -> tuple[list[Row], list[Row]]:
        """Raw returns of earlier attempts that saw one of ``seen_keys``, accepted then newest
        first; and accepted imports of unknown answer source under ``sourceless_keys``."""
        sourceless = list(dict.fromkeys(sourceless_keys))
        return (self._by_keys(EARLIER_SQL, list(dict.fromkeys(seen_keys))),
                self._by_keys(SOURCELESS_SQL, sourceless) if sourceless else [])

    def has_sourceless_answers(self) -> bool:
        """Whether any import has no answer source (only then are sourceless keys looked up)."""
        return bool(self._read(
            "SELECT COUNT(*) FROM (SELECT 1 FROM imports i JOIN attempts a ON a.id = "
            "i.attempt_id WHERE a.source IS NULL LIMIT 1) AS s")[0][0])

    def sourceless_unresolved(self, keys: Sequence[str]) -> list[Row]:
        """Leaf requests under ``keys`` (without an answer source) with no accepted return."""
        return self._by_keys(
            "SELECT q.key, q.task_ids, q.tasks, q.revision_id, r.batch_id FROM requests q "
            "JOIN revisions r ON r.id = q.revision_id WHERE q.key IN ({marks}) AND q.split = 0 "
            "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.request_key = q.key "
            "AND a.status = 'accepted')", list(dict.fromkeys(keys)))

    def accepted_return(self, key: str) -> tuple[Row, dict[str, Any]] | None:
        """The latest accepted attempt for ``key`` and the items it committed, or None."""
        rows = self._read("SELECT id, raw, provider, model FROM attempts WHERE request_key = ? "
                          "AND status = 'accepted' AND raw IS NOT NULL ORDER BY id DESC LIMIT 1",
                          (key,))
        if not rows:
            return None
        items = self._read("SELECT task_id, item FROM checkpoint WHERE attempt_id = ?",
                           (rows[0]["id"],))
        return rows[0], {r["task_id"]: json.loads(r["item"]) for r in items}

    def commit_rechecks(self, tx: Tx, batch_id: int, revision_id: int,
                        entries: Sequence[tuple[Request, Row, Mapping[str, str]]],
                        source: str | None) -> None:
        """Per (request, earlier attempt, items), in ``tx`` (one that reads before it writes),
        a 'recheck' receipt costing 0 and its items, unless the request was admitted since. An
        attempt passing in part (``parted``: the request it answered, its rest, the rest's errors
        and its raw; see ``rejudge.in_part``) is recorded as a live partial return is: a 'partial'
        recheck of that request, split into ``request`` (the part accepted) and its rest."""
        stamp = now()
        admitting = [(origin["parted"][0] if "parted" in origin.keys() else request).key
                     for request, origin, _ in entries]
        self._admitting_all(tx, admitting)  # a request admitted meanwhile is done
        done = {r[0] for r in self._by_keys(ADMITTED_SQL, admitting, tx)}
        for (request, origin, items), key in zip(entries, admitting, strict=True):
            if key in done:
                continue
            parted = origin["parted"] if "parted" in origin.keys() else None
            if parted is not None:
                parent, rest, errors, raw = parted
                self._recheck(tx, (batch_id, revision_id, parent.key, parent.task_ids_json),
                              "partial", errors, raw, origin, source, stamp)
                if not self._split_request(tx, revision_id, parent, request, rest):
                    continue
            attempt_id = self._recheck(
                tx, (batch_id, revision_id, request.key, request.task_ids_json), "accepted",
                (), origin["raw"], origin, source, stamp)
            self._many(tx, CHECKPOINT_SQL,  # written once, never re-pointed
                       [(batch_id, request.key, task_id, attempt_id, item, stamp)
                        for task_id, item in items.items()])

    def _split_request(self, tx: Tx, revision_id: int, parent: Request, kept: Request,
                       rest: Request) -> bool:
        """``parent`` split in ``revision_id`` into ``kept`` (a return's accepted part) and
        ``rest``: whether ``kept``'s items are still to be admitted (another return admitted them
        first: never twice)."""
        self._exec(tx, "UPDATE requests SET split = 1 WHERE revision_id = ? AND key = ?",
                   (revision_id, parent.key))
        self._insert_requests(tx, revision_id, (kept, rest))
        return self._exec(tx, "SELECT 1 FROM attempts WHERE request_key = ? AND status = "
                          "'accepted' LIMIT 1", (kept.key,)).fetchone() is None

    def _recheck(self, tx: Tx, where: tuple[int, int, str, str], status: str,
                 errors: Sequence[Mapping[str, Any]], raw: str, origin: Row,
                 source: str | None, stamp: str) -> int:
        """A 'recheck' receipt costing 0 of (batch, revision, request key, task ids) ``where``,
        from the call that answered ``origin``."""
        attempt_id = self._insert(
            tx, "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, "
            "kind, status, errors, raw, input_tokens, output_tokens, cached_tokens, "
            "cost, provider, model, started_at, finished_at, uid, source) VALUES "
            "(?,?,?,?, 'recheck', ?,?,?, 0, 0, 0, 0.0, ?,?,?,?,?,?)",
            (*where, status, json.dumps(list(errors)) if errors else "[]", self._raw(raw),
             origin["provider"], origin["model"], stamp, stamp, _uid(), source))
        self._exec(tx, "INSERT INTO rechecks(attempt_id, from_attempt) VALUES (?, "
                   "COALESCE((SELECT from_attempt FROM rechecks WHERE attempt_id = ?), ?))",
                   (attempt_id, origin["id"], origin["id"]))  # the call that answered
        return attempt_id


def _filters(equal: Mapping[str, Any], more: Sequence[str] = (), joined: str = "WHERE"
             ) -> tuple[str, tuple[Any, ...]]:
    """`` WHERE column = ? AND ...`` for each given value of ``equal``, and ``more``."""
    given = {column: value for column, value in equal.items() if value is not None}
    conditions = [f"{column} = ?" for column in given] + list(more)
    return (f" {joined} " + " AND ".join(conditions) if conditions else ""), tuple(given.values())


REVISION_SQL = (
    "SELECT r.id, r.batch_id, b.name AS batch, r.number, r.fingerprint, r.components, r.status, "
    "r.supersede_reason, r.validator_name, r.created_at, n.number AS superseded_by "
    "FROM revisions r JOIN batches b ON b.id = r.batch_id "
    "LEFT JOIN revisions n ON n.id = r.superseded_by")

RECEIPT_SQL = (
    "SELECT a.*, b.name AS batch, r.number AS revision FROM attempts a "
    "JOIN batches b ON b.id = a.batch_id JOIN revisions r ON r.id = a.revision_id")

# A forgetting covers the work there was when it was made: a forgotten revision owes again
# once an attempt on it starts or ends after it (a run still going on, a later run, attempts
# merged or imported from elsewhere, by their own times).
LATER_WORK_SQL = (
    "EXISTS (SELECT 1 FROM forgets f JOIN attempts a ON a.batch_id = f.batch_id "
    "WHERE f.id = r.forget_id AND a.revision_id = r.id "
    "AND COALESCE(a.finished_at, a.started_at) > f.forgotten_at)")

UNRESOLVED_SQL = (
    "SELECT {select} FROM requests q JOIN revisions r ON r.id = q.revision_id "
    "JOIN batches b ON b.id = r.batch_id WHERE r.status = 'open' "
    "AND (r.forget_id IS NULL OR " + LATER_WORK_SQL + ") "
    "AND q.split = 0 "
    "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.request_key = q.key "
    "AND a.status = 'accepted')")

# A split request's parts joined to the request they were made from (``o``), for its task order.
ROOT_JOIN = ("LEFT JOIN requests o ON q.parent_key IS NOT NULL AND o.revision_id = q.revision_id "
             "AND o.position = q.position AND o.parent_key IS NULL")
LEAVES_SQL = ("SELECT id, position, key, parent_key, revision_id, task_ids FROM requests "
              "WHERE revision_id = ? AND split = 0")
REQUESTS_SQL = ("INSERT INTO requests(revision_id, key, position, parent_key, task_ids, tasks) "
                "VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING")
VALIDATORS_SQL = ("INSERT INTO validators(name, version, fingerprint, where_defined, defined_at, "
                  "by_identity) VALUES (?,?,?,?,?,?)")
SEEN_SQL = "INSERT INTO seen(request_key, seen_key) VALUES (?, ?) ON CONFLICT DO NOTHING"

# Of a chunk of request keys, those admitted whole or in part.
ADMITTED_SQL = ("SELECT DISTINCT request_key FROM attempts WHERE request_key IN ({marks}) AND "
                "status IN ('accepted', 'partial')")
CHECKPOINT_SQL = (
    "INSERT INTO checkpoint(batch_id, request_key, task_id, attempt_id, item, committed_at) "
    "VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING")

# An accepted answer is evidence for its request whatever prompt produced it (a repair's too);
# ``kind`` is that of the call that answered (a recheck's is its origin's). A partial return is
# judged again whole, as a rejected one is: new judging may accept all of it.
EARLIER_SQL = (
    "SELECT s.seen_key, a.id, a.request_key, a.raw, a.provider, a.model, a.status, a.errors, "
    "COALESCE(o.kind, a.kind) AS kind FROM seen s JOIN attempts a "
    "ON a.request_key = s.request_key LEFT JOIN rechecks k ON k.attempt_id = a.id "
    "LEFT JOIN attempts o ON o.id = k.from_attempt "
    "WHERE s.seen_key IN ({marks}) AND a.raw IS NOT NULL "
    "AND (a.kind != 'repair' OR a.status = 'accepted') "
    "AND a.status IN ('accepted', 'partial', 'rejected', 'cancelled') "
    "ORDER BY CASE WHEN a.status = 'accepted' THEN 0 ELSE 1 END, a.id DESC")

SOURCELESS_SQL = (
    "SELECT a.request_key AS seen_key, a.id, a.request_key, a.raw, a.provider, a.model, "
    "a.status, a.kind FROM attempts a WHERE a.request_key IN ({marks}) AND a.status = 'accepted' "
    "AND a.kind = 'import' AND a.source IS NULL AND a.raw IS NOT NULL ORDER BY a.id DESC")

