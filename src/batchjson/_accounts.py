"""The account: every attempt ever recorded, per batch and in total, priced honestly.

A restart, another run directory or a merged ledger cannot erase an earlier attempt, so the cost
per usable result divides *everything* spent by what was accepted. Calls whose cost is unknown
(killed mid-call, abandoned, a model missing from the price table) are not counted as free: their
prompt is priced at the model's input rate as a lower bound and reported apart.
"""

from __future__ import annotations

import json
from typing import Any

from ._ledger import Ledger
from ._providers.pricing import price_for

STATUSES = ("accepted", "rejected", "provider_error", "abandoned", "cancelled", "in_flight")
COUNTERS = ("calls", "rechecks", "accepted_returns", "rejected_returns", "provider_errors",
            "abandoned", "cancelled", "in_flight", "imported", "input_tokens", "output_tokens",
            "cached_tokens", "unknown_cost_calls", "unpriced_calls", "tasks", "usable_results")

_ATTEMPTS_SQL = (
    "SELECT b.name AS batch, a.status, a.kind, a.input_tokens, a.output_tokens, "
    "a.cached_tokens, a.cost, a.model, a.estimated_input_tokens, a.sent_at, a.cost_floor, "
    "LENGTH(q.tasks) AS tasks_chars FROM attempts a JOIN batches b ON b.id = a.batch_id "
    "LEFT JOIN requests q ON q.revision_id = a.revision_id AND q.key = a.request_key")

_TASKS_SQL = (
    "SELECT b.name AS batch, q.task_ids FROM batches b JOIN requests q "
    "ON q.revision_id = b.current_revision WHERE q.split = 0")

_USABLE_SQL = (
    "SELECT b.name AS batch, COUNT(DISTINCT c.task_id) AS usable FROM batches b "
    "JOIN requests q ON q.revision_id = b.current_revision JOIN checkpoint c "
    "ON c.request_key = q.key WHERE q.split = 0 GROUP BY b.id")


def _empty(batch: str | None) -> dict[str, Any]:
    return {"batch": batch, **{k: 0 for k in COUNTERS}, "cost": 0.0,
            "unknown_cost_lower_bound": 0.0}


def lower_bound(row: Any) -> tuple[float | None, int]:
    """(USD, tokens) an attempt with no recorded cost cost at least: its prompt tokens (as
    reported, else as estimated when sent, else a quarter of its tasks' text, which every prompt
    carries) at the model's input price; USD is None when the model has no price."""
    if row["cost_floor"] is not None:  # priced when the call was made, with its own prices
        return row["cost_floor"], row["estimated_input_tokens"] or 0
    tokens = row["input_tokens"]
    if tokens is None:
        tokens = row["estimated_input_tokens"]
    if tokens is None:
        tokens = (row["tasks_chars"] or 0) // 4
    price = price_for(row["model"])
    if price is None:
        return None, tokens
    cached = min(row["cached_tokens"] or 0, tokens)
    rate = price.input if price.cached_input is None else price.cached_input
    return ((tokens - cached) * price.input + cached * rate) / 1_000_000, tokens


def _finish(entry: dict[str, Any]) -> dict[str, Any]:
    usable = entry["usable_results"]
    entry["cost"] = round(entry["cost"], 12)
    entry["unknown_cost_lower_bound"] = round(entry["unknown_cost_lower_bound"], 12)
    entry["cost_at_least"] = round(entry["cost"] + entry["unknown_cost_lower_bound"], 12)
    entry["tokens"] = entry["input_tokens"] + entry["output_tokens"]
    entry["cost_is_lower_bound"] = entry["unknown_cost_calls"] > 0
    entry["cost_per_usable_result"] = (round(entry["cost_at_least"] / usable, 12) if usable
                                       else None)
    entry["unresolved_tasks"] = max(entry["tasks"] - usable, 0)
    return entry


def cost_summary(ledger: Ledger, name: str | None = None) -> dict[str, Any]:
    """Per batch and in total: calls by outcome, tokens, cost (known, and the lower bound of
    the unknown), usable results and cost per usable result counting every attempt."""
    where, args = (" WHERE b.name = ?", (name,)) if name is not None else ("", ())
    per: dict[str, dict[str, Any]] = {n: _empty(n) for n in ledger.batch_names()
                                      if name is None or n == name}
    for row in ledger._rows(_ATTEMPTS_SQL + where, args):
        entry = per.setdefault(row["batch"], _empty(row["batch"]))
        if row["kind"] == "recheck":  # an earlier return re-judged locally: no call, no cost
            entry["rechecks"] += 1
            continue
        if row["status"] == "cancelled" and row["sent_at"] is None:
            continue  # opened, never sent: not a call (the rule Ledger.spend() counts by too)
        entry["calls"] += 1
        status = row["status"]
        key = {"accepted": "accepted_returns", "rejected": "rejected_returns",
               "provider_error": "provider_errors"}.get(status, status)
        if key in entry:
            entry[key] += 1
        entry["imported"] += row["kind"] == "import"
        for field in ("input_tokens", "output_tokens", "cached_tokens"):
            entry[field] += row[field] or 0
        if row["cost"] is not None:
            entry["cost"] += row["cost"]
            continue
        entry["unknown_cost_calls"] += 1
        usd, _ = lower_bound(row)
        if usd is None:
            entry["unpriced_calls"] += 1
        else:
            entry["unknown_cost_lower_bound"] += usd
    for row in ledger._rows(_TASKS_SQL + (" AND b.name = ?" if name is not None else ""), args):
        if row["batch"] in per:
            per[row["batch"]]["tasks"] += len(json.loads(row["task_ids"]))
    for row in ledger._rows(_USABLE_SQL.replace("GROUP BY", "AND b.name = ? GROUP BY")
                            if name is not None else _USABLE_SQL, args):
        if row["batch"] in per:
            per[row["batch"]]["usable_results"] = row["usable"]
    total = _empty(None)
    for entry in per.values():
        for k in (*COUNTERS, "cost", "unknown_cost_lower_bound"):
            total[k] += entry[k]
    return {"batches": [_finish(e) for e in per.values()], "total": _finish(total)}
