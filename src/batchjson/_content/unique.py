"""The duplicate task id check of a million tasks without a set of a million strings.

A pass over the tasks keeps each id as its 8-byte hash, in one of 256 arrays by its low byte;
once the pass ends (or a task is refused), each array is sorted on its own (a small list at a
time, never one of a million) and any hash that repeats is looked up again, in task order,
among the tasks themselves (the spool holds them): only an id that truly repeats is refused,
named with its first and second positions, exactly as a set would have found it.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from .._errors import InvalidBatch


class TaskIds:
    """The ids a pass has seen, in order, as hashes (8 bytes each)."""

    def __init__(self) -> None:
        self._buckets = [array("q") for _ in range(256)]

    def add(self, task_id: str) -> None:
        hashed = hash(task_id)
        self._buckets[hashed & 255].append(hashed)

    def refuse_repeats(self, tasks: Iterable[Mapping[str, Any]]) -> None:
        """Raise InvalidBatch for the first id that occurs twice among ``tasks`` (every task
        added so far, in order); nothing when none does."""
        repeated: set[int] = set()
        for bucket in self._buckets:
            ordered = sorted(bucket)
            repeated.update(a for a, b in zip(ordered, islice(ordered, 1, None), strict=False)
                            if a == b)
        if not repeated:
            return
        first: dict[str, int] = {}
        for position, task in enumerate(tasks):
            task_id = task.get("task_id") if isinstance(task, Mapping) else None
            if not isinstance(task_id, str) or hash(task_id) not in repeated:
                continue
            if task_id in first:
                raise InvalidBatch(f"duplicate task_id {task_id!r} (tasks #{first[task_id]} and "
                                   f"#{position}); task_ids must be unique within a batch")
            first[task_id] = position
