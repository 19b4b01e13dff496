"""The ledger's memory for re-judging: what each request's model saw, and recheck receipts.

A request key covers what the model saw and how its return is judged; ``seen`` maps each key
to the key of what the model saw alone, so a revision that changed only the judging side finds
earlier raw returns (see :mod:`batchjson._rejudge`). Kept apart from :mod:`batchjson._ledger`,
which holds the receipts and checkpoint every run writes.
    """

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ._ledger import Ledger
from ._records import _uid, now
from ._tasks import Request


def record_seen(ledger: Ledger, pairs: Sequence[tuple[str, str]]) -> None:
    """Remember what the model saw for each request key: (request_key, seen_key)."""
    with ledger.transaction() as db:
        db.executemany("INSERT OR IGNORE INTO seen(request_key, seen_key) VALUES (?, ?)", pairs)


def earlier_returns(ledger: Ledger, seen_keys: Sequence[str]) -> list[sqlite3.Row]:
    """Raw returns of earlier exact (non-repair) attempts that saw one of ``seen_keys``,
    accepted ones first, newest first."""
    return ledger._by_keys(_EARLIER_SQL, list(dict.fromkeys(seen_keys)))


def legacy_returns(ledger: Ledger, keys: Sequence[str], provider: str | None,
                   model: str | None) -> list[sqlite3.Row]:
    """Accepted returns under request keys as batchjson keyed them before the answer source
    was part of the key, from the same provider name and model (``seen_key`` is the old key)."""
    rows = ledger._by_keys(_LEGACY_SQL, list(dict.fromkeys(keys)))
    # An imported receipt has no answer source on record; importing it was the user's
    # choice to reuse it, so it is re-judged under the current rules whoever answered.
    return [r for r in rows
            if r["kind"] == "import" or (r["provider"] == provider and r["model"] == model)]


def commit_rechecks(ledger: Ledger, batch_id: int, revision_id: int,
                    entries: Sequence[tuple[Request, sqlite3.Row, Mapping[str, Any]]],
                    source: str | None) -> None:
    """Commit re-judged returns: per (request, earlier attempt, stored items) a receipt of kind
    'recheck' with cost 0 (no call was made) and its checkpoint rows, all in one transaction."""
    stamp = now()
    with ledger.transaction() as db:
        for request, origin, items in entries:
            attempt_id = db.execute(
                "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                "status, errors, raw, input_tokens, output_tokens, cached_tokens, cost, "
                "provider, model, started_at, finished_at, uid, source) VALUES "
                "(?,?,?,?, 'recheck', 'accepted', '[]', ?, 0, 0, 0, 0.0, ?,?,?,?,?,?)",
                (batch_id, revision_id, request.key, request.task_ids_json, origin["raw"],
                 origin["provider"], origin["model"], stamp, stamp, _uid(),
                 source)).lastrowid
            db.execute("INSERT INTO rechecks(attempt_id, from_attempt) VALUES (?, ?)",
                       (attempt_id, origin["id"]))
            db.executemany(  # written once, never re-pointed (see op_accept)
                "INSERT INTO checkpoint(batch_id, request_key, task_id, "
                "attempt_id, item, committed_at) VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                [(batch_id, request.key, task_id, attempt_id, json.dumps(item), stamp)
                 for task_id, item in items.items()])


def legacy_unresolved(ledger: Ledger, keys: Sequence[str]) -> list[sqlite3.Row]:
    """Leaf requests under old-style keys (see ``legacy_returns``) with no accepted return."""
    return ledger._by_keys(
        "SELECT q.key, q.task_ids, q.tasks, q.revision_id, r.batch_id FROM requests q "
        "JOIN revisions r ON r.id = q.revision_id WHERE q.key IN ({marks}) AND q.split = 0 "
        "AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.request_key = q.key "
        "AND a.status = 'accepted')", list(dict.fromkeys(keys)))


def accepted_return(ledger: Ledger, key: str) -> tuple[sqlite3.Row, dict[str, Any]] | None:
    """The latest accepted attempt for ``key`` and the items it committed, or None."""
    rows = ledger._rows("SELECT id, raw, provider, model FROM attempts WHERE request_key = ? "
                        "AND status = 'accepted' AND raw IS NOT NULL ORDER BY id DESC LIMIT 1",
                        (key,))
    if not rows:
        return None
    items = ledger._rows("SELECT task_id, item FROM checkpoint WHERE attempt_id = ?",
                         (rows[0]["id"],))
    return rows[0], {r["task_id"]: json.loads(r["item"]) for r in items}


_EARLIER_SQL = (
    "SELECT s.seen_key, a.id, a.request_key, a.raw, a.provider, a.model, a.status "
    "FROM seen s JOIN attempts a ON a.request_key = s.request_key "
    "WHERE s.seen_key IN ({marks}) AND a.raw IS NOT NULL AND a.kind != 'repair' "
    "AND a.status IN ('accepted', 'rejected', 'cancelled') "
    "ORDER BY a.status = 'accepted' DESC, a.id DESC")


_LEGACY_SQL = (
    "SELECT a.request_key AS seen_key, a.id, a.request_key, a.raw, a.provider, a.model, a.status, "
    "a.kind "
    "FROM attempts a WHERE a.request_key IN ({marks}) AND a.status = 'accepted' "
    "AND a.source IS NULL AND a.raw IS NOT NULL AND a.kind != 'repair' ORDER BY a.id DESC")
