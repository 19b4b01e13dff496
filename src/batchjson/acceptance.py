"""The commit boundary: a return is accepted whole, or not at all.

Checks run in a fixed order (JSON, coverage, identity, schema, caller validator) and stop at the
first failing stage, naming every problem found in that stage. Nothing here "fixes" a return.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .schema import ItemSchema

REPAIRABLE = frozenset({"json", "coverage", "identity", "schema", "validation"})


@dataclass
class Verdict:
    """Outcome of acceptance for one return: accepted values, or the errors that rejected it."""

    accepted: bool
    values: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    stored: dict[str, Any] = field(default_factory=dict)  # values in their ledger (JSON) form

    @property
    def repairable(self) -> bool:
        return bool(self.errors) and all(e["type"] in REPAIRABLE for e in self.errors)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object naming a key twice is ambiguous (which case_id did the model mean?): refuse."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """Strict JSON (finite numbers only); a single ```json fence is tolerated."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```"):
        lines = stripped.splitlines()
        if len(lines) >= 3 and lines[0].strip().lower() in {"```", "```json"}:
            stripped = "\n".join(lines[1:-1]).strip()
    return json.loads(stripped, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)


def _error(kind: str, message: str, task_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "task_id": task_id, "message": message, **extra}


def _json_equal(a: Any, b: Any) -> bool:
    """Equality without Python's True == 1 and 1 == 1.0 conflations across types."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, dict) and isinstance(b, dict):  # nested values: the same rules all the way
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def unwrap(reply: Any) -> Any:
    """The answer's text inside the envelope its provider reported (``Reply.envelope``, see
    docs/providers.md): a ``{"value": ...}`` wrapper a strict JSON mode asked for is opened
    here, so the ledger keeps what the model sent. Anything else (no envelope, a wrapper with
    more than ``value``, text that is not JSON, an odd reply) comes back as it came, for the
    checks to judge."""
    text = getattr(reply, "text", None)
    if getattr(reply, "envelope", None) not in ("value", "tool_input/value"):
        return text
    if not isinstance(text, str):
        return text
    try:
        parsed = parse_json(text)
        if isinstance(parsed, dict) and parsed.keys() == {"value"}:
            return json.dumps(parsed["value"], ensure_ascii=False)
    except Exception:  # noqa: BLE001 - not JSON, too deep, ...: the checks reject it with why
        pass
    return text


async def judge(
    reply: Any,
    tasks: Sequence[Mapping[str, Any]],
    *,
    mode: str,
    identity: Sequence[str],
    schema: ItemSchema,
    validator: Callable[[Any, Mapping[str, Any]], Any] | None,
) -> Verdict:
    """The one entry point of the replay loop: judge a provider's reply against the ledger's own
    copy of the requested ``tasks``. ``mode`` is ``"items"`` or ``"value"``."""
    text = unwrap(reply)
    if mode == "value":
        return accept_value(text, tasks[0], schema, validator)
    return accept_items(text, tasks, identity, schema, validator)


def accept_items(
    text: str,
    tasks: Sequence[Mapping[str, Any]],
    identity: Sequence[str],
    schema: ItemSchema,
    validator: Callable[[Any, Mapping[str, Any]], Any] | None,
) -> Verdict:
    """Judge an ``{"items": [...]}`` return against exactly the tasks that were requested."""
    try:
        payload = parse_json(text)
    except ValueError as exc:
        return Verdict(False, errors=[_error("json", f"return is not valid JSON: {exc}")])
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        return Verdict(False, errors=[_error(
            "json", 'return must be a JSON object {"items": [...]} with one object per task')])
    extra = sorted(set(payload) - {"items"})
    if extra:  # e.g. a top-level case_id: which request would it belong to? Ambiguous: reject.
        return Verdict(False, errors=[_error(
            "json", f"unexpected top-level key(s) {', '.join(map(repr, extra))}: return only "
            '{"items": [...]}')])
    items = payload["items"]
    not_objects = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    if not_objects:
        return Verdict(False, errors=[_error(
            "json", f"items[{i}] is not an object") for i in not_objects])

    expected = {t["task_id"]: t for t in tasks}
    errors = _coverage(items, expected)
    if errors:
        return Verdict(False, errors=errors)

    for item in items:
        task = expected[item["task_id"]]
        for name in identity:
            if name not in item:
                errors.append(_error("identity", f"identity field {name!r} is missing (task "
                                     f"{task['task_id']!r})", task["task_id"], field=name))
            elif not _json_equal(item[name], task[name]):
                errors.append(_error(
                    "identity", f"{name} is {item[name]!r} but the request has {task[name]!r} "
                    f"(task {task['task_id']!r})", task["task_id"], field=name,
                    expected=task[name], got=item[name]))
    if errors:
        return Verdict(False, errors=errors)

    declared = schema.declared_fields
    kept = [n for n in identity if declared is not None and n in declared]  # may be coerced
    validated: dict[str, Any] = {}
    stored: dict[str, Any] = {}
    for item in items:
        task_id = item["task_id"]
        answer = {k: v for k, v in item.items() if k not in identity or k in kept}
        value, messages = schema.validate(answer, f"items[{task_id}]")
        errors.extend(_error("schema", m, task_id) for m in messages)
        if not messages:
            stored[task_id] = schema.dump(value)
            errors.extend(_coerced_identity(stored[task_id], expected[task_id], kept))
        validated[task_id] = value
    if errors:
        return Verdict(False, errors=errors)

    if validator is not None:
        for task_id, value in validated.items():
            errors.extend(run_validator(validator, value, expected[task_id], task_id))
        if errors:
            return Verdict(False, errors=errors)
    return Verdict(True, values=validated, stored=stored)


def accept_value(
    text: str,
    task: Mapping[str, Any],
    schema: ItemSchema,
    validator: Callable[[Any, Mapping[str, Any]], Any] | None,
) -> Verdict:
    """Judge a bare JSON value returned for one prompt (the droste-compatible shape)."""
    task_id = task["task_id"]
    try:
        payload = parse_json(text)
    except ValueError as exc:
        return Verdict(False, errors=[_error("json", f"return is not valid JSON: {exc}", task_id)])
    value, messages = schema.validate(payload, "$")
    if messages:
        return Verdict(False, errors=[_error("schema", m, task_id) for m in messages])
    if validator is not None:
        errors = run_validator(validator, value, task, task_id)
        if errors:
            return Verdict(False, errors=errors)
    return Verdict(True, values={task_id: value}, stored={task_id: schema.dump(value)})


def run_validator(validator: Callable[[Any, Mapping[str, Any]], Any], value: Any,
                  task: Mapping[str, Any], task_id: str) -> list[dict[str, Any]]:
    """ValueError rejects (repairable); any other exception is a validator crash, never retried."""
    try:
        validator(value, task)
    except ValueError as exc:
        return [_error("validation", f"task {task_id!r}: {exc}", task_id)]
    except Exception as exc:  # a bug in the caller's validator, reported not retried
        return [_error("validator_error",
                       f"task {task_id!r}: validator raised {type(exc).__name__}: {exc}", task_id)]
    return []


def _coerced_identity(stored: Any, task: Mapping[str, Any],
                      identity: Sequence[str]) -> list[dict[str, Any]]:
    """A schema that declares an identity field may coerce it ("078" -> 78): what would be
    committed must still equal the request."""
    if not isinstance(stored, dict):
        return []
    return [_error("schema", f"the schema turns {name} {task[name]!r} into {stored[name]!r} "
                   f"(task {task['task_id']!r}); declare it with the task's JSON type",
                   task["task_id"], field=name)
            for name in identity if name in stored and not _json_equal(stored[name], task[name])]


def _coverage(items: list[dict], expected: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Count and set of task_ids must equal the request's: name missing, duplicated and extra."""
    errors = []
    without_id = [i for i, item in enumerate(items) if not isinstance(item.get("task_id"), str)]
    for i in without_id:
        errors.append(_error("coverage", f"items[{i}] has no string task_id"))
    counts = Counter(item["task_id"] for item in items if isinstance(item.get("task_id"), str))
    for task_id in expected:
        if task_id not in counts:
            errors.append(_error("coverage", f"task {task_id!r} is missing from the return",
                                 task_id, problem="missing"))
    for task_id, n in counts.items():
        if task_id not in expected:
            errors.append(_error("coverage", f"item {task_id!r} was not requested",
                                 task_id, problem="extra"))
        elif n > 1:
            errors.append(_error("coverage", f"task {task_id!r} appears {n} times",
                                 task_id, problem="duplicated"))
    if not errors and len(items) != len(expected):
        errors.append(_error("coverage", f"return has {len(items)} items for "
                             f"{len(expected)} tasks"))
    return errors
