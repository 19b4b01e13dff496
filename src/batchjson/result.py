"""What a run hands back: values that passed acceptance, and an honest account of the rest."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchResult:
    """``values`` holds only committed answers; ``errors`` says why the rest are not there."""

    name: str
    status: str
    values: dict[str, Any]
    errors: list[dict[str, Any]]
    calls: int
    tokens: int
    cost: float | None
    revision: int
    total_tasks: int
    accepted_returns: int = 0
    rejected_returns: int = 0
    provider_errors: int = 0
    resumed: int = 0
    superseded: str | None = None
    attempts_by_task: dict[str, int] = field(default_factory=dict)
    repairs_made: int = 0
    notes: list[str] = field(default_factory=list)
    rechecked: int = 0  # requests resolved by re-judging earlier returns (no calls)
    identity_compared: tuple[str, ...] = ()  # fields an item echoing them is held to
    provider: str | None = None  # provider name / model the run asked

    @property
    def resolved(self) -> bool:
        return self.status == "resolved"

    @property
    def unresolved(self) -> list[str]:
        """task_ids with no committed answer."""
        seen = []
        for e in self.errors:
            task_id = e.get("task_id")
            if task_id and task_id not in seen and task_id not in self.values:
                seen.append(task_id)
        return seen

    def summary(self) -> dict[str, Any]:
        return {
            "batch": self.name, "revision": self.revision, "status": self.status,
            "accepted": len(self.values), "tasks": self.total_tasks,
            "accepted_returns": self.accepted_returns, "rejected_returns": self.rejected_returns,
            "provider_errors": self.provider_errors, "calls": self.calls, "tokens": self.tokens,
            "cost": self.cost, "unresolved": self.total_tasks - len(self.values),
            "resumed": self.resumed, "rechecked": self.rechecked,
            "identity_compared": list(self.identity_compared), "provider": self.provider,
        }

    def failure_report(self, limit: int = 10) -> str:
        """A short account: which tasks failed, why, what was spent, and how to resume."""
        missing = self.total_tasks - len(self.values)
        lines = [f"batch {self.name!r} (revision {self.revision}) is unresolved: {missing} of "
                 f"{self.total_tasks} task(s) have no accepted answer after {self.calls} call(s), "
                 f"{self.tokens} tokens, cost {money(self.cost)}."]
        by_task: dict[str, dict[str, Any]] = {}
        for e in self.errors:
            by_task[e.get("task_id") or "<request>"] = e
        own = {t: e for t, e in by_task.items() if e.get("type") != "batch_rejected"}
        for task_id, e in list(own.items())[:limit]:
            lines.append(f"  {task_id}: {e.get('type')}: {e.get('message')}")
        if len(own) > limit:
            lines.append(f"  ... and {len(own) - limit} more task(s) with errors of their own")
        bystanders = len(by_task) - len(own)
        if bystanders:
            lines.append(f"  {bystanders} other task(s) were fine but shared a rejected return "
                         "(a return is accepted whole or not at all)")
        if any(e.get("type") == "validator_error" for e in self.errors):
            lines.append("A validator raised something other than ValueError: fix the validator "
                         "(those errors are never retried).")
        lines.append("Accepted answers are committed; re-running the same batch resumes and "
                     "spends calls only on the unresolved requests.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        s = self.summary()
        return (f"<BatchResult {self.name!r} rev {self.revision}: {self.status}, "
                f"{s['accepted']}/{s['tasks']} accepted, {s['rejected_returns']} rejected "
                f"return(s), {self.calls} call(s), {self.tokens} tokens, cost "
                f"{money(self.cost)}, {s['unresolved']} unresolved"
                f"{f', {self.resumed} request(s) resumed' if self.resumed else ''}>")

    def _repr_html_(self) -> str:
        s = self.summary()
        colour = "#1a7f37" if self.resolved else "#cf222e"
        cells = "".join(
            f"<td style='padding:2px 10px'><b>{html.escape(str(v))}</b><br>"
            f"<span style='color:#666'>{html.escape(k)}</span></td>"
            for k, v in (("accepted", f"{s['accepted']}/{s['tasks']}"),
                         ("rejected returns", s["rejected_returns"]),
                         ("provider errors", s["provider_errors"]), ("calls", self.calls),
                         ("tokens", self.tokens), ("cost", money(self.cost)),
                         ("unresolved", s["unresolved"]), ("resumed requests", self.resumed)))
        compared = (f"<div style='color:#666'>identity compared: "
                    f"{html.escape(', '.join(self.identity_compared))}</div>"
                    if self.identity_compared else "")
        if self.rechecked:
            compared += (f"<div style='color:#666'>{self.rechecked} request(s) resolved by "
                         "re-judging earlier returns, without a call</div>")
        return (f"<div><span style='color:{colour}'>&#9679;</span> batch "
                f"<code>{html.escape(self.name)}</code> revision {self.revision}: "
                f"<b>{self.status}</b><table><tr>{cells}</tr></table>{compared}</div>")


def money(cost: float | None) -> str:
    """Dollars, with enough digits that a cheap model's spend does not read as zero."""
    if cost is None:
        return "unknown"
    return f"${cost:.6f}" if 0 < abs(cost) < 0.01 else f"${cost:.4f}"
