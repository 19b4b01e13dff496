"""The account of every attempt ever recorded, priced honestly (a call of unknown cost counted at
a floor, reported apart), and :class:`Evidence`, what is still owed. What a call is, and what is
known of its cost, is defined once in the store's SQL (``store.IS_CALL``): every account is a view
of :func:`calls`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._ledger.ledger import Ledger
from .._ledger.store import Store
from .._providers.pricing import price_for

_CALL_COUNTS = ("calls", "rechecks", "unsent", "accepted_returns", "partial_returns",
                "rejected_returns", "provider_errors", "abandoned", "cancelled", "in_flight",
                "pending", "imported", "input_tokens", "output_tokens", "cached_tokens",
                "unknown_cost_calls")
COUNTERS = (*(k for k in _CALL_COUNTS if k != "unsent"), "unpriced_calls", "tasks",
            "usable_results")
# Ledger.spend()'s name for each sum of calls() it reports (Evidence.summary() shares them)
_SPENT = {"calls": "calls", "input_tokens": "input_tokens", "output_tokens": "output_tokens",
          "accepted": "accepted_returns", "partial": "partial_returns",
          "rejected": "rejected_returns", "provider_errors": "provider_errors",
          "cancelled_calls": "cancelled", "abandoned_calls": "abandoned",
          "in_flight_calls": "in_flight", "pending_calls": "pending",
          "pending_cost": "pending_cost", "unsent": "unsent",
          "calls_without_cost": "unknown_cost_calls", "unknown_cost_calls": "unknown_cost_calls",
          "cost_lower_bound_unknown": "unknown_cost_lower_bound",
          "unpriced_unknown_calls": "unpriced_calls"}


def _empty(batch: str | None) -> dict[str, Any]:
    return {"batch": batch, **{k: 0 for k in COUNTERS}, "cost": 0.0,
            "unknown_cost_lower_bound": 0.0, "pending_cost": 0.0}


def floor_price(model: str | None, uncached: int, cached: int, *,
                batch: bool = False) -> float | None:
    """USD the prompt tokens cost at least at ``model``'s input price; None when unpriced."""
    price = price_for(model)
    if price is None:
        return None
    rate = price.input if price.cached_input is None else price.cached_input
    share = price.batch if batch else 1.0
    return (uncached * price.input + cached * rate) * share / 1_000_000


def calls(store: Store, name: str | None = None) -> dict[str, dict[str, Any]]:
    """Per batch with attempts: its calls by outcome, tokens, known cost, and the floors."""
    per: dict[str, dict[str, Any]] = {}
    rows, unfloored = store.call_rows(name)
    for row in rows:
        per[row["batch"]] = {**{k: row[k] or 0 for k in _CALL_COUNTS}, "cost": row["cost"],
                             "unknown_cost_lower_bound": row["unknown_cost_lower_bound"],
                             "unpriced_calls": 0, "pending_cost": 0.0}
    for row in unfloored:
        entry = per[row["batch"]]
        usd = floor_price(row["model"], row["uncached"], row["cached"], batch=bool(row["pending"]))
        if row["pending"]:
            entry["pending_cost"] += usd or 0.0
        elif usd is None:
            entry["unpriced_calls"] += row["calls"]
        else:
            entry["unknown_cost_lower_bound"] += usd
    return per


def spend(store: Store, name: str | None = None) -> dict[str, Any]:
    """``Ledger.spend()``: the sum of :func:`calls` over every batch (or one)."""
    entries = list(calls(store, name).values())
    known = [e["cost"] for e in entries if e["cost"] is not None]
    out = {said: sum(e[key] for e in entries) for said, key in _SPENT.items()}
    out["pending_cost"] = float(out["pending_cost"])
    out["cost_lower_bound_unknown"] = float(out["cost_lower_bound_unknown"])
    out["cost"] = sum(known) if known else None
    out["cost_lower_bound"] = (out["cost"] or 0.0) + out["cost_lower_bound_unknown"]
    return out


def _finish(entry: dict[str, Any]) -> dict[str, Any]:
    usable = entry["usable_results"]
    for key in ("cost", "unknown_cost_lower_bound", "pending_cost"):
        entry[key] = round(entry[key], 12)
    entry["cost_at_least"] = round(entry["cost"] + entry["unknown_cost_lower_bound"], 12)
    entry["tokens"] = entry["input_tokens"] + entry["output_tokens"]
    entry["cost_is_lower_bound"] = entry["unknown_cost_calls"] > 0
    per = per_usable_result(entry["cost"], entry["unknown_cost_lower_bound"],
                            entry["unknown_cost_calls"], usable)
    entry["cost_per_usable_result"] = None if per is None else round(per, 12)
    entry["unresolved_tasks"] = max(entry["tasks"] - usable, 0)
    return entry


def per_usable_result(cost: float | None, unknown_lower_bound: float, unknown_calls: int,
                      usable: int) -> float | None:
    """Everything spent over the usable results; None (never $0) when nothing is known."""
    if not usable or (unknown_calls and not (cost or 0.0) + unknown_lower_bound):
        return None
    return ((cost or 0.0) + unknown_lower_bound) / usable


def cost_summary(store: Store, name: str | None = None) -> dict[str, Any]:
    """Per batch and in total: calls by outcome, tokens, cost, usable results and their cost."""
    per: dict[str, dict[str, Any]] = {}
    tasks, usable = store.task_rows(name)
    for row in tasks:  # every batch (or the one named), in the order they were made
        entry = per.setdefault(row["batch"], _empty(row["batch"]))
        if row["task_ids"] is not None:
            entry["tasks"] += len(json.loads(row["task_ids"]))
    for batch, entry in calls(store, name).items():
        target = per.setdefault(batch, _empty(batch))
        target.update({k: entry[k] for k in (*_CALL_COUNTS, "unpriced_calls", "pending_cost",
                                             "unknown_cost_lower_bound") if k in target})
        target["cost"] = entry["cost"] or 0.0
    for row in usable:
        if row["batch"] in per:
            per[row["batch"]]["usable_results"] = row["usable"]
    total = _empty(None)
    for entry in per.values():
        for k in (*COUNTERS, "cost", "unknown_cost_lower_bound", "pending_cost"):
            total[k] += entry[k]
    return {"batches": [_finish(e) for e in per.values()], "total": _finish(total)}


_SUMMARISED = ("calls", "accepted", "partial", "rejected", "provider_errors", "cancelled_calls",
               "abandoned_calls", "in_flight_calls", "pending_calls", "pending_cost",
               "unknown_cost_calls", "cost_lower_bound_unknown", "unpriced_unknown_calls")


@dataclass(frozen=True)
class UnresolvedRequest:
    batch: str
    revision: int
    key: str
    task_ids: tuple[str, ...]


def _owed(key: str, doc: str) -> property:
    """A count of :func:`_counts` over every unresolved request, as a property."""
    return property(lambda evidence: _counts(evidence.requests())[key], doc=doc)


class Evidence:
    """Counts over open (non-superseded) revisions; accepted calls are never counted again."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger, self._store = ledger, ledger.store

    def requests(self, batch: str | None = None) -> list[UnresolvedRequest]:
        return [UnresolvedRequest(r["batch"], r["revision"], r["key"],
                                  tuple(json.loads(r["task_ids"])))
                for r in self._store.unresolved(batch)]

    unresolved_batches = _owed("unresolved_batches",
                               "Batch revisions with at least one unresolved request.")
    unresolved_items = _owed("unresolved_items", "Tasks of the distinct unresolved requests.")
    minimum_exact_retry_calls = _owed("minimum_exact_retry_calls", "One call per unresolved "
                                      "request key (batches and revisions sharing a key share it).")

    @property
    def superseded(self) -> list[dict[str, Any]]:
        """Revisions another of their batch superseded, and why, batch by batch."""
        return [{"batch": r.batch, "revision": r.number, "reason": r.supersede_reason,
                 "superseded_by": r.superseded_by}
                for r in sorted(self._ledger.revisions(status="superseded"),
                                key=lambda r: (r.batch_id, r.number))]

    def summary(self, batch: str | None = None) -> dict[str, Any]:
        """What is owed, what was spent, and cost per usable result."""
        owed = self.requests(batch)
        spent = spend(self._store, batch)
        usable = self._store.value_count(batch)
        cost, unknown = spent["cost"], spent["unknown_cost_calls"]
        superseded = [s for s in self.superseded if batch is None or s["batch"] == batch]
        stops = self._store.attempts_so_far(list(dict.fromkeys(u.key for u in owed)))[1]
        return {
            "batch": batch,
            **_counts(owed),
            # owed requests whose returns the provider said were refused, or cut off at the
            # output limit: neither is asked again as it stands (docs/recovery.md)
            "refused_requests": sum(1 for s in stops.values() if "refused" in s),
            "cut_off_requests": sum(1 for s in stops.values() if "truncated" in s),
            "superseded": superseded,
            "forgotten": self._store.forgotten(batch),
            "owing_batches": sorted({u.batch for u in owed}),  # forgotten ones owe nothing
            # pending: held by unfinished batch jobs, their prompts at the batch price
            **{(_SPENT[k] if k in ("accepted", "partial", "rejected") else k): spent[k]
               for k in _SUMMARISED},
            "tokens": spent["input_tokens"] + spent["output_tokens"],
            "cost": cost,
            "cost_lower_bound": spent["cost_lower_bound"],
            "usable_results": usable,
            "cost_per_usable_result": per_usable_result(
                cost, spent["cost_lower_bound_unknown"], unknown, usable),
            "cost_per_usable_result_is_lower_bound": bool(unknown),
        }

    def __repr__(self) -> str:
        counts = _counts(self.requests())
        del counts["unresolved_requests"]
        said = ", ".join(f"{k}={v}" for k, v in counts.items())
        return f"Evidence({said}, superseded={len(self.superseded)})"


def _counts(owed: list[UnresolvedRequest]) -> dict[str, int]:
    """What is owed, once per request key: one accepted return resolves it in every batch."""
    distinct: dict[str, UnresolvedRequest] = {}
    for u in owed:
        distinct.setdefault(u.key, u)
    return {
        "unresolved_batches": len({(u.batch, u.revision) for u in owed}),
        "unresolved_requests": len(owed),
        "unresolved_items": sum(len(u.task_ids) for u in distinct.values()),
        "minimum_exact_retry_calls": len(distinct),
    }
