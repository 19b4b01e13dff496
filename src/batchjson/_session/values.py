"""A result's accepted values, read from the ledger when asked for.

A million values as Python objects would need gigabytes, and the ledger has them already. A result
outlives its session (it opens the ledger again); an in-memory ledger's are copied."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._errors import LedgerError
from .._ledger.ledger import Ledger
from .._ledger.store import Store

PAGE_REQUESTS = 200  # leaf requests per page read while iterating


class LedgerValues(Mapping[str, Any]):
    """task_id -> accepted value of one revision, each loaded from the ledger when read. ``hidden``
    task ids (stored values that no longer load; the result's errors name them) read as absent."""

    def __init__(self, store: Store, revision_id: int, load: Callable[[Any], Any],
                 hidden: frozenset[str] = frozenset()) -> None:
        self._store, self._revision, self._load = store, revision_id, load
        self._hidden = hidden
        self._count: int | None = None
        self._where: dict[str, str] | None = None  # task_id -> request key, read on first use
        self._accepted: set[str] | None = None  # request keys with values, read on first use

    def __len__(self) -> int:
        if self._count is None:
            self._count = (self._read("value_count", revision_id=self._revision)
                           - len(self._hidden))
        return self._count

    def __iter__(self) -> Iterator[str]:
        for task_id, _ in self.stored_items():
            yield task_id

    def __getitem__(self, task_id: str) -> Any:
        text = self._text(task_id)
        if text is None:
            raise KeyError(task_id)
        return self._load(json.loads(text))

    def __contains__(self, task_id: object) -> bool:
        """Read without a query per task (a result's errors ask it of every failed task)."""
        if not isinstance(task_id, str) or task_id in self._hidden:
            return False
        key = self._where_of().get(task_id)  # reads the accepted keys too
        return key in (self._accepted or ())

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        """(task_id, value) in task order, a page of requests at a time."""
        for task_id, text in self.stored_items():
            yield task_id, self._load(json.loads(text))

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        for _, value in self.items():
            yield value

    def stored_items(self) -> Iterator[tuple[str, str]]:
        """(task_id, stored JSON text) in task order, without loading the values."""
        after: tuple[int, int] | None = (-1, -1)
        while after is not None:
            rows = self._read("revision_values", self._revision, page=(after, PAGE_REQUESTS))
            requests = list(dict.fromkeys((row[0], row[1]) for row in rows))
            after = requests[-1] if len(requests) == PAGE_REQUESTS else None
            seen: dict[str, str] = {}
            for _, _, task_id, text in rows:  # the latest accepted row wins, as checkpoint
                if task_id is not None:
                    seen[task_id] = text
            for task_id, text in seen.items():
                if task_id not in self._hidden:
                    yield task_id, text

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<values of {len(self)} task(s), read from the ledger; dict(values) copies them>"

    def _read(self, what: str, *args: Any, **named: Any) -> Any:
        """One of the store's reads; once the session closed its ledger, from the same file or
        database opened again."""
        try:
            return getattr(self._store, what)(*args, **named)
        except LedgerError:
            where = _where(self._store)
            if where is None:  # in memory: nothing to open again (its values were copied)
                raise
            self._store = Ledger(where).store
            return getattr(self._store, what)(*args, **named)

    def _where_of(self) -> dict[str, str]:
        if self._where is None:
            where, self._accepted = self._read("revision_lookup", self._revision)
            self._where = {t: key for key, ids in where for t in json.loads(ids)}
        return self._where

    def _text(self, task_id: str) -> str | None:
        if task_id in self._hidden:
            return None
        key = self._where_of().get(task_id)
        if key is None:
            return None
        return self._read("revision_values", self._revision, task=(key, task_id))[-1][3]


def _where(store: Store) -> Any:
    """The file or URL a store opens again; None in memory."""
    return getattr(store, "url", None) or getattr(store, "path", None)


def result_values(store: Store, revision_id: int,
                  schema: Any) -> tuple[Mapping[str, Any], list[dict[str, Any]]]:
    """A revision's values as a :class:`LedgerValues` (a dict for an in-memory ledger), and a
    ``stored_invalid`` error for each stored value the schema no longer loads. Only a pydantic
    model's load can fail (even on what it dumped itself), so only then is every value read once
    here: a value that does not load is its task's error, never an exception on reading
    ``values``."""
    values, unloadable = _ledger_values(store, revision_id, schema)
    return (values if _where(store) is not None else dict(values.items())), unloadable


def _ledger_values(store: Store, revision_id: int,
                   schema: Any) -> tuple[LedgerValues, list[dict[str, Any]]]:
    values = LedgerValues(store, revision_id, schema.load)
    if schema.model is None:
        return values, []
    unloadable = []
    for task_id, text in values.stored_items():
        try:
            schema.load(json.loads(text))
        except Exception as exc:  # noqa: BLE001 - a stored value the schema no longer accepts
            unloadable.append({
                "type": "stored_invalid", "task_id": task_id,
                "message": f"the stored answer no longer loads under the schema "
                           f"({type(exc).__name__}: {str(exc)[:300]}); change the schema "
                           "back, or re-run under a schema it satisfies"})
    if not unloadable:
        return values, []
    hidden = frozenset(e["task_id"] for e in unloadable)
    return LedgerValues(store, revision_id, schema.load, hidden), unloadable


def plain_items(values: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(task_id, value as plain JSON data) in task order: a ledger's values as stored, without
    building model instances; a dict's values with models dumped to JSON data."""
    if isinstance(values, LedgerValues):
        for task_id, text in values.stored_items():
            yield task_id, json.loads(text)
        return
    for task_id, value in values.items():
        dump = getattr(value, "model_dump", None)
        yield task_id, dump(mode="json") if callable(dump) else value
