"""Evidence: a read-only view over the ledger of what is still owed.

A request is resolved only by an accepted return for exactly its content key, so re-running
identical work resumes it, and nothing but the ledger holds this state."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._ledger.ledger import Ledger
from . import accounts
from .accounts import per_usable_result


@dataclass(frozen=True)
class UnresolvedRequest:
    batch: str
    revision: int
    key: str
    task_ids: tuple[str, ...]


class Evidence:
    """Counts over open (non-superseded) revisions; accepted calls are never counted again."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger, self._store = ledger, ledger.store

    def requests(self, batch: str | None = None) -> list[UnresolvedRequest]:
        return [UnresolvedRequest(r["batch"], r["revision"], r["key"],
                                  tuple(json.loads(r["task_ids"])))
                for r in self._store.unresolved(batch)]

    @property
    def unresolved_batches(self) -> int:
        """Batch revisions with at least one unresolved request."""
        return _counts(self.requests())["unresolved_batches"]

    @property
    def unresolved_items(self) -> int:
        return _counts(self.requests())["unresolved_items"]

    @property
    def minimum_exact_retry_calls(self) -> int:
        """One call per unresolved request key (batches and revisions sharing a key share it)."""
        return _counts(self.requests())["minimum_exact_retry_calls"]

    @property
    def superseded(self) -> list[dict[str, Any]]:
        """Revisions another of their batch superseded, and why, batch by batch."""
        return [{"batch": r.batch, "revision": r.number, "reason": r.supersede_reason,
                 "superseded_by": r.superseded_by}
                for r in sorted(self._ledger.revisions(status="superseded"),
                                key=lambda r: (r.batch_id, r.number))]

    def summary(self, batch: str | None = None) -> dict[str, Any]:
        """Numbers a person asks for: what is owed, what was spent, and cost per usable result."""
        owed = self.requests(batch)
        spend = accounts.spend(self._store, batch)
        usable = self._store.value_count(batch)
        cost = spend["cost"]
        superseded = [s for s in self.superseded if batch is None or s["batch"] == batch]
        # calls of unknown cost count at their floor, by status's own rule (per_usable_result)
        unknown = spend["unknown_cost_calls"]
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
            "calls": spend["calls"],
            "accepted_returns": spend["accepted"],
            "rejected_returns": spend["rejected"],
            "provider_errors": spend["provider_errors"],
            "cancelled_calls": spend["cancelled_calls"],
            "abandoned_calls": spend["abandoned_calls"],
            "in_flight_calls": spend["in_flight_calls"],
            "unknown_cost_calls": unknown,
            "cost_lower_bound_unknown": spend["cost_lower_bound_unknown"],
            "unpriced_unknown_calls": spend["unpriced_unknown_calls"],
            "tokens": spend["input_tokens"] + spend["output_tokens"],
            "cost": cost,
            "cost_lower_bound": spend["cost_lower_bound"],
            "usable_results": usable,
            "cost_per_usable_result": per_usable_result(
                cost, spend["cost_lower_bound_unknown"], unknown, usable),
            "cost_per_usable_result_is_lower_bound": bool(unknown),
        }

    def __repr__(self) -> str:
        counts = _counts(self.requests())
        return (f"Evidence(unresolved_batches={counts['unresolved_batches']}, "
                f"unresolved_items={counts['unresolved_items']}, "
                f"minimum_exact_retry_calls={counts['minimum_exact_retry_calls']}, "
                f"superseded={len(self.superseded)})")


def _counts(owed: list[UnresolvedRequest]) -> dict[str, int]:
    """What is owed, counted once per request key: the key is content, not a batch name, so one
    accepted return resolves that request in every batch and revision that holds it."""
    distinct: dict[str, UnresolvedRequest] = {}
    for u in owed:
        distinct.setdefault(u.key, u)
    return {
        "unresolved_batches": len({(u.batch, u.revision) for u in owed}),
        "unresolved_requests": len(owed),
        "unresolved_items": sum(len(u.task_ids) for u in distinct.values()),
        "minimum_exact_retry_calls": len(distinct),
    }
