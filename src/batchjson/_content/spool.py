"""Where a run's tasks come from: a list, any iterable (a generator), or a JSON Lines file.

Every form is read once, task by task, so a generator or a file of a million tasks is never
first copied whole into a list of its own: the run's checks see each task as it streams past.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .._errors import InvalidBatch

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_task_file(tasks: Any) -> bool:
    """A path to a JSON Lines file of tasks: a ``Path`` (any name), or a str ending ``.jsonl``."""
    return isinstance(tasks, os.PathLike) or (
        isinstance(tasks, str) and tasks.endswith(JSONL_SUFFIXES) and "\n" not in tasks)


def stream_tasks(tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
                 hasher: Any = None) -> Iterator[Any]:
    """Each task in order, from a list, an iterable or a JSON Lines file (one object a line;
    blank lines skipped), without holding the whole. A file's tasks are already JSON, read
    exactly as written (a line that is not JSON is refused by its number); ``hasher`` (a
    hashlib object) is fed the very bytes read, so their digest names what was checked."""
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
    """The SHA-256 of a tasks file's bytes (what :func:`stream_tasks` feeds its hasher), or
    None when it cannot be read (the run's own read then says why)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as data:
            while block := data.read(1 << 20):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


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
