"""Where a run's tasks come from (a list, any iterable, a JSON Lines file), each read once, task by
task, never copied whole; and :class:`TextSpool`, texts held in memory or on disk."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import ConfigError, InvalidBatch

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_task_file(tasks: Any) -> bool:
    """A path to a JSON Lines file of tasks: a ``Path`` (any name), or a str ending ``.jsonl``."""
    return isinstance(tasks, os.PathLike) or (
        isinstance(tasks, str) and tasks.endswith(JSONL_SUFFIXES) and "\n" not in tasks)


def stream_tasks(tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
                 hasher: Any = None) -> Iterator[Any]:
    """Each task in order, from a list, an iterable or a JSON Lines file (blank lines skipped),
    never holding the whole; ``hasher`` is fed the very bytes read, naming what was checked."""
    if is_task_file(tasks):
        return _read_jsonl(Path(tasks), hasher)
    if isinstance(tasks, (str, bytes)) or isinstance(tasks, Mapping):
        raise InvalidBatch("tasks must be a list of mappings, one per task, or the path of a "
                           f"JSON Lines file (Path('tasks.jsonl')); got {type(tasks).__name__}")
    try:
        return iter(tasks)
    except TypeError:
        raise InvalidBatch(
            f"tasks must be a list of mappings, got {type(tasks).__name__}") from None


def file_digest(path: str | os.PathLike) -> str | None:
    """The SHA-256 of a tasks file's bytes, or None when it cannot be read (the run says why)."""
    try:
        with open(path, "rb") as data:
            return hashlib.file_digest(data, "sha256").hexdigest()
    except OSError:
        return None


def _read_jsonl(path: Path, hasher: Any) -> Iterator[Any]:
    try:
        lines = path.open("rb")
    except OSError as exc:
        raise InvalidBatch(f"the tasks file {str(path)!r} cannot be read ({exc.strerror or exc}); "
                           "give the path of a JSON Lines file, one task object a line") from None
    names: dict[str, str] = {}
    with lines:
        for number, line in enumerate(lines, 1):
            if hasher is not None:
                hasher.update(line)
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except (ValueError, RecursionError) as exc:  # a UnicodeDecodeError is a ValueError
                raise InvalidBatch(f"line {number} of the tasks file {str(path)!r} is not JSON "
                                   f"({str(exc)[:200]}); write one task object a line, as "
                                   "UTF-8") from None
            if type(task) is dict:  # one str per field name, not one per line
                task = {names.setdefault(k, k): v for k, v in task.items()}
            yield task


SPILL_CHARS = 1 << 22  # texts kept in memory up to this many characters, then on disk
WRITE_BYTES = 1 << 16  # spilled texts written to the file this many bytes at a time


def no_room(what: str, exc: OSError) -> str:
    """What a temporary file that cannot be had or written says, and the fix (TMPDIR)."""
    return (f"no room {what} in a temporary file in {tempfile.gettempdir()} "
            f"({type(exc).__name__}: {exc}): free space there, or set TMPDIR to a directory "
            "on a disk with room")


class TextSpool(Sequence[str]):
    """Texts in order, appended one at a time (a run's request texts, its calls' task ids); past
    :data:`SPILL_CHARS` in an unnamed temporary file, read back by offset with ``os.pread`` (safe
    beside another reader). A full disk is a :class:`ConfigError` naming ``TMPDIR``, unless it is
    ``keep_when_full`` (the log of calls paid for): then its texts stay in memory."""

    def __init__(self, *, keep_when_full: bool = False) -> None:
        self._held: list[str] | None = []
        self._chars = 0
        self._file: Any = None
        self._offsets = array("Q", [0])  # where each text starts; the last: where the file ends
        self._unwritten: list[bytes] = []  # appended, not yet in the file
        self._written = 0  # texts in the file
        self._keep = keep_when_full
        self._full = False  # no room on disk: held in memory from then on

    def append(self, text: str) -> None:
        if self._held is not None:
            self._held.append(text)
            self._chars += len(text)
            if self._chars > SPILL_CHARS and not self._full:
                self._spill()
            return
        data = text.encode("utf-8") + b"\n"
        self._unwritten.append(data)
        self._offsets.append(self._offsets[-1] + len(data))
        if self._offsets[-1] - self._offsets[self._written] >= WRITE_BYTES:
            self.flush()

    def extend(self, texts: Iterable[str]) -> None:
        for text in texts:
            self.append(text)

    def _spill(self) -> None:
        held = self._held or []
        try:
            self._file = tempfile.TemporaryFile(prefix="batchjson-tasks-", buffering=0)
        except OSError as exc:
            return self._no_room(exc)
        self._held = None
        for text in held:
            self.append(text)
        self.flush()

    def flush(self) -> None:
        """Every text appended so far into the file (a spool held in memory has none to)."""
        if self._held is not None or not self._unwritten:
            return
        try:
            view = memoryview(b"".join(self._unwritten))
            while view:  # an unbuffered file may take a part of it at each write
                view = view[self._file.write(view):]
        except OSError as exc:
            return self._no_room(exc)
        self._unwritten = []
        self._written = len(self._offsets) - 1

    def _no_room(self, exc: OSError) -> None:
        if not self._keep:
            raise ConfigError(no_room("to hold the run's tasks", exc) + ", and run again; "
                              "nothing was recorded or spent") from exc
        if self._held is None:  # what the file holds, then what it could not take
            self._held = self._read(0, self._written) + [
                data[:-1].decode("utf-8") for data in self._unwritten]
            self._file.close()
            self._file, self._unwritten = None, []
        self._full = True

    def __deepcopy__(self, memo: dict[int, Any]) -> TextSpool:
        """A spool of its own with the same texts: a deep copy never shares the original's file."""
        copied = TextSpool(keep_when_full=self._keep)
        copied.extend(self)
        copied.flush()
        return copied

    def __len__(self) -> int:
        return len(self._held) if self._held is not None else len(self._offsets) - 1

    def __getitem__(self, index: Any) -> Any:
        self.flush()
        if self._held is not None:
            return self._held[index]
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1:
                return self._read(start, stop) if start < stop else []
            return [self[i] for i in range(start, stop, step)]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("request index out of range")
        return self._read(index, index + 1)[0]

    def __iter__(self) -> Iterator[str]:
        self.flush()
        if self._held is not None:
            yield from list(self._held)  # a list appended to while read: what it held
            return
        count = len(self)
        for start in range(0, count, READ_TEXTS):
            yield from self._read(start, min(count, start + READ_TEXTS))

    def _read(self, start: int, stop: int) -> list[str]:
        first = self._offsets[start]
        data = os.pread(self._file.fileno(), self._offsets[stop] - first, first)
        return data.decode("utf-8").split("\n")[:-1]


READ_TEXTS = 256  # texts read back from disk at once
