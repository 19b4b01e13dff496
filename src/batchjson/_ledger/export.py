"""batchjson's own export: every attempt of a ledger as an importable receipt, in call order,
with the components it was keyed by (so an import keeps its revision and its identity rule)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._errors import InvalidBatch
from .store import Store
from .unfinished import _unfinished_jobs

EXPORT_FORMAT = "batchjson/receipt-1"


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


def _export_receipts(store: Store, name: str | None = None) -> list[dict[str, Any]]:
    """Every attempt as an importable receipt (batchjson's own format), in call order. A batch
    with an unfinished batch job is refused (an InvalidBatch): its receipts in flight would be
    imported elsewhere without the job that collects them."""
    problem = _unfinished_jobs([j for j in store.jobs() if name in (None, j["batch"])],
                              "this ledger" if name is None else f"batch {name!r}",
                              "export it")
    if problem:
        raise InvalidBatch(problem)
    out = []
    numbers: dict[str, int] = {}
    for row in store._export_rows(name):
        numbers[row["batch"]] = numbers.get(row["batch"], 0) + 1
        out.append(receipt_of(row, numbers[row["batch"]]))
    return out


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
