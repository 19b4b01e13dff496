"""Merging another ledger into this one, so every attempt ever made stays in one account.

Idempotent (attempts match by ``uid``, revisions by batch and fingerprint) and one transaction. A
merge is an import: each accepted attempt is rechecked as a receipt is
(``recovery.recheck_receipt``); one that fails is merged as rejected and named."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .._canon import canonical_json as _json
from .._ledger.ledger import other_tables
from .._ledger.store import Store
from .._ledger.store_admin import receipt_of
from .._loop import run_sync
from .recovery import recheck_receipt, registry_view


def merge_ledger(store: Store, other: str | Path, validators: Any = None) -> dict[str, Any]:
    """Bring the other ledger (a file or a ``postgresql://`` URL) into the store's: what was added
    and what was not admitted. ``validators`` (name -> function) recheck the batches that ran with
    one."""
    given = registry_view(validators)
    tables, source, label = other_tables(store, other)
    tables, refused = rechecked(tables, given, run_sync)
    return {"source": source, **store.merge_tables(tables, label), "not_admitted": refused}


def rechecked(tables: dict[str, Any], validators: Mapping[str, Any], run: Callable[..., Any],
              ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The other ledger's tables with only what follows from its receipts admitted: an accepted
    attempt whose return fails the recheck, or whose stored value does not follow from it, becomes
    rejected without values; an orphan value is dropped. Each is named in the list returned."""
    revisions = {r["id"]: r for r in tables["revisions"]}
    names = {b["id"]: b["name"] for b in tables["batches"]}
    tasks = {(q["revision_id"], q["key"]): q["tasks"] for q in tables["requests"]}
    stored: dict[int, list[Any]] = {}
    for row in tables["checkpoint"]:
        stored.setdefault(row["attempt_id"], []).append(row)
    refused: dict[int, str] = {}
    named = []
    for attempt in tables["attempts"]:
        if attempt["status"] != "accepted":
            continue
        revision = revisions[attempt["revision_id"]]
        record = receipt_of({**dict(attempt), "batch": names[attempt["batch_id"]],
                             "revision": revision["number"], "current": False,
                             "components": revision["components"],
                             "validator_name": revision["validator_name"],
                             "tasks": tasks.get((attempt["revision_id"],
                                                 attempt["request_key"]))}, 0)
        why = _not_following(record, stored.get(attempt["id"], []), validators, run)
        if why:
            refused[attempt["id"]] = why
            named.append({"batch": record["batch"], "uid": attempt["uid"], "reason": why})
    accepted = {a["id"] for a in tables["attempts"] if a["status"] == "accepted"}
    for row in tables["checkpoint"]:
        if row["attempt_id"] not in accepted:
            named.append({"batch": names.get(row["batch_id"]), "uid": None, "reason":
                          f"a value stored for task {row['task_id']!r} without an accepted "
                          "attempt of its own"})
    attempts = [a if a["id"] not in refused else {**dict(a), "status": "rejected", "errors":
                json.dumps([{"type": "merge_recheck", "task_id": None,
                             "message": refused[a["id"]]}])} for a in tables["attempts"]]
    kept = [c for c in tables["checkpoint"] if c["attempt_id"] in accepted - set(refused)]
    return {**tables, "attempts": attempts, "checkpoint": kept}, named


def _not_following(record: dict[str, Any], rows: list[Any], validators: Mapping[str, Any],
                   run: Callable[..., Any]) -> str:
    """Why an accepted attempt's stored values are not admitted ("" when they are): its raw return
    fails the recheck, or a value differs from the one the return gives (a field the return lacks
    may only be a compared field equal to the task's)."""
    derived, asked, why = recheck_receipt(record, validators, run)
    if derived is None:
        return why
    by_id = {t["task_id"]: t for t in asked}
    for row in rows:
        value, task_id = json.loads(row["item"]), row["task_id"]
        if task_id not in derived:
            return f"a value is stored for task {task_id!r}, which its request did not ask"
        if not _follows(value, derived[task_id], by_id[task_id]):
            return (f"the value stored for task {task_id!r} is not what its raw return gives "
                    f"(stored {row['item'][:80]}, returned {_json(derived[task_id])[:80]})")
    return ""


def _follows(value: Any, derived: Any, task: Mapping[str, Any]) -> bool:
    if not isinstance(value, dict) or not isinstance(derived, dict):
        return _json(value) == _json(derived)
    return all(k in value and _json(value[k]) == _json(v) for k, v in derived.items()) and all(
        k in task and _json(v) == _json(task[k]) for k, v in value.items() if k not in derived)
