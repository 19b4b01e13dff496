"""What a run hands back: values that passed acceptance, and an honest account of the rest."""

from __future__ import annotations

import html
import io
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._errors import ConfigError
from .._money import money
from .errors import ResultErrors, failure_groups
from .values import plain_items


class TaskAttempts(Mapping[str, int]):
    """task_id -> calls this run made that carried the task, read on first use from the run's log of
    its calls (on disk past a few megabytes, so a million tasks hold no count each)."""

    def __init__(self, calls_log: Iterable[str]) -> None:
        self._log = calls_log
        self._by_task: dict[str, int] | None = None

    def _tasks(self) -> dict[str, int]:
        if self._by_task is None:
            self._by_task = {}
            for line in self._log:
                for task_id in json.loads(line):
                    self._by_task[task_id] = self._by_task.get(task_id, 0) + 1
        return self._by_task

    def __getitem__(self, task_id: str) -> int:
        return self._tasks()[task_id]

    def __iter__(self) -> Any:
        return iter(self._tasks())

    def __len__(self) -> int:
        return len(self._tasks())

    def __repr__(self) -> str:
        return repr(self._tasks())

SHOWN = 10  # failed requests a notebook shows; the rest are counted


@dataclass
class BatchResult:
    """``values`` holds only committed answers; ``errors`` says why the rest are not there."""

    name: str
    status: Literal["resolved", "unresolved", "pending"]
    values: Mapping[str, Any]  # read from the ledger on demand; dict(values) copies it
    errors: Sequence[dict[str, Any]]  # built one at a time when read; list(errors) copies it
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
    attempts_by_task: Mapping[str, int] = field(default_factory=dict)  # calls per task
    repairs_made: int = 0
    notes: list[str] = field(default_factory=list)
    rechecked: int = 0  # requests resolved by re-judging earlier returns (no calls)
    identity_compared: tuple[str, ...] = ()  # fields every item must copy from its task
    # under the default identity, other task fields an item is held to only if it echoes them
    compared_if_echoed: tuple[str, ...] = ()
    provider: str | None = None  # provider name / model the run asked
    # batch transport: every job still holding a request of this batch (status "pending")
    jobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def resolved(self) -> bool:
        return self.status == "resolved"

    @property
    def unresolved(self) -> list[str]:
        """task_ids with no committed answer."""
        return list(dict.fromkeys(e["task_id"] for e in self.errors
                                  if e.get("task_id") and e["task_id"] not in self.values))

    def to_jsonl(self, path: str | os.PathLike | None = None) -> str | None:
        """Every accepted value as JSON Lines (``{"task_id": ..., "value": ...}``, in task order),
        streamed from the ledger to ``path``; with no path, the whole text, in memory."""
        if path is None:
            out = io.StringIO()
            self._write_jsonl(out)
            return out.getvalue()
        with open(path, "w", encoding="utf-8") as out:
            self._write_jsonl(out)
        return None

    def _write_jsonl(self, out: Any) -> None:
        for task_id, value in plain_items(self.values):
            out.write(json.dumps({"task_id": task_id, "value": value}, ensure_ascii=False))
            out.write("\n")

    def to_pandas(self) -> Any:
        """A pandas DataFrame of the accepted values: a ``task_id`` column, then one column per
        field of an object value (a ``value`` column for any other value). Needs pandas."""
        try:
            import pandas
        except ImportError:
            raise ConfigError("to_pandas() needs pandas: pip install pandas (or write the "
                              "values with to_jsonl(path))") from None
        rows = ({"task_id": task_id, **(v if isinstance(v, dict) else {"value": v})}
                for task_id, v in plain_items(self.values))
        return pandas.DataFrame.from_records(rows)

    def summary(self) -> dict[str, Any]:
        return {
            "batch": self.name, "revision": self.revision, "status": self.status,
            "accepted": len(self.values), "tasks": self.total_tasks,
            "accepted_returns": self.accepted_returns, "rejected_returns": self.rejected_returns,
            "provider_errors": self.provider_errors, "calls": self.calls, "tokens": self.tokens,
            "cost": self.cost, "unresolved": self.total_tasks - len(self.values),
            "resumed": self.resumed, "rechecked": self.rechecked,
            "identity_compared": list(self.identity_compared),
            "compared_if_echoed": list(self.compared_if_echoed), "provider": self.provider,
            "jobs": list(self.jobs),
        }

    @property
    def raws(self) -> dict[str, str]:
        """Each failed request's raw return, kept once (not on every task's error)."""
        return getattr(self.errors, "raws", {})

    @property
    def failures(self) -> list[dict[str, Any]]:
        """One entry per failed request: its tasks, its own errors once, how many bystanders shared
        the rejection, and the raw return once; ``failure_report`` shows the first few."""
        return failure_groups(self._failed_errors, self.raws)[0]

    def _failed_errors(self) -> Any:
        """The errors of tasks still without a value (a run's own errors are only those)."""
        if isinstance(self.errors, ResultErrors):
            return iter(self.errors)
        return (e for e in self.errors if e.get("task_id") not in self.values)

    def failure_report(self, limit: int = 10) -> str:
        """A short account: which requests failed, why, what was spent, and how to resume."""
        missing = self.total_tasks - len(self.values)
        lines = [f"batch {self.name!r} (revision {self.revision}) is unresolved: {missing} of "
                 f"{self.total_tasks} task(s) have no accepted answer after {self.calls} call(s), "
                 f"{self.tokens} tokens, cost {money(self.cost)}."]
        failures, count = failure_groups(self._failed_errors, self.raws, limit)
        for f in failures:
            tasks = f["tasks"]
            what = (tasks[0] if len(tasks) == 1 else
                    f"{len(tasks)} tasks ({tasks[0]} .. {tasks[-1]})")
            lines.append(f"  request of {what}:")
            for e in f["errors"][:3]:
                lines.append(f"    {e.get('type')}: {e.get('message')}")
                lines += [f"      {line}" for line in tracebacks(e)]
            if len(f["errors"]) > 3:
                lines.append(f"    ... and {len(f['errors']) - 3} more error(s)")
            if f["bystanders"]:
                lines.append(f"    {f['bystanders']} other task(s) of this request were fine but "
                             "shared the rejected return (a return is accepted whole or not at "
                             "all)")
        if count > limit:
            lines.append(f"  ... and {count - limit} more failed request(s)")
        if any(e.get("type") == "validator_error" for e in self.errors):
            lines.append("A validator raised something other than ValueError or AssertionError: "
                         "fix the validator (those errors are never retried).")
        lines.append("Accepted answers are committed; re-running the same batch resumes and "
                     "spends calls only on the unresolved requests.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        s = self.summary()
        return (f"<BatchResult {self.name!r} rev {self.revision}: {self.status}, "
                f"{s['accepted']}/{s['tasks']} accepted, {s['rejected_returns']} rejected "
                f"return(s), {self.calls} call(s), {self.tokens} tokens, cost "
                f"{money(self.cost)}, {s['unresolved']} unresolved"
                f"{f', {self.resumed} request(s) resumed' if self.resumed else ''}"
                f"{f', {self.rechecked} re-judged without a call' if self.rechecked else ''}"
                + (f", identity compared: {self._compared()}" if self.identity_compared
                   else "") + ">")

    def _compared(self) -> str:
        """"task_id (and case_id if echoed)": the fields every item copies, then those an item
        is held to only when it returns them."""
        also = (f" (and {', '.join(self.compared_if_echoed)} if echoed)"
                if self.compared_if_echoed else "")
        return ", ".join(self.identity_compared) + also

    def _repr_html_(self) -> str:
        s = self.summary()
        colour = ("#1a7f37" if self.resolved else "#9a6700" if self.status == "pending"
                  else "#cf222e")
        cells = "".join(
            f"<td style='padding:2px 10px'><b>{html.escape(str(v))}</b><br>"
            f"<span style='color:#666'>{html.escape(k)}</span></td>"
            for k, v in (("accepted", f"{s['accepted']}/{s['tasks']}"),
                         ("rejected returns", s["rejected_returns"]),
                         ("provider errors", s["provider_errors"]), ("calls", self.calls),
                         ("tokens", self.tokens), ("cost", money(self.cost)),
                         ("unresolved", s["unresolved"]), ("resumed requests", self.resumed)))
        failed = _jobs_html(self.jobs)
        failures, count = failure_groups(self._failed_errors, self.raws, SHOWN,
                                         keep=lambda e: e.get("type") != "pending")
        if failures:
            rows = []
            for f in failures:
                tasks = f["tasks"]
                what = (tasks[0] if len(tasks) == 1 else
                        f"{len(tasks)} tasks: {tasks[0]} .. {tasks[-1]}")
                first = f["errors"][0] if f["errors"] else {"type": "batch_rejected",
                                                            "message": "rejected with others"}
                more = (f" (+{len(f['errors']) - 1} more)" if len(f["errors"]) > 1 else "")
                frames = "\n".join(tracebacks(first))
                rows.append(f"<li><code>{html.escape(what)}</code>: "
                            f"{html.escape(str(first.get('type')))}: "
                            f"{html.escape(str(first.get('message')))}{html.escape(more)}"
                            + (f"<pre style='margin:2px 0'>{html.escape(frames)}</pre>"
                               if frames else "") + "</li>")
            if count > SHOWN:
                rows.append(f"<li>... and {count - SHOWN} more failed request(s)</li>")
            failed += (f"<div>{count} failed request(s):<ul style='margin:2px 0'>"
                      f"{''.join(rows)}</ul></div>")

        compared = (f"<div style='color:#666'>identity compared: "
                    f"{html.escape(self._compared())}</div>" if self.identity_compared else "")
        if self.rechecked:
            compared += (f"<div style='color:#666'>{self.rechecked} request(s) resolved by "
                         "re-judging earlier returns, without a call</div>")
        return (f"<div><span style='color:{colour}'>&#9679;</span> batch "
                f"<code>{html.escape(self.name)}</code> revision {self.revision}: "
                f"<b>{self.status}</b><table><tr>{cells}</tr></table>{compared}{failed}</div>")


def tracebacks(error: Mapping[str, Any]) -> list[str]:
    """The lines of the validator's own frames an error keeps (a ``validator_error``)."""
    frames = error.get("traceback")
    return frames.split("\n") if isinstance(frames, str) and frames else []


def _jobs_html(jobs: list[dict[str, Any]]) -> str:
    """The batch jobs still holding requests: what they are and how to collect them."""
    if not jobs:
        return ""
    rows = "".join(
        f"<li>job {job['id']} <code>{html.escape(str(job['provider_job_id'] or '-'))}</code> "
        f"({html.escape(str(job['provider']))}): {html.escape(str(job['status']))}"
        f"{' / ' + html.escape(str(job['provider_status'])) if job.get('provider_status') else ''}"
        f", {job['requests']} request(s)</li>" for job in jobs)
    return (f"<div>pending in {len(jobs)} batch job(s); re-run to collect what has ended:"
            f"<ul style='margin:2px 0'>{rows}</ul></div>")
