"""The commit boundary (docs/design.md): a return is accepted whole or not at all; under
``accept="items"`` one whole in JSON, coverage and identity may be accepted in part. Checks run in a
fixed order (JSON, coverage, identity, schema, caller validator) and stop at the first failing
stage, naming every problem there; nothing "fixes" a return. Judging is total: the outcome is a
:class:`Verdict`, never an exception, so the raw text is kept and the run goes on."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from operator import getitem
from typing import Any

from .._canon import canonical_json, ledger_json
from .._content.schema import ItemSchema, without_absent_nulls
from .._content.strictjson import (
    exact_if_lossy,
    exact_json,
    has_float,
    holds_lossy,
    json_equal,
    parse_json,
    parse_json_noting,
    strip_fence,
)
from .._errors import RejectReturn
from .._providers.reply import Reply
from .._secrets import keys_masked
from .._sources import NO_TOOL_CALL, NOT_TEXT, REFUSED, TOOL_CALL, TRUNCATED

# What asking again with the errors named can mend (not a truncated or refused return).
REPAIRABLE = frozenset({"json", "coverage", "identity", "schema", "validation", TOOL_CALL,
                        NO_TOOL_CALL})


@dataclass
class Verdict:
    """One return's accepted values, or the errors that rejected it; a rejected verdict holding
    values is partial (``accept="items"``): the ``errors`` name the tasks that did not pass."""

    accepted: bool
    values: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)
    stored: dict[str, str] = field(default_factory=dict)  # values as the ledger's JSON texts

    @property
    def partial(self) -> bool:
        return not self.accepted and bool(self.stored)

    @property
    def rejected_ids(self) -> list[str]:
        """The tasks a partial verdict rejected, in the order their errors name them."""
        return list(dict.fromkeys(e["task_id"] for e in self.errors))


# What may reject an item and not its return (``accept="items"``), named for that task.
ITEM_FAULTS = frozenset({"schema", "validation"})


def unwrap(reply: Reply) -> str:
    """The answer's text inside the ``{"value": ...}`` envelope its provider reported, as the model
    wrote it; anything else as it came, for the checks to judge."""
    text = reply.text
    if reply.envelope not in ("value", "tool_input/value"):
        return text
    try:
        parsed = parse_json(text)
        if isinstance(parsed, dict) and parsed.keys() == {"value"}:
            inner = _inner_text(text)  # as written: a re-dump would round 10000000000000001.0
            return inner if inner is not None else json.dumps(parsed["value"],
                                                              ensure_ascii=False)
    except Exception:  # noqa: BLE001 - not JSON, too deep, ...: the checks reject it with why
        pass
    return text


def _stopped(reply: Reply, tasks: Sequence[Mapping[str, Any]], mode: str) -> Verdict:
    """A reply rejected for its ``stop``, named as the stop (a text that was not a str is a
    ``json`` error: the provider broke the contract)."""
    said = next((f" ({key}: {reply.extra[key]})" for key in ("finish_reason", "stop_reason")
                 if isinstance(reply.extra.get(key), str)), "")
    if isinstance(reply.extra.get("cut_at"), str):  # inferred from the usage (reply.received)
        said = f" ({reply.extra['cut_at']})"
    messages = {
        TRUNCATED: f"the provider cut this return off at its output limit{said}: it is no "
                   "whole answer even where it parses, and asking again under the same limit "
                   "would be cut off again",
        REFUSED: f"the model refused to answer{said}: {clip(reply.text, 200) or '(no text)'}",
        TOOL_CALL: "the model answered with a tool call where a JSON text answer was asked",
        NO_TOOL_CALL: f"the model answered in text where it was to call the answer tool{said}",
        NOT_TEXT: f"provider returned its text as {reply.extra.get('text_type', 'not str')}, "
                  "not str: a provider must hand back the raw text it received (fix the "
                  "provider)",
    }
    kind = "json" if reply.stop == NOT_TEXT else str(reply.stop)
    task_id = tasks[0]["task_id"] if mode == "value" else None
    return Verdict(False, errors=[error(kind, messages[str(reply.stop)], task_id)])


_VALUE_OPEN = re.compile(r'\s*\{\s*"value"\s*:\s*')
_CLOSE = re.compile(r"\s*\}\s*")


def _inner_text(text: str) -> str | None:
    """The text of X in ``{"value": X}``, exactly as the model wrote it, or None."""
    stripped = strip_fence(text)
    opened = _VALUE_OPEN.match(stripped)
    if opened is None:
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(stripped, opened.end())
    except ValueError:
        return None
    return stripped[opened.end():end] if _CLOSE.fullmatch(stripped, end) else None


# -- the entry point ---------------------------------------------------------------------------
async def judge(
    reply: Reply,
    tasks: Sequence[Mapping[str, Any]],
    *,
    mode: str,
    identity: Sequence[str],
    schema: ItemSchema,
    validator: Callable[[Any, Mapping[str, Any]], Any] | None,
    accept: str = "whole",
) -> Verdict:
    """Judge a provider's reply against the ledger's own copy of the requested ``tasks`` (``mode``
    ``"items"`` or ``"value"``); a reply whose ``stop`` says it is no whole answer is rejected
    under that name. ``accept="items"``: partial when only some items fail schema or validator."""
    try:
        if reply.stop is not None:  # the provider says this is no whole answer, whatever it reads
            return _stopped(reply, tasks, mode)
        text = unwrap(reply)  # the envelope the provider reported (the ledger keeps it whole)
        try:
            parsed = parse_json_noting(text)
        except ValueError as exc:
            if reply.extra.get("cut_at"):  # every output token used, the JSON unfinished
                return _stopped(replace(reply, stop=TRUNCATED), tasks, mode)
            return Verdict(False, errors=[error("json", f"return is not valid JSON: {exc}",
                                                 tasks[0]["task_id"] if mode == "value" else None)])
        judged = (_prepare_value(text, parsed, tasks[0], identity, schema) if mode == "value"
                  else _prepare_items(text, parsed, tasks, identity, schema))
        if isinstance(judged, Verdict):
            return judged
        prepared, errors = judged  # errors: the items the schema rejected
        if errors and accept != "items":
            return Verdict(False, errors=errors)
        for task_id, value, _, task in prepared if validator is not None else ():
            errors.extend(await run_validator_async(validator, value, task, task_id))
        if not errors:
            return _accepted(prepared)
        return _in_part(prepared, errors) if accept == "items" else Verdict(False, errors=errors)
    except BaseException as exc:  # judging never crashes a run that has already paid for it
        if not judged_code_raised(exc):
            raise
        return Verdict(False, errors=[error(
            "json", f"the return could not be judged ({type(exc).__name__}: {said(exc)})")])


Prepared = list[tuple[str, Any, str, Mapping[str, Any]]]  # task_id, value, its ledger text, task
# What passed the schema, and the errors of the items that did not: a return judged so far.
Judged = tuple[Prepared, list[dict[str, Any]]]


def _accepted(prepared: Prepared) -> Verdict:
    return Verdict(True, values={t: v for t, v, _, _ in prepared},
                   stored={t: s for t, _, s, _ in prepared})


def _in_part(prepared: Prepared, errors: list[dict[str, Any]]) -> Verdict:
    """A partial verdict when every error is an item's own fault (:data:`ITEM_FAULTS`) and some
    item passed; else a rejection."""
    failed = {e.get("task_id") for e in errors}
    good = [p for p in prepared if p[0] not in failed]
    if not good or any(e["type"] not in ITEM_FAULTS or e.get("task_id") is None or "field" in e
                       for e in errors):
        return Verdict(False, errors=errors)
    return replace(_accepted(good), accepted=False, errors=errors)


def sub_return(raw: str, task_ids: Sequence[str]) -> str:
    """The items of ``task_ids`` of a return that passed coverage, as a return of their own: what
    a partial return's parts are judged, recorded and repaired by."""
    wanted, payload = set(task_ids), parse_json(raw)
    if payload.keys() == {"value"}:  # a strict mode's envelope (see unwrap)
        payload = payload["value"]
    items = [item for item in payload["items"] if item.get("task_id") in wanted]
    return json.dumps({"items": items}, ensure_ascii=False)


# -- items -------------------------------------------------------------------------------------
def _prepare_items(text: str, parsed: tuple[Any, bool], tasks: Sequence[Mapping[str, Any]],
                   identity: Sequence[str], schema: ItemSchema) -> Verdict | Judged:
    payload, long_numbers = parsed
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        return Verdict(False, errors=[error(
            "json", 'return must be a JSON object {"items": [...]} with one object per task')])
    extra = sorted(set(payload) - {"items"})
    if extra:  # e.g. a top-level case_id: which request would it belong to? Ambiguous: reject.
        return Verdict(False, errors=[error(
            "json", f"unexpected top-level key(s) {', '.join(map(repr, extra))}: return only "
            '{"items": [...]}')])
    items = payload["items"]
    if "null" in text:  # strict mode's nulls for absent optional fields (only text with one)
        items = [without_absent_nulls(item, schema.json_schema) for item in items]
    not_objects = [i for i, item in enumerate(items) if not isinstance(item, dict)]
    if not_objects:
        return Verdict(False, errors=[error(
            "json", f"items[{i}] is not an object") for i in not_objects])
    expected = {t["task_id"]: t for t in tasks}
    errors = _coverage(items, expected)
    if errors:
        return Verdict(False, errors=errors)

    compared = {item["task_id"]: compared_fields(expected[item["task_id"]], identity, item)
                for item in items}
    echoes = [(item, expected[item["task_id"]], compared[item["task_id"]]) for item in items]
    errors = _compare_echoes(echoes, identity, lambda: exact_json(text)["items"])
    if errors:
        return Verdict(False, errors=errors)

    declared = schema.declared_fields
    prepared: Prepared = []
    lossy = exact_if_lossy(text) if long_numbers else None
    for position, item in enumerate(items):
        task = expected[item["task_id"]]
        fields = compared[task["task_id"]]
        kept = [n for n in fields if declared is not None and n in declared]  # may be coerced
        answer = {k: v for k, v in item.items() if k not in fields or k in kept}
        exact = lossy["items"][position] if lossy is not None else None
        if exact is not None:
            exact = {k: v for k, v in exact.items() if k in answer} if holds_lossy(exact) else None
        found, judged = _judged(
            schema, answer, f"items[{task['task_id']}]", task, lambda exact=exact: exact,
            # what would be committed, not only what was returned: a schema may add or change
            # a compared field (a pydantic before-validator setting case_id, extra="allow")
            lambda stored, task=task: compared_fields(task, identity, stored))
        errors.extend(found)
        prepared.extend(judged)
    return prepared, errors


def _judged(schema: ItemSchema, answer: Any, path: str, task: Mapping[str, Any],
            as_written: Callable[[], Any], held: Callable[[dict], list[str]]
            ) -> tuple[list[dict[str, Any]], Prepared]:
    """One answer judged by the schema: as read, then as written when a number is not the float
    it reads as (``as_written()``); then its ledger form, whose ``held`` fields must not change."""
    task_id, kind = task["task_id"], "schema"
    try:
        value, messages = schema.validate(answer, path)
    except BaseException as exc:  # the schema's own code failed: a validator_error
        if not judged_code_raised(exc):
            raise
        value, kind = None, "validator_error"
        messages = [f"{path}: the schema's own validation raised {type(exc).__name__}: "
                    f"{said(exc)}; fix the schema or its validators"]
    exact = as_written() if not messages else None
    if exact is not None:
        messages = schema.exact_errors(exact, answer, path)
    if messages:
        return [error(kind, m, task_id) for m in messages], []
    text, stored, problem = _stored(schema, value, task_id)
    if problem:
        return [problem], []
    # a schema declaring an identity field may coerce it ("078" -> 78): what is committed
    # must still equal the request
    coerced = [name for name in held(stored) if name in stored
               and not json_equal(stored[name], task[name])] if isinstance(stored, dict) else []
    return [error("schema", f"the schema turns {name} {clip(task[name])} into "
                  f"{clip(stored[name])} (task {task_id!r}); declare it with the task's JSON "
                  "type", task_id, field=name) for name in coerced], [(task_id, value, text, task)]


def compared_fields(task: Mapping[str, Any], identity: Sequence[str],
                    item: Mapping[str, Any] | None = None) -> list[str]:
    """The fields of ``task`` an item is held to: the identity fields, and under ``echo`` every
    other task field the item returns, prompt and context aside."""
    fields = list(identity)
    if getattr(identity, "echo", False):
        fields += [k for k in task if k not in fields and k not in ECHO_EXEMPT
                   and (item is None or k in item)]
    return fields


ECHO_EXEMPT = frozenset({"prompt", "context"})


Echo = tuple[Mapping[str, Any], Mapping[str, Any], list[str]]  # an object, its task, its fields


def _compare_echoes(echoes: Sequence[Echo], identity: Sequence[str],
                    exact_objects: Callable[[], list[Any]]) -> list[dict[str, Any]]:
    """Identity errors of objects held to their task's listed fields; ``exact_objects`` reads them
    with floats exact, only when a float could compare equal by rounding."""
    errors = []
    exact: list[Any] | None = None
    for position, (item, task, fields) in enumerate(echoes):
        for name in fields:
            if name not in item:
                errors.append(error("identity", f"identity field {name!r} is missing (task "
                                     f"{task['task_id']!r})", task["task_id"], field=name))
                continue
            got = item[name]
            if has_float(task[name]) and json_equal(got, task[name]):
                if exact is None:
                    exact = exact_objects()
                got = exact[position][name]
            if not json_equal(got, task[name]):
                shown, wanted = item[name], task[name]
                hint = ("" if name in identity else "; an echoed task field: under the default "
                        "identity every task field an item returns is compared (pass identity= "
                        "to compare only the fields you list)")
                errors.append(error(
                    "identity", f"{name} is {clip(shown)} but the request has "
                    f"{clip(wanted)} (task {task['task_id']!r}){hint}", task["task_id"],
                    field=name, expected=_scalar_orclip(wanted), got=_scalar_orclip(shown)))
    return errors


def _scalar_orclip(value: Any) -> Any:
    """Scalars as they are, structures as a short text (deep nesting must not break a receipt)."""
    return clip(value) if isinstance(value, (dict, list)) else value


# -- value -------------------------------------------------------------------------------------
def _prepare_value(text: str, parsed: tuple[Any, bool], task: Mapping[str, Any],
                   identity: Sequence[str], schema: ItemSchema) -> Verdict | Judged:
    payload, long_numbers = parsed
    errors = _value_echoes(text, payload, task, identity)
    if errors:
        return Verdict(False, errors=errors)
    if "null" in text:  # as for items
        payload = without_absent_nulls(payload, schema.json_schema)

    def as_written() -> Any:
        lossy = exact_if_lossy(text) if long_numbers else None
        return None if lossy is None else without_absent_nulls(lossy, schema.json_schema)

    echo = getattr(identity, "echo", False)  # a schema may set or coerce an echo
    errors, judged = _judged(schema, payload, "$", task, as_written,
                             lambda stored: compared_fields(task, identity, stored) if echo
                             else [])
    return Verdict(False, errors=errors) if errors else (judged, [])


def _value_echoes(text: str, payload: Any, task: Mapping[str, Any],
                  identity: Sequence[str]) -> list[dict[str, Any]]:
    """Under ``echo``, a value that is an object is held to its task like an item, and so is
    every object inside it naming a ``task_id`` (only this task was asked)."""
    if not getattr(identity, "echo", False) or not isinstance(payload, (dict, list)):
        return []
    paths = _echo_paths(payload)
    objects = [reduce(getitem, path, payload) for path in paths]
    echoes = [(obj, task, [n for n in compared_fields(task, identity, obj) if n in obj])
              for obj in objects]
    return _compare_echoes(echoes, identity,
                           lambda: [reduce(getitem, path, exact_json(text)) for path in paths])


def _echo_paths(payload: Any) -> list[tuple[Any, ...]]:
    """Paths of the value itself when an object and of every object in it naming a ``task_id``."""
    paths: list[tuple[Any, ...]] = [()] if isinstance(payload, dict) else []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(payload, ())]
    while stack:
        node, path = stack.pop()
        children = (node.items() if isinstance(node, dict) else enumerate(node)
                    if isinstance(node, list) else ())
        for key, child in children:
            if isinstance(child, dict) and "task_id" in child:
                paths.append((*path, key))
            if isinstance(child, (dict, list)):
                stack.append((child, (*path, key)))
    return paths


def _stored(schema: ItemSchema, value: Any, task_id: str
            ) -> tuple[str, Any, dict[str, Any] | None]:
    """The ledger's text of a validated value (encoded once) and the JSON value it holds, or the
    schema error that prevents one (an infinite float, an unpaired surrogate)."""
    try:
        text = ledger_json(schema.dump(value))
        # a JSON Schema's value was read from JSON and is stored as it is: reading its text
        # back gives the same value; a model's dump is read back as the ledger will hold it
        stored = json.loads(text) if schema.model is not None else value
        if "\\ud" in text:  # an unpaired surrogate ("\\ud800") cannot be written as UTF-8
            canonical_json(stored).encode("utf-8")
        return text, stored, None
    except (TypeError, ValueError) as exc:
        return "", None, error("schema", f"task {task_id!r}: the validated value has no JSON "
                                f"form ({clip(str(exc), 160)}); numbers must be finite and "
                                "strings valid Unicode (no unpaired surrogate escapes)", task_id)


def _coverage(items: list[dict], expected: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Count and set of task_ids must equal the request's: name missing, duplicated and extra."""
    ids = [item.get("task_id") for item in items]
    if len(ids) == len(expected) and all(type(i) is str for i in ids) and len(
            set(ids)) == len(ids) and expected.keys() == set(ids):
        return []  # the common return: every task once, nothing else
    errors = [error("coverage", f"items[{i}] has no string task_id")
              for i, item in enumerate(items) if not isinstance(item.get("task_id"), str)]
    counts = Counter(item["task_id"] for item in items if isinstance(item.get("task_id"), str))
    for task_id in expected:
        if task_id not in counts:
            errors.append(error("coverage", f"task {task_id!r} is missing from the return",
                                 task_id, problem="missing"))
    for task_id, n in counts.items():
        if task_id not in expected:
            errors.append(error("coverage", f"item {task_id!r} was not requested",
                                 task_id, problem="extra"))
        elif n > 1:
            errors.append(error("coverage", f"task {task_id!r} appears {n} times",
                                 task_id, problem="duplicated"))
    return errors


# -- the caller's validator, run so that it can only say yes, no (repairable), or that it is
# broken (a validator_error, never retried; docs/design.md, "The commit boundary", step 5) ---
async def run_validator_async(validator: Callable[[Any, Mapping[str, Any]], Any], value: Any,
                              task: Mapping[str, Any], task_id: str) -> list[dict[str, Any]]:
    """ValueError, AssertionError or ``False`` rejects; any other exception is a crash; only
    ``None``, ``True`` (``numpy.bool_``) or the item accepts. It gets its own copy of the task."""
    try:
        out = validator(value, json.loads(canonical_json(dict(task))))  # its own copy
        if inspect.isawaitable(out):
            out = await out
        verdict = _returned(out, value)
    except CountedAsCrash as exc:  # a contract that counts what was raised as a crash
        return [crashed(exc.__cause__ or exc, task_id)]
    except RejectReturn as exc:  # about the whole return: no task of it is committed
        return [error("validation", f"the validator rejected the whole return at task "
                      f"{task_id!r}: {said(exc)}")]
    except ValueError as exc:
        return [error("validation", f"task {task_id!r}: {said(exc)}", task_id)]
    except AssertionError as exc:  # pydantic's rule too: a failed assert rejects the item
        return [error("validation", f"task {task_id!r}: {_assertion(exc)}", task_id)]
    except BaseException as exc:  # a bug in the caller's validator, reported not retried
        if not judged_code_raised(exc):
            raise
        return [crashed(exc, task_id, _model_hint(exc, value))]
    if verdict is False:
        return [error("validation", f"task {task_id!r}: the validator returned False", task_id)]
    if verdict is None:
        return [error("validator_error", f"task {task_id!r}: the validator returned "
                       f"{clip(out, 80)} ({type(out).__name__}); return None or True to accept, "
                       "False (or raise ValueError) to reject: its return value is never used "
                       "as the item", task_id)]
    return []


def crashed(exc: BaseException, task_id: str, hint: str = "") -> dict[str, Any]:
    """A ``validator_error`` naming what the validator raised, with its own frames."""
    frames = validator_frames(exc)
    return error("validator_error", keys_masked(f"task {task_id!r}: validator raised "
                                                f"{type(exc).__name__}: {said(exc)}{hint}"),
                 task_id, **({"traceback": frames} if frames else {}))


def said(exc: BaseException) -> str:
    """What ``exc`` says, or that its own ``__str__`` raised (the validator's bug)."""
    try:
        return str(exc)
    except Exception as failure:  # noqa: BLE001 - any bug in the caller's __str__
        return f"<its __str__ raised {clip(failure)}>"


_OWN_CODE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
FRAMES_SHOWN, TRACEBACK_CHARS = 8, 2000


def validator_frames(exc: BaseException) -> str:
    """The innermost ``FRAMES_SHOWN`` frames of ``exc`` in the caller's code, keys masked."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.realpath(f.filename).startswith(_OWN_CODE)]
    hidden = max(0, len(frames) - FRAMES_SHOWN)
    lines = [f"... {hidden} earlier frame(s)"] if hidden else []
    for frame in frames[hidden:]:
        lines.append(f'File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"  {frame.line.strip()[:200]}")
    return keys_masked("\n".join(lines))[-TRACEBACK_CHARS:]


class CountedAsCrash(Exception):
    """Raised from a validator's exception by a wrapper whose contract counts it a crash."""


def droste_verdicts(fn: Callable[[Any, int], Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    """``fn(value, index)`` judged as droste 0.26 does: only ``ValueError`` rejects, a failed
    ``assert`` is a ``validator_error``, what it returns is ignored; an ``async def`` awaited."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        try:
            out = fn(value, task["index"])
        except AssertionError as exc:
            raise CountedAsCrash() from exc
        return _awaited_ignoring(out) if inspect.isawaitable(out) else None

    return check


async def _awaited_ignoring(out: Any) -> None:
    try:
        await out
    except AssertionError as exc:
        raise CountedAsCrash() from exc


def _assertion(exc: AssertionError) -> str:
    """An assert's own message, else the failing ``assert`` line (for the repair prompt)."""
    if message := said(exc):
        return message
    frames = traceback.extract_tb(exc.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    return f"{line} failed" if line.startswith("assert") else "an assert in the validator failed"


def _model_hint(exc: BaseException, value: Any) -> str:
    """Why ``item["field"]`` fails when a pydantic schema hands the validator a model."""
    fields = getattr(type(value), "model_fields", None)
    if not isinstance(exc, TypeError) or not fields or "subscriptable" not in str(exc):
        return ""
    name = next(iter(fields), "field")
    return (f" (with a pydantic schema the validator gets a {type(value).__name__} instance, "
            f"not a dict: read item.{name}, not item[{name!r}])")


def _returned(out: Any, value: Any) -> bool | None:
    """What a validator's return says: True accepts, False rejects, None is no answer."""
    if out is None or out is True or out is value:
        return True
    if out is False:
        return False
    kind = type(out)
    if kind.__name__ in ("bool_", "bool") and kind.__module__.split(".")[0] in _BOOL_LIKE:
        return bool(out)
    return None


_BOOL_LIKE = frozenset({"numpy", "jax", "torch", "cupy"})


def judged_code_raised(exc: BaseException) -> bool:
    """Whether an exception out of judged code is its own doing (a ``validator_error``), not the
    run being stopped: this task cancelled, or Ctrl-C (which lands on the main thread)."""
    if isinstance(exc, asyncio.CancelledError):
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        return current is not None and not current.cancelling()
    if isinstance(exc, KeyboardInterrupt):
        return threading.current_thread() is not threading.main_thread()
    return True


MESSAGE_CHARS = 2000


def error(kind: str, message: str, task_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """One error of a verdict, as receipts keep it; its message, stored, shown and sent in a
    paid repair prompt, capped at ``MESSAGE_CHARS``, saying how much was cut."""
    if len(message) > MESSAGE_CHARS:
        message = (f"{message[:MESSAGE_CHARS]}... ({len(message) - MESSAGE_CHARS:,} more "
                   "characters cut)")
    return {"type": kind, "task_id": task_id, "message": message, **extra}


def clip(value: Any, limit: int = 200) -> str:
    """A short repr for a message; one whose repr fails (or recurses) is named by its type."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - RecursionError included
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."
