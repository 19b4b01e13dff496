"""Tasks: where they come from (a list, any iterable, a JSON Lines file), each read once, task by
task, never copied whole; the requests they are packed into (keyed in ``keys``), and the prompt text
a request is sent as. Checked tasks are held once, as their requests' canonical JSON texts (a dict
beside each would take several times as much) in a :class:`TextSpool`, in memory or on disk,
decoded a request at a time when read and never kept."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain, islice, pairwise
from pathlib import Path
from sys import getrecursionlimit
from typing import Any, NamedTuple

from .._canon import canonical_json as _canonical
from .._canon import read_json
from .._errors import ConfigError, InvalidBatch
from .strictjson import nesting

TASKS_BEGIN = "<<<BATCHJSON_TASKS"
TASKS_END = "BATCHJSON_TASKS>>>"
# How deep a task's JSON may nest (the task is one level): recursive code (json) copies, keys and
# stores it on other threads' stacks; this leaves room under the default recursion limit of 1000.
MAX_TASK_DEPTH = 768


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


CHUNK = 10_000  # tasks decoded back at once: one decode each, and a bounded transient


def normalize_tasks(tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
                    identity: Sequence[str], hasher: Any = None, pack: int | None = None,
                    on_read: Callable[[int], Any] | None = None, note_fields: bool = False,
                    ) -> tuple[Sequence[dict], Sequence[str], tuple[str, ...] | None]:
    """Check every task before anything is spent, naming the first bad one and the fix. ``tasks``:
    a list, any iterable (read once) or a JSON Lines file's path. Returns the tasks in the
    ledger's form, their canonical JSON texts (one per ``pack`` tasks), each task held once, as
    text, and (``note_fields``; else None) every field name in the order the ledger's form first
    shows it; ``hasher`` is fed a file's bytes, ``on_read(1)`` told of each task checked."""
    identity = normalize_identity(identity)
    names: dict[str, None] | None = {} if note_fields else None
    keep = is_task_file(tasks) and not pack  # a file's tasks are JSON already: kept as read
    ids = TaskIds()
    out: list[dict] = []
    texts: Any = TextSpool() if pack else []
    chunk = Chunk([], [], [])
    count = 0
    size = pack * max(1, CHUNK // pack) if pack else CHUNK  # whole requests in each chunk

    def so_far(*more: str) -> Iterator[str]:  # every task's id read, in order
        taken = PackedTasks(texts, pack, count) if pack else out
        return chain((task["task_id"] for task in taken), chunk.ids, more)

    add_text, add_id = chunk.texts.append, chunk.ids.append  # the chunk's lists are kept
    line = [0]  # a tasks file's line last read
    for position, task in enumerate(stream_tasks(tasks, hasher, line)):
        try:
            text, task_id = _task_text(position, task, identity)
        except InvalidBatch as exc:  # a repeated id before it (or its own) is named first
            own = task.get("task_id") if isinstance(task, Mapping) else None
            mine = (str.__str__(own),) if isinstance(own, str) else ()
            ids.update(chain(chunk.ids, mine))
            ids.refuse_repeats(so_far(*mine))
            if line[0]:  # where to find it: a file's blank lines are no tasks
                raise InvalidBatch(f"{exc} (line {line[0]} of the tasks file "
                                   f"{os.fspath(tasks)!r})") from None
            raise
        if names is not None and not names.keys() >= task.keys():  # fields not seen before
            # in its JSON's order, as text (an enum's key too); keys all text: no others sort
            names.update(dict.fromkeys(map(str.__str__, sorted(task))))
        # a caller may refill or change its dict once yielded: the id checked is its id
        add_text(text)
        add_id(task_id)
        if keep:
            chunk.tasks.append(task)
        if on_read is not None:
            on_read(1)
        if len(chunk.ids) == size:
            count += _take(chunk, ids, identity, out, texts, pack)
    count += _take(chunk, ids, identity, out, texts, pack)  # the last, if any
    if pack:
        texts.flush()  # a disk with no room for them is said now, before anything is spent
    ids.refuse_repeats(so_far())
    if not count:
        raise InvalidBatch("empty batch: pass at least one task")
    return ((PackedTasks(texts, pack, count) if pack else out), texts,
            None if names is None else tuple(names))


class Chunk(NamedTuple):
    """Tasks read and checked one at a time, taken into the run's texts together."""

    texts: list[str]  # each task's canonical JSON
    ids: list[str]  # each task's id, as it was checked
    tasks: list[Any]  # each task, when a file's (JSON already) are kept as read


SHORT_HASH = (1 << 48) - 1  # the bits of an id's hash the duplicate check keeps


class TaskIds:
    """The ids a pass has seen, 5 bytes each (10M in about 55 MB): the low 48 bits of an id's
    hash, in 256 pairs of arrays chosen by its low byte (large arrays: no overhead an id). A short
    hash that repeats is looked up again among the ids themselves, so only an id that truly
    repeats is refused, by its first and second positions."""

    def __init__(self) -> None:
        self._low = [array("I") for _ in range(256)]  # bits 8-39 of each hash
        self._high = [array("B") for _ in range(256)]  # bits 40-47
        self._add_low = [bits.append for bits in self._low]
        self._add_high = [bits.append for bits in self._high]

    def update(self, task_ids: Iterable[str]) -> None:
        add_low, add_high = self._add_low, self._add_high
        for hashed in map(hash, task_ids):
            byte = hashed & 255
            add_low[byte](hashed >> 8 & 0xFFFFFFFF)
            add_high[byte](hashed >> 40 & 0xFF)

    def refuse_repeats(self, task_ids: Iterable[str]) -> None:
        """Refuse the first id that occurs twice among ``task_ids`` (every id added, in order)."""
        repeated = set()
        for byte, (low, high) in enumerate(zip(self._low, self._high, strict=True)):
            if len(set(low)) == len(low):  # no two alike even in 32 bits: the common case
                continue
            pairs = zip(low, high, strict=True)
            ordered = sorted(top << 40 | bits << 8 | byte for bits, top in pairs)
            repeated.update(short for short, after in pairwise(ordered) if short == after)
        if not repeated:
            return
        first: dict[str, int] = {}
        for position, task_id in enumerate(task_ids):
            if (hash(task_id) & SHORT_HASH) not in repeated:
                continue
            if task_id in first:
                raise InvalidBatch(f"duplicate task_id {task_id!r} (tasks #{first[task_id]} and "
                                   f"#{position}); task_ids must be unique within a batch")
            first[task_id] = position


def _take(chunk: Chunk, ids: TaskIds, identity: Identity, out: list[dict], texts: Any,
          pack: int | None) -> int:
    """A chunk checked (valid UTF-8, not too deep, explicit identity values scalars) into the
    run's texts, emptied, its count returned: its requests' texts with ``pack``, else its tasks'
    texts and their JSON form (what acceptance compares to). Read back only when it holds a
    list or object to refuse."""
    joined = "[" + ",".join(chunk.texts) + "]"
    brackets = joined.count("[") + joined.count("{")
    _check_encoded(joined, brackets, chunk.texts, chunk.ids)
    ids.update(chunk.ids)
    refuse = brackets > len(chunk.ids) + 1 and not identity.echo  # a list or object inside
    try:
        tasks = chunk.tasks or (read_json(joined) if refuse or not pack else [])
    except RecursionError:  # within the bound, on a caller's stack that is deeper still
        deepest = max(range(len(chunk.texts)), key=lambda i: nesting(chunk.texts[i], 0))
        raise _too_deep(chunk.ids[deepest], "to read back on this stack") from None
    if refuse:
        _refuse_containers(tasks, identity)
    if pack:
        texts.extend("[" + ",".join(chunk.texts[i:i + pack]) + "]"
                     for i in range(0, len(chunk.texts), pack))
    else:
        out += tasks
        texts.extend(chunk.texts)
    count = len(chunk.ids)
    for part in chunk:
        part.clear()
    return count


def _task_text(position: int, task: Any, identity: Identity) -> tuple[str, str]:
    """One task checked (a task_id, a string prompt, its identity fields): its canonical JSON
    and its id, as the plain text that JSON records (compared and hashed as that text)."""
    if type(task) is not dict:
        if not isinstance(task, Mapping):
            raise InvalidBatch(f"task #{position} is a {type(task).__name__}, not a mapping; "
                               "each task must be a dict with task_id and prompt")
        task = dict(task)  # a mapping's items, recorded as a dict's
    if "task_id" not in task:
        raise InvalidBatch(f"task #{position} has no task_id; give every task a unique "
                           "'task_id' string")
    task_id = task["task_id"]
    if type(task_id) is not str and isinstance(task_id, str):
        task_id = str.__str__(task_id)  # a subclass may compare and hash otherwise
    if type(task_id) is not str or not task_id:
        raise InvalidBatch(f"task #{position}: task_id must be a non-empty string, got "
                           f"{task_id!r}")
    if "\x00" in task_id:  # a ledger keeps ids as text, which PostgreSQL's cannot hold
        raise InvalidBatch(f"task #{position}: task_id {task_id!r} holds a NUL character "
                           "(\\x00); remove it from the id")
    prompt = task.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidBatch(f"task {task_id!r}: prompt must be a string, got "
                           f"{type(prompt).__name__}")
    for name in identity:
        if name not in task:
            _refuse_missing(task, task_id, name)
    return _encoded(task, task_id), task_id


def _refuse_missing(task: Mapping[str, Any], task_id: str, name: str) -> None:
    words = name.split()
    if len(words) > 1 and all(word in task for word in words):  # "task_id case_id"
        raise InvalidBatch(
            f"identity names the field {name!r}, which no task has, but the task has "
            f"{', '.join(map(repr, words))}: list each field on its own, e.g. "
            f"identity={list(dict.fromkeys(['task_id', *words]))!r}")
    raise InvalidBatch(f"task {task_id!r} lacks identity field {name!r}; add it to the task "
                       "or drop it from identity=")


# Above this recursion limit a task is measured before it is encoded: the encoder recurses in C,
# and a limit raised that far lets a deep task or a long cycle overflow the thread's stack.
SAFE_RECURSION_LIMIT = 4000


def _encoded(task: dict[str, Any], task_id: str) -> str:
    """The task's canonical JSON, or InvalidBatch naming a cycle, a depth beyond the bound, or
    a value JSON has no form for."""
    if getrecursionlimit() > SAFE_RECURSION_LIMIT and _nesting_problem(task, MAX_TASK_DEPTH):
        raise _unnestable(task, task_id)
    try:
        return _canonical(task)
    except RecursionError:
        raise _unnestable(task, task_id) from None
    except (TypeError, ValueError) as exc:
        raise _not_json(task_id, str(exc)) from None


def _not_json(task_id: str, why: str) -> InvalidBatch:
    return InvalidBatch(f"task {task_id!r} is not JSON-serialisable ({why}); keep tasks to "
                        "str/int/float/bool/None/list/dict with finite numbers")


def _unnestable(task: dict[str, Any], task_id: str) -> InvalidBatch:
    """A task too deep for the encoder: named a cycle where it holds itself, however long."""
    if _nesting_problem(task, None) == "cycle":
        return _not_json(task_id, "Circular reference detected")
    return _too_deep(task_id, "to encode as JSON")


WALKED = 1_000_000  # containers a task's walk looks at, at most: a list shared at every level
# is one container to the encoder but 2**depth to a walk


def _nesting_problem(task: Any, bound: int | None) -> str | None:
    """``"cycle"`` if a list or object holds itself, ``"deep"`` past ``bound`` levels (None: no
    bound) or past :data:`WALKED` containers (shared ones are walked again), else None; without
    recursion, so on any stack."""
    path: set[int] = set()  # the containers above the one looked at
    stack: list[tuple[Any, int]] = [(task, 1)]
    walked = 0
    while stack:
        value, depth = stack.pop()
        if depth < 0:  # every child of the container with this id looked at
            path.discard(value)
            continue
        if id(value) in path:
            return "cycle"
        walked += 1
        if (bound is not None and depth > bound) or walked > WALKED:
            return "deep"
        path.add(id(value))
        stack.append((id(value), -1))
        children = value.values() if isinstance(value, Mapping) else value
        stack.extend((child, depth + 1) for child in children
                     if isinstance(child, (Mapping, list, tuple)))
    return None


def _refuse_containers(tasks: Iterable[Mapping[str, Any]], identity: Identity) -> None:
    """Explicit identity values are JSON scalars, compared exactly (a dict or a list could never
    be echoed back equal), read from the tasks' JSON form (an enum member as its scalar)."""
    for task in tasks:
        for name in identity:
            value = task[name]
            if isinstance(value, (dict, list)):
                raise InvalidBatch(
                    f"task {task['task_id']!r}: identity field {name!r} is a "
                    f"{type(value).__name__}, but identity values must be plain JSON scalars "
                    "(str, int, float, bool or None) that the model copies back exactly; pass "
                    f"a plain value (e.g. str(...) or .value) or drop {name!r} from identity=")


def _check_encoded(joined: str, brackets: int, texts: Sequence[str],
                   task_ids: Sequence[str]) -> None:
    """Every task's text is valid UTF-8 and at most :data:`MAX_TASK_DEPTH` deep, or is named."""
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        for text, task_id in zip(texts, task_ids, strict=True):  # which task: the rare path
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidBatch(
                    f"task {task_id!r} holds a string that is not valid Unicode (an "
                    f"unpaired surrogate at position {exc.start} of its JSON); decode its text "
                    "with errors='replace' or fix the source") from None
    if brackets > MAX_TASK_DEPTH:  # few brackets: none is deep
        for text, task_id in zip(texts, task_ids, strict=True):
            if len(text) <= MAX_TASK_DEPTH:  # too short to hold that many brackets
                continue
            depth = nesting(text, MAX_TASK_DEPTH)
            if depth > MAX_TASK_DEPTH:
                raise _too_deep(task_id, f"({depth} levels of JSON, at most {MAX_TASK_DEPTH})")


def _too_deep(task_id: str, why: str) -> InvalidBatch:
    return InvalidBatch(f"task {task_id!r} is nested too deeply {why}; flatten it (or pass it "
                        "as a JSON string)")


ECHOED = "+echoed"  # an Identity's key part when echoed task fields are compared too


class Identity(tuple):
    """The fields every item must echo unchanged (``task_id`` first); with ``echo`` (the default),
    every other task field it returns too (docs/design.md, "Which fields are compared")."""

    echo: bool

    def __new__(cls, fields: Iterable[str], echo: bool = False) -> Identity:
        self = super().__new__(cls, fields)
        self.echo = echo
        return self

    @property
    def key(self) -> str:
        """Its part of a request key: the fields, and whether echoed fields are compared."""
        return ",".join(self) + (ECHOED if self.echo else "")


def parse_identity(text: str, option: str | None = None) -> tuple[str, ...]:
    """``"task_id,case_id"`` -> its field names. An empty name and a name with whitespace inside
    are typos, refused showing the spelling to use (as ``option``, ``--identity``, when given)."""
    parts = tuple(part.strip() for part in text.split(","))
    said = f"{option or 'identity'} {text!r}"
    if any(len(part.split()) > 1 for part in parts):
        fixed = ",".join(word for part in parts for word in part.split())
        raise InvalidBatch(f"{said}: the fields are separated by commas, not spaces (a field "
                           "whose name holds a space goes in a list: identity=[...]); write "
                           + (f"{option} {fixed}" if option else f"identity={fixed!r}"))
    if not text.strip() or not all(parts):
        raise InvalidBatch(f"{said}: give field names separated by commas, e.g. "
                           + (f"{option} task_id,case_id" if option else "'task_id,case_id'"))
    return parts


def normalize_identity(identity: Sequence[str] | str | None) -> Identity:
    if isinstance(identity, Identity):
        return identity
    if identity is None:
        return Identity(("task_id",), echo=True)
    if isinstance(identity, str):
        identity = parse_identity(identity)
    if isinstance(identity, (set, frozenset)):  # in an order of its own: keys kept on restart
        identity = sorted(identity, key=lambda f: (f != "task_id", str(f)))
    elif isinstance(identity, Mapping) or not isinstance(identity, Iterable):
        raise InvalidBatch(f"identity must be a list of task field names, got "
                           f"{type(identity).__name__}")
    fields = tuple(identity)
    if not all(isinstance(f, str) and f for f in fields):
        raise InvalidBatch(f"identity must name task fields as strings, got {identity!r}")
    if "task_id" not in fields:
        fields = ("task_id", *fields)
    if len(set(fields)) != len(fields):
        raise InvalidBatch(f"identity names a field twice: {fields!r}")
    return Identity(fields)


@dataclass(frozen=True)
class Request:
    """One unit of evidence: a fixed group of tasks sent together, keyed by its content. Key,
    ledger row and prompt are built from one text, ``tasks_json``, computed once."""

    key: str
    tasks: Sequence[dict]  # a tuple, or a RequestTasks decoding ``tasks_json`` when read
    position: int
    parent_key: str | None = None
    tasks_json: str = field(default="", repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tasks_json:
            object.__setattr__(self, "tasks_json", _canonical(list(self.tasks)))

    @cached_property
    def task_ids(self) -> tuple[str, ...]:
        """Its tasks' ids, read when first asked for: keying a request never decodes its tasks."""
        return tuple(t["task_id"] for t in self.tasks)

    def fresh_tasks(self) -> tuple[dict, ...]:
        """Its tasks decoded anew from ``tasks_json`` (a copy no one else holds), their ids kept
        as :attr:`task_ids` if not read yet: one decode serves a call and its receipt."""
        tasks = tuple(read_json(self.tasks_json))
        self.__dict__.setdefault("task_ids", tuple(task["task_id"] for task in tasks))
        return tasks

    @cached_property
    def task_ids_json(self) -> str:
        # each a JSON string literal, non-ASCII kept
        return "[" + ",".join(map(json.encoder.encode_basestring, self.task_ids)) + "]"


def stored_request(row: Any) -> Request:
    """A request as the ledger's ``requests`` row holds it, its tasks decoded when read."""
    return Request(row["key"], RequestTasks(row["tasks"], len(read_json(row["task_ids"]))),
                   row["position"], row["parent_key"], tasks_json=row["tasks"])


def render_items_prompt(tasks: Sequence[Mapping[str, Any]], identity: Sequence[str],
                        instructions: str | None, tasks_json: str | None = None) -> str:
    """The user message for a packed request; its tasks as one JSON block (``tasks_json``)."""
    return _items_prompt(len(tasks), identity, instructions, tasks_json if tasks_json is not None
                         else _canonical([dict(t) for t in tasks]))


def items_prompt_chars(count: int, identity: Sequence[str], instructions: str | None,
                       tasks_chars: int) -> int:
    """The length of the prompt of ``count`` tasks whose JSON block has ``tasks_chars``."""
    return len(_items_prompt(count, identity, instructions, "")) + tasks_chars


def _items_prompt(count: int, identity: Sequence[str], instructions: str | None,
                  tasks_json: str) -> str:
    lines = []
    if instructions:
        lines += [instructions.strip(), ""]
    lines += [
        f"Answer each of the {count} task(s) below. Return only JSON of the form "
        '{"items": [...]} with exactly one object per task, in any order. Copy these identity '
        f"fields from the task unchanged into its object: {', '.join(identity)}.",
        TASKS_BEGIN, tasks_json, TASKS_END,
    ]
    return "\n".join(lines)


def shared_head(instructions: str | None) -> str:
    """What every packed prompt of a batch starts with, byte for byte: a prompt cache's part."""
    return f"{instructions.strip()}\n\n" if instructions and instructions.strip() else ""


def render_value_prompt(task: Mapping[str, Any]) -> str:
    """The droste-style prompt: the caller's prompt, then its context if any."""
    prompt = task["prompt"]
    context = task.get("context")
    return prompt if context is None else f"{prompt}\n\nContext:\n{context}"


def render_repair_prompt(prompt: str, raw: str, errors: Sequence[Mapping[str, Any]],
                         limit: int = 4000) -> str:
    """The original prompt plus the exact errors and the (truncated) previous return."""
    listed = "\n".join(f"- {e.get('message', e)}" for e in errors[:50])
    more = f"\n- ... and {len(errors) - 50} more" if len(errors) > 50 else ""
    shown = raw if len(raw) <= limit else raw[:limit] + f"... [truncated, {len(raw)} chars]"
    return (f"{prompt}\n\nYour previous response was rejected. Errors:\n{listed}{more}\n"
            f"Previous response:\n{shown}\nReturn only corrected JSON, with no markdown or "
            "explanation.")


# -- checked tasks held as their requests' texts: sequences equal to the tasks they stand for --
class SequenceView(Sequence[Any]):
    """A read-only sequence built when read, equal to the list (or tuple) it stands for."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class PackedTasks(SequenceView):
    """Every task of a run, from its requests' texts (``pack`` tasks each, the last fewer)."""

    __slots__ = ("texts", "pack", "_count")

    def __init__(self, texts: Sequence[str], pack: int, count: int) -> None:
        self.texts, self.pack, self._count = texts, pack, count

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return chain.from_iterable(map(read_json, self.texts))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._count)
            if step != 1:
                return list(self)[index]
            texts = islice(self.texts, start // self.pack, None)  # from the request holding start
            skip = start % self.pack
            return list(islice(chain.from_iterable(map(read_json, texts)), skip,
                               skip + max(0, stop - start)))
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("task index out of range")
        return read_json(self.texts[index // self.pack])[index % self.pack]

    def request(self, position: int, text: str) -> RequestTasks:
        """The tasks of request ``position``, whose text, ``text``, is read already."""
        return RequestTasks(text, min(self.pack, self._count - position * self.pack))


class RequestTasks(PackedTasks):
    """One request's tasks, from its one text; sliced, a tuple, as a request's own tasks are."""

    __slots__ = ()

    def __init__(self, tasks_json: str, count: int) -> None:  # one per request: made cheaply
        self.texts, self.pack, self._count = (tasks_json,), count, count

    def __getitem__(self, index: Any) -> Any:
        found = super().__getitem__(index)
        return tuple(found) if isinstance(index, slice) else found

    def __repr__(self) -> str:
        return repr(tuple(self))


# -- where tasks come from, and where their texts are held ------------------------------------
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_task_file(tasks: Any) -> bool:
    """A path to a JSON Lines file of tasks: a ``Path`` (any name), or a str ending ``.jsonl``."""
    return isinstance(tasks, os.PathLike) or (
        isinstance(tasks, str) and tasks.endswith(JSONL_SUFFIXES) and "\n" not in tasks)


def stream_tasks(tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
                 hasher: Any = None, line: list[int] | None = None) -> Iterator[Any]:
    """Each task in order, from a list, an iterable or a JSON Lines file (blank lines skipped),
    never holding the whole; ``hasher`` is fed the very bytes read, naming what was checked;
    ``line[0]``: the file's line of the task last read."""
    if is_task_file(tasks):
        return _read_jsonl(Path(tasks), hasher, line if line is not None else [0])
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


def _read_jsonl(path: Path, hasher: Any, line_read: list[int]) -> Iterator[Any]:
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
                task = read_json(line)
            except (ValueError, RecursionError) as exc:  # a UnicodeDecodeError is a ValueError
                raise InvalidBatch(f"line {number} of the tasks file {str(path)!r} is not JSON "
                                   f"({str(exc)[:200]}); write one task object a line, as "
                                   "UTF-8") from None
            if type(task) is dict:  # one str per field name, not one per line
                task = {names.setdefault(k, k): v for k, v in task.items()}
            line_read[0] = number
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
