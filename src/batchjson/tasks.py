"""Tasks, the requests they are packed into, and the prompt text a request is sent as."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidBatch

TASKS_BEGIN = "<<<BATCHJSON_TASKS"
TASKS_END = "BATCHJSON_TASKS>>>"


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def normalize_tasks(tasks: Iterable[Mapping[str, Any]], identity: Sequence[str]) -> list[dict]:
    """Check every task before anything is spent, naming the first bad one and the fix."""
    if isinstance(tasks, (str, bytes)) or isinstance(tasks, Mapping):
        raise InvalidBatch("tasks must be a list of mappings, one per task; got "
                           f"{type(tasks).__name__}")
    try:
        items = list(tasks)
    except TypeError:
        raise InvalidBatch(
            f"tasks must be a list of mappings, got {type(tasks).__name__}") from None
    if not items:
        raise InvalidBatch("empty batch: pass at least one task")
    identity = normalize_identity(identity)
    seen: dict[str, int] = {}
    out: list[dict] = []
    for position, task in enumerate(items):
        if not isinstance(task, Mapping):
            raise InvalidBatch(f"task #{position} is a {type(task).__name__}, not a mapping; "
                               "each task must be a dict with task_id and prompt")
        if "task_id" not in task:
            raise InvalidBatch(f"task #{position} has no task_id; give every task a unique "
                               "'task_id' string")
        task_id = task["task_id"]
        if not isinstance(task_id, str) or not task_id:
            raise InvalidBatch(f"task #{position}: task_id must be a non-empty string, got "
                               f"{task_id!r}")
        if task_id in seen:
            raise InvalidBatch(f"duplicate task_id {task_id!r} (tasks #{seen[task_id]} and "
                               f"#{position}); task_ids must be unique within a batch")
        seen[task_id] = position
        prompt = task.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidBatch(f"task {task_id!r}: prompt must be a string, got "
                               f"{type(prompt).__name__}")
        for field in identity:
            if field not in task:
                raise InvalidBatch(f"task {task_id!r} lacks identity field {field!r}; add it to "
                                   "the task or drop it from identity=")
        try:
            _canonical(task)
        except (TypeError, ValueError) as exc:
            raise InvalidBatch(f"task {task_id!r} is not JSON-serialisable ({exc}); keep tasks "
                               "to str/int/float/bool/None/list/dict with finite numbers") from None
        out.append(dict(task))
    return out


def normalize_identity(identity: Sequence[str] | str | None) -> tuple[str, ...]:
    if identity is None:
        return ("task_id",)
    if isinstance(identity, str):
        identity = [part.strip() for part in identity.split(",") if part.strip()]
    fields = tuple(identity)
    if not all(isinstance(f, str) and f for f in fields):
        raise InvalidBatch(f"identity must name task fields as strings, got {identity!r}")
    if "task_id" not in fields:
        fields = ("task_id", *fields)
    if len(set(fields)) != len(fields):
        raise InvalidBatch(f"identity names a field twice: {fields!r}")
    return fields


@dataclass(frozen=True)
class Request:
    """One unit of evidence: a fixed group of tasks sent together, keyed by its content."""

    key: str
    tasks: tuple[dict, ...]
    position: int
    parent_key: str | None = None

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(t["task_id"] for t in self.tasks)


def request_key(tasks: Sequence[Mapping[str, Any]], content: Mapping[str, str]) -> str:
    """Hash of exact content: the tasks (prompts, contexts, identity values) plus fingerprints."""
    return sha(_canonical({"tasks": list(tasks), **content}))


def pack_requests(tasks: Sequence[dict], pack: int, content: Mapping[str, str]) -> list[Request]:
    if not isinstance(pack, int) or isinstance(pack, bool) or pack < 1:
        raise InvalidBatch(f"pack must be a whole number >= 1, got {pack!r}")
    out = []
    for position, start in enumerate(range(0, len(tasks), pack)):
        group = tuple(tasks[start:start + pack])
        out.append(Request(request_key(group, content), group, position))
    return out


def split_request(request: Request, content: Mapping[str, str]) -> list[Request]:
    """Deterministic halving: the first half keeps the extra task on odd sizes."""
    middle = (len(request.tasks) + 1) // 2
    halves = (request.tasks[:middle], request.tasks[middle:])
    return [Request(request_key(h, content), h, request.position, parent_key=request.key)
            for h in halves if h]


def render_items_prompt(tasks: Sequence[Mapping[str, Any]], identity: Sequence[str],
                        instructions: str | None) -> str:
    """The user message for a packed request; tasks travel as one JSON block."""
    lines = []
    if instructions:
        lines += [instructions.strip(), ""]
    lines += [
        f"Answer each of the {len(tasks)} task(s) below. Return only JSON of the form "
        '{"items": [...]} with exactly one object per task, in any order. Copy these identity '
        f"fields from the task unchanged into its object: {', '.join(identity)}.",
        TASKS_BEGIN,
        _canonical([dict(t) for t in tasks]),
        TASKS_END,
    ]
    return "\n".join(lines)


def render_value_prompt(task: Mapping[str, Any]) -> str:
    """The droste-style prompt: the caller's prompt, then its context if any."""
    prompt = task["prompt"]
    context = task.get("context")
    if context is None:
        return prompt
    return f"{prompt}\n\nContext:\n{context}"


def render_repair_prompt(prompt: str, raw: str, errors: Sequence[Mapping[str, Any]],
                         limit: int = 4000) -> str:
    """The original prompt plus the exact errors and the (truncated) previous return."""
    listed = "\n".join(f"- {e.get('message', e)}" for e in errors[:50])
    more = f"\n- ... and {len(errors) - 50} more" if len(errors) > 50 else ""
    shown = raw if len(raw) <= limit else raw[:limit] + f"... [truncated, {len(raw)} chars]"
    return (
        f"{prompt}\n\nYour previous response was rejected. Errors:\n{listed}{more}\n"
        f"Previous response:\n{shown}\n"
        "Return only corrected JSON, with no markdown or explanation."
    )


def tasks_block(prompt: str) -> str | None:
    """The JSON text of the tasks a rendered prompt carries (the loopback server reads it)."""
    start = prompt.find(TASKS_BEGIN)
    end = prompt.find(TASKS_END, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return None
    return prompt[start + len(TASKS_BEGIN):end]
