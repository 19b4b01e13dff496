"""The store's SQL for history brought in and sent out: imported receipts, the revisions they
go to, and batchjson's own export.

The import's logic (what a line is, how it is judged, which revision it joins) is in
``recovery.py`` and ``import_revisions.py``; they run these methods inside one transaction of
the store, so an import is whole or nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._content.tasks import Request
from .records import now
from .store_base import Row, Tx
from .store_calls import CallStore
from .store_runs import RunStore


class ImportStore(CallStore, RunStore):
    """Imported receipts and their revisions; the export's rows."""

    def imported_before(self, tx: Tx, digest: str, uid: str | None
                        ) -> tuple[Row | None, Row | None]:
        """What the ledger holds of a receipt line, in ``tx``: where a line with this digest
        was imported before (line, source), and (id, batch_id, status) of the attempt with
        its global id ``uid``; each None when there is none."""
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
                      usage: Mapping[str, Any], completes: int | None = None) -> int:
        """Write one imported receipt, in ``tx``: its attempt (a new one of kind ``import``,
        or, with ``completes``, the in-flight attempt of the same call it completes), its
        checkpoint rows when ``status`` is accepted, and the line's ``imports`` row. The
        receipt mapping holds batch_id, revision_id, request, provider, model, at, uid,
        source, digest, file, line and outcome. Returns the attempt's id."""
        if completes is not None:
            attempt_id = completes
            self._exec(tx, "UPDATE attempts SET status = 'in_flight' WHERE id = ?", (completes,))
        else:
            request: Request = receipt["request"]
            attempt_id = self._insert(
                tx, "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                "status, errors, raw, input_tokens, output_tokens, cached_tokens, cost, provider, "
                "model, started_at, finished_at, uid, sent_at, source) VALUES (?,?,?,?, 'import', "
                "'in_flight', NULL, NULL, NULL, NULL, NULL, NULL, ?, ?, ?, NULL, ?, ?, ?)",
                (receipt["batch_id"], receipt["revision_id"], request.key,
                 request.task_ids_json, receipt["provider"], receipt["model"], receipt["at"],
                 receipt["uid"], receipt["sent_at"], receipt["source"]))
        accepted = (receipt["batch_id"], receipt["request"].key, stored)
        self.complete_call(tx, attempt_id, status, receipt["raw"], usage, errors=errors,
                           accepted=accepted if status == "accepted" else None)
        self._exec(tx, "INSERT INTO imports(digest, attempt_id, source, line, outcome, "
                   "imported_at) VALUES (?,?,?,?,?,?)",
                   (receipt["digest"], attempt_id, receipt["file"], receipt["line"],
                    receipt["outcome"], now()))
        return attempt_id

    # -- the revisions imported attempts go to -------------------------------------------------
    def _revision_holding(self, tx: Tx, batch_id: int, key: str,
                         preferred: int | None) -> int | None:
        """A revision of the batch that holds request ``key`` (``preferred`` first), or None."""
        row = self._exec(tx, "SELECT r.id FROM revisions r JOIN requests q ON q.revision_id = "
                         "r.id WHERE r.batch_id = ? AND q.key = ? ORDER BY CASE WHEN r.id = ? "
                         "THEN 0 ELSE 1 END, r.id LIMIT 1",
                         (batch_id, key, preferred or 0)).fetchone()
        return row["id"] if row is not None else None

    def _imported_revision(self, tx: Tx, revision_id: int) -> dict[str, str] | None:
        """The components of ``revision_id`` when an import made it (no attempt of it but
        imported ones), else None."""
        row = self._exec(tx, "SELECT components, NOT EXISTS (SELECT 1 FROM attempts WHERE "
                         "revision_id = ? AND kind != 'import') AS imports_only FROM revisions "
                         "WHERE id = ?", (revision_id, revision_id)).fetchone()
        return json.loads(row["components"]) if row["imports_only"] else None

    def _add_import_request(self, tx: Tx, revision_id: int, request: Request) -> None:
        """Add ``request`` to the revision, after its others (kept if already there)."""
        self._exec(tx, "INSERT INTO requests(revision_id, key, position, parent_key, task_ids, "
                   "tasks) VALUES (?,?, (SELECT COUNT(*) FROM requests WHERE revision_id = ?), "
                   "NULL, ?, ?) ON CONFLICT DO NOTHING",
                   (revision_id, request.key, revision_id, request.task_ids_json,
                    request.tasks_json))

    def _make_current(self, tx: Tx, batch_id: int, revision_id: int) -> None:
        self._exec(tx, "UPDATE batches SET current_revision = ? WHERE id = ?",
                   (revision_id, batch_id))

    def _supersede_by_import(self, tx: Tx, revision_id: int, by: int, reason: str) -> None:
        self._exec(tx, "UPDATE revisions SET status = 'superseded', superseded_by = ?, "
                   "supersede_reason = ? WHERE id = ?", (by, reason, revision_id))

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
    def _export_rows(self, name: str | None = None) -> list[Row]:
        """Every attempt (of one batch, or all) in call order, with its batch, revision,
        components, validator name, whether its revision is current and its request's tasks."""
        where, args = (" WHERE b.name = ?", (name,)) if name else ("", ())
        return self._read(EXPORT_SQL + where + " ORDER BY a.id", args)


EXPORT_SQL = (
    "SELECT a.*, b.name AS batch, r.number AS revision, r.components, r.validator_name, "
    "CASE WHEN b.current_revision = a.revision_id THEN 1 ELSE 0 END AS current, "
    "q.tasks FROM attempts a JOIN batches b ON b.id = a.batch_id "
    "JOIN revisions r ON r.id = a.revision_id LEFT JOIN requests q "
    "ON q.revision_id = a.revision_id AND q.key = a.request_key")
