"""Checked tasks held once, as their requests' canonical JSON texts (a dict beside each would take
several times as much): sequences equal to the tasks they stand for, decoded a request at a time
when read and never kept."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any


class SequenceView(Sequence[Any]):
    """A read-only sequence built when read, equal to the list (or tuple) it stands for."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class RequestTasks(SequenceView):
    """One request's tasks, decoded from its ``tasks_json`` on each read."""

    __slots__ = ("_json", "_count")

    def __init__(self, tasks_json: str, count: int) -> None:
        self._json, self._count = tasks_json, count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(json.loads(self._json))

    def __getitem__(self, index: Any) -> Any:
        found = json.loads(self._json)[index]
        return tuple(found) if isinstance(index, slice) else found

    def __repr__(self) -> str:
        return repr(tuple(self))


class PackedTasks(SequenceView):
    """Every task of a run, from its requests' texts (``pack`` tasks each, the last fewer)."""

    def __init__(self, texts: Sequence[str], pack: int, count: int) -> None:
        self.texts, self.pack, self._count = texts, pack, count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for text in self.texts:
            yield from json.loads(text)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                return list(self)[index]
            return list(islice(self._from(start), max(0, stop - start)))
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("task index out of range")
        return json.loads(self.texts[index // self.pack])[index % self.pack]

    def _from(self, start: int) -> Iterator[dict[str, Any]]:
        for n, text in enumerate(islice(self.texts, start // self.pack, None)):
            tasks = json.loads(text)
            yield from (tasks[start % self.pack:] if n == 0 else tasks)

    def request(self, position: int, text: str | None = None) -> RequestTasks:
        """The tasks of request ``position`` (its text, ``text``, when already read)."""
        count = min(self.pack, self._count - position * self.pack)
        return RequestTasks(self.texts[position] if text is None else text, count)
