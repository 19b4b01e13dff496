"""A run's requests :data:`WINDOW` at a time, so its memory does not grow with its tasks:
:func:`survey` once before anything is recorded or spent, then :class:`Pending` for the calls."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain

from .._content.tasks import Request, stored_request
from .._ledger.store import Store
from .plan import RunPlan
from .rejudge import Judging, earlier_candidates

WINDOW = 1000  # requests looked at together: keyed, read from the ledger, queued to send


def windows(store: Store, plan: RunPlan) -> Iterator[list[Request]]:
    if plan.existing is not None:
        for rows in store.leaf_pages(plan.existing.id, WINDOW):
            yield [stored_request(row) for row in rows]
        return
    tasks = plan.content.tasks
    for start in range(0, len(tasks.texts), WINDOW):
        yield plan.keys.window(tasks, start, start + WINDOW)


def every_request(store: Store, plan: RunPlan) -> Iterator[Request]:
    return chain.from_iterable(windows(store, plan))


def survey(store: Store, plan: RunPlan, judging: Judging) -> RunPlan:
    """Each request, before anything is spent: accepted already, re-judged now, or pending."""
    keys, sourceless = plan.keys, store.has_sourceless_answers()
    marks, sizes = bytearray(), array("L")
    rechecked, broken, owed, sourceless_all = [], [], [], {}
    apart = keys.apart if plan.spec.accept == "items" else None  # valid items kept, rest owed
    pending_tasks, largest, longest = 0, None, {}
    for window in windows(store, plan):
        done = store.accepted_keys([r.key for r in window])
        unanswered = [r for r in window if r.key not in done]
        sourceless_of = ({r.key: keys.sourceless(r.tasks_json) for r in unanswered}
                         if unanswered and sourceless else {})
        if sourceless_of:  # imports of unknown source are cleared once answered: kept
            sourceless_all.update(sourceless_of)
            owed += unanswered
        passing = [] if broken else judging.first_passing(earlier_candidates(
            store, unanswered, seen_of={r.key: keys.seen_key(r.tasks_json) for r in unanswered},
            sourceless_of=sourceless_of, same_key=bool(plan.blind)), broken, apart)
        passed = {request.key for request, _, _ in passing}  # (one in part: its rest is owed)
        rechecked += passing
        pending = [r.key not in done and r.key not in passed for r in window]
        marks += bytes(pending)
        sizes.append(len(window))
        for request, due in zip(window, pending, strict=True):
            if due:
                count = len(request.tasks)
                pending_tasks += count
                if largest is None or count > len(largest.tasks):
                    largest = request
                longest[count] = max(len(request.tasks_json), longest.get(count, 0))
    return replace(plan, requests=sum(sizes), pending_tasks=pending_tasks, largest=largest,
                   longest=longest,
                   pending=Pending(lambda: windows(store, plan), marks, sizes, sum(marks), store),
                   rechecked=tuple(rechecked), broken=tuple(broken), owed=tuple(owed),
                   sourceless_of=sourceless_all)


def seen_pairs(store: Store, plan: RunPlan) -> Iterator[tuple[str, str]]:
    """(request key, what its model saw) of every request, from the requests' texts alone."""
    keys = plan.keys
    if plan.existing is not None:
        yield from stored_seen_pairs(store, plan, plan.existing.id)
        return
    for text in plan.content.tasks.texts:
        yield keys.request(text), keys.seen_key(text)


def stored_seen_pairs(store: Store, plan: RunPlan, revision_id: int, *,
                      halves: bool = False) -> Iterator[tuple[str, str]]:
    """:func:`seen_pairs` of a revision on record (``halves``: only those a split made)."""
    for rows in store.leaf_pages(revision_id, WINDOW):
        yield from ((row["key"], plan.keys.seen_key(row["tasks"])) for row in rows
                    if row["parent_key"] or not halves)


class Pending:
    """The requests to call, re-read a window at a time (one another runner split: taken as is)."""

    def __init__(self, source: Callable[[], Iterator[list[Request]]], marks: bytearray,
                 sizes: array, count: int, store: Store) -> None:
        self._source, self._marks, self._sizes = source, marks, sizes
        self._count, self._store = count, store

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Request]:
        return chain.from_iterable(self.windows())

    def windows(self) -> Iterator[list[Request]]:
        start = 0
        for n, window in enumerate(self._source()):
            if n < len(self._sizes) and len(window) == self._sizes[n]:
                marks = self._marks[start:start + len(window)]
                start += self._sizes[n]
                chosen = [r for r, mark in zip(window, marks, strict=True) if mark]
            else:
                start += self._sizes[n] if n < len(self._sizes) else 0
                done = self._store.accepted_keys([r.key for r in window])
                chosen = [r for r in window if r.key not in done]
            if chosen:
                yield chosen
