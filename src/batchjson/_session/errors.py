"""A result's errors, built when read: a run that fails a million tasks must not hand back a million
error dicts. :func:`failure_groups` keeps the first few groups and counts the rest."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, overload

from .._content.packed import SequenceView

SHOWN = 20  # errors a repr shows


class ResultErrors(SequenceView):
    """Every task's errors, each a fresh dict when read, in this order: failed tasks as they failed,
    tasks a batch job still holds, stored values that no longer load, tasks never attempted.
    ``task_ids`` (every task in order) is read only if some task was never attempted."""

    def __init__(self, failed: Mapping[str, list[dict[str, Any]]], accepted: Any,
                 extra: list[dict[str, Any]], task_ids: Callable[[], Iterable[str]],
                 missing: int, not_attempted: str, pending: Sequence[str] = (),
                 pending_tasks: int = 0) -> None:
        self._failed, self._accepted, self._extra = failed, accepted, extra
        self._task_ids, self._missing, self._why = task_ids, missing, not_attempted
        self._pending, self._pending_tasks = pending, pending_tasks
        self._len: int | None = None
        self._raws: dict[str, str] | None = None
        # failed in the run yet accepted by its end (another runner's answer): read now, so
        # the errors stay those of this run's end when the ledger gains values later
        self._answered = {t for t in failed if t in accepted}
        self._unattempted: int | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for task_id, errs in self._failed_items():
            for e in errs:
                yield {**{k: v for k, v in e.items() if k != "raw"}, "task_id": task_id}
        yield from self._pending_errors()
        yield from (dict(e) for e in self._extra)
        if self._unattempted_count():
            named = {e["task_id"] for e in self._extra}
            named.update(e["task_id"] for e in self._pending_errors())
            for task_id in self._task_ids():
                if (task_id not in self._failed and task_id not in named
                        and task_id not in self._accepted):
                    yield {"type": "not_attempted", "task_id": task_id, "message": self._why}

    def _pending_errors(self) -> Iterator[dict[str, Any]]:
        """The tasks of requests a batch job held when the run ended (as they were then)."""
        for text in self._pending:
            held = json.loads(text)
            for task_id in held["task_ids"]:
                yield {"type": "pending", "task_id": task_id, "request": held["request"],
                       "message": f"submitted in {held['where']}; re-run to collect what has "
                       "ended"}

    def _failed_items(self) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        answered = self._answered
        return ((t, errs) for t, errs in self._failed.items() if t not in answered)

    def _unattempted_count(self) -> int:
        if self._unattempted is None:
            failed = sum(1 for _ in self._failed_items())
            self._unattempted = max(0, self._missing - failed - self._pending_tasks
                                    - len({e["task_id"] for e in self._extra}))
        return self._unattempted

    def __len__(self) -> int:
        if self._len is None:
            self._len = (sum(len(errs) for _, errs in self._failed_items()) + len(self._extra)
                         + self._pending_tasks + self._unattempted_count())
        return self._len

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            if (index.step or 1) > 0 and (index.start or 0) >= 0 and (
                    index.stop is None or index.stop >= 0):
                return list(islice(self, index.start, index.stop, index.step))
            return list(self)[index]
        if index < 0:
            index += len(self)
        found = next(islice(self, index, None), None) if index >= 0 else None
        if found is None:
            raise IndexError("error index out of range")
        return found

    def __repr__(self) -> str:
        """As a list, up to the first :data:`SHOWN`; beyond, those and a count of the rest."""
        first = list(islice(self, SHOWN + 1))
        if len(first) <= SHOWN:
            return repr(first)
        return (repr(first[:SHOWN])[:-1] + f", ... and {len(self) - SHOWN} more; "
                "list(errors) copies them]")

    @property
    def raws(self) -> dict[str, str]:
        """Each failed request's raw return, once (the errors themselves leave it out)."""
        if self._raws is None:
            self._raws = {}
            for _, errs in self._failed_items():
                for e in errs:
                    if e.get("raw") is not None:
                        self._raws.setdefault(request_of(e), e["raw"])
        return self._raws


def failure_groups(errors: Callable[[], Iterable[Mapping[str, Any]]],
                   raws: Mapping[str, str], limit: int | None = None,
                   keep: Callable[[Mapping[str, Any]], bool] | None = None
                   ) -> tuple[list[dict[str, Any]], int]:
    """The first ``limit`` failed requests (all with None) of ``errors()``, each with its tasks, its
    own errors once, its bystanders counted and its raw return; and how many failed in all, counted
    without building the rest. ``errors`` is read twice. ``keep`` drops a request all of whose
    errors it refuses."""
    kept: dict[str, bool] = {}  # request -> has an error ``keep`` admits (one bool a request)
    for e in errors():
        key = request_of(e)
        kept[key] = kept.get(key, False) or keep is None or keep(e)
    shown = [key for key, admitted in kept.items() if admitted]
    total, shown = len(shown), set(shown[:limit] if limit is not None else shown)
    groups: dict[str, dict[str, Any]] = {}
    for e in errors():
        key = request_of(e)
        if key in shown:
            group = groups.get(key)
            if group is None:
                group = groups[key] = {"request": e.get("request"), "tasks": [], "errors": [],
                                       "bystanders": 0, "raw": raws.get(key)}
            _add(group, e)
    return list(groups.values()), total


def _add(group: dict[str, Any], e: Mapping[str, Any]) -> None:
    """One error into its request's group: tasks once (a task's errors come together),
    bystanders counted, each message once."""
    task_id = e.get("task_id")
    if task_id is not None and (not group["tasks"] or group["tasks"][-1] != task_id):
        group["tasks"].append(task_id)
    if e.get("type") == "batch_rejected":
        group["bystanders"] += 1
        return
    what = (e.get("type"), e.get("message"))
    if all((x.get("type"), x.get("message")) != what for x in group["errors"]):
        group["errors"].append({k: v for k, v in e.items() if k != "request"})


def request_of(error: Mapping[str, Any]) -> str:
    """The failed request an error belongs to (the replay loop tags it), else its message."""
    if error.get("request"):
        return str(error["request"])
    if error.get("type") == "not_attempted":
        return "not_attempted"
    return f"{error.get('type')}:{error.get('task_id')}:{error.get('message')}"
