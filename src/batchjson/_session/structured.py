"""droste's ``llm_batch_json`` contract over a session: one prompt per call, a bare JSON value."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .._checks import is_whole
from .._content.schema import ItemSchema, compile_schema, near_miss
from .._content.tasks import sha
from .._errors import InvalidBatch
from .registry import ValidatorRegistry
from .result import BatchResult
from .spec import RunSpec, check_text


class Runs(Protocol):
    """What the contract uses of a session (``session.py`` imports this module)."""

    validators: ValidatorRegistry

    def run(self, spec: RunSpec) -> BatchResult: ...

_DROSTE_TYPES = {
    "json": "validation_error", "schema": "validation_error", "validation": "validation_error",
    "coverage": "validation_error", "identity": "validation_error",
    "validator_error": "validator_error", "provider_error": "provider_error",
    "budget_exhausted": "budget_exhausted", "not_attempted": "budget_exhausted",
    "cancelled": "provider_error",
}


RAW_SHOWN = 1000  # droste's errors carry the start of the rejected return

# droste 0.26's deterministic schema subset: its helper refuses any other keyword before spending
DROSTE_KEYWORDS = frozenset({"type", "enum", "const", "required", "properties",
                             "additionalProperties", "items", "minItems", "maxItems", "minimum",
                             "maximum"})


def check_droste_schema(schema: Any) -> None:
    """Refuse a schema droste's helper would: not a dict, or a keyword outside its subset."""
    if not isinstance(schema, Mapping):
        raise InvalidBatch(f"schema must be a JSON Schema dict in droste's subset "
                           f"({', '.join(sorted(DROSTE_KEYWORDS))}), got "
                           f"{getattr(schema, '__qualname__', type(schema).__name__)}")
    pending: list[tuple[str, Any]] = [("schema", schema)]
    while pending:
        where, node = pending.pop()
        if not isinstance(node, Mapping):
            continue  # a shape error: compile_schema names it
        unknown = sorted(k for k in node if isinstance(k, str) and k not in DROSTE_KEYWORDS)
        if unknown:
            near = next(((k, m) for k in unknown if (m := near_miss(k, DROSTE_KEYWORDS))), None)
            raise InvalidBatch(
                f"unsupported JSON schema keywords: {', '.join(unknown)} (at {where}); "
                + (f"did you mean {near[1]!r} for {near[0]!r}? " if near else "") + "this "
                f"host's llm_batch_json takes droste's schema subset only "
                f"({', '.join(sorted(DROSTE_KEYWORDS))}). Check what the keyword checked in "
                "your validator instead (raise ValueError there)")
        properties = node.get("properties")
        if isinstance(properties, Mapping):
            pending.extend((f"{where}.properties.{k}", v) for k, v in properties.items())
        for keyword in ("additionalProperties", "items"):
            pending.append((f"{where}.{keyword}", node.get(keyword)))


def default_batch_name(prompts: Sequence[str], contexts: Sequence[str] | None,
                       content: str | None = None) -> str:
    """Same prompts and contexts -> same batch; with ``content``, one batch a content."""
    digest = sha(json.dumps([list(prompts), None if contexts is None else list(contexts)]))
    name = f"llm_batch_json/{digest[:16]}"
    return name if content is None else f"{name}/{content[:8]}"


def llm_batch_json(session: Runs, prompts: Sequence[str], schema: Any,
                   contexts: Sequence[str] | None = None, max_repair_attempts: int = 1,
                   validator: Callable[[Any, int], Any] | None = None, *,
                   name: str | None = None, refuse_short_budget: bool = False,
                   keyed_by_content: bool = False, max_calls: int | None = None,
                   droste: bool = False) -> dict[str, Any]:
    """Run one prompt per call, each returning a bare JSON value; droste's return shape.

    ``refuse_short_budget=True`` refuses before spending when the calls owed exceed what remains
    (droste spends and reports ``budget_exhausted``); ``keyed_by_content=True`` names an unnamed
    call by its whole content, so a changed validator opens new evidence and the old stays owed;
    ``max_calls=0`` answers only from what is accepted; ``droste=True`` judges as droste does (its
    schema subset, ``"integer"``, the validator's verdicts), in a batch of its own."""
    check_call(prompts, contexts, max_repair_attempts, validator, name)
    if droste and not isinstance(schema, ItemSchema):  # else the caller compiled it so
        check_droste_schema(schema)
    # once: the run reuses it, and it dumps the values
    item_schema = compile_schema(schema, strict_integers=droste)
    if not prompts:  # droste answers no prompts with an empty result, after checking the schema
        return {"values": [], "errors": [], "attempts": [], "repairs_made": 0}
    tasks = [{"task_id": str(index), "index": index, "prompt": prompt,
              **({} if contexts is None else {"context": contexts[index]})}
             for index, prompt in enumerate(prompts)]
    batch, version = name, None
    if batch is None and keyed_by_content:
        registry = session.validators
        version = None if validator is None else (
            registry.handed_over(validator) or registry.version_of(validator, hand_over=True))
        validator = validator if version is None else version.fn
        content = sha(json.dumps([item_schema.fingerprint,
                                  None if version is None else version.fingerprint.digest]
                                 + (["droste verdicts"] if droste and validator else [])))
        batch = default_batch_name(prompts, contexts, content)
    elif batch is None:
        batch = default_batch_name(prompts, contexts)
    result = session.run(RunSpec(
        name=batch, tasks=tasks, schema=item_schema, validator=validator,
        identity=("task_id",), repairs=max_repair_attempts, on_exhausted="return",
        mode="value", validator_args="droste" if droste else "index",
        refuse_short_budget=refuse_short_budget, max_calls=max_calls,
        progress=False))  # quiet: a host may feed what the cell prints to a model
    return _droste_shape(result, tasks, item_schema)


def check_call(prompts: Any, contexts: Any, max_repair_attempts: Any, validator: Any,
               name: Any = None) -> None:
    """The droste contract's own inputs, refused in droste's wording where it has one."""
    check_text("batch name", name, "name='labels'")
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise InvalidBatch("prompts must be a list of strings")
    _check_texts("prompts", prompts, "prompt must be a string")
    if not is_whole(max_repair_attempts):  # droste's own wording, which its callers match
        raise InvalidBatch(f"max_repair_attempts must be an integer >= 0, got "
                           f"{max_repair_attempts!r}")
    if contexts is not None:
        if isinstance(contexts, str) or not isinstance(contexts, Sequence):
            raise InvalidBatch("contexts must be a list of strings or None")
        if len(contexts) != len(prompts):
            raise InvalidBatch(f"contexts length ({len(contexts)}) must match prompts length "
                               f"({len(prompts)})")
        _check_texts("contexts", contexts, "a context must be a string or None", none=True)
    if validator is not None and not callable(validator):
        raise InvalidBatch(f"validator must be callable (value, index) -> None, got "
                           f"{type(validator).__name__}")


def _check_texts(name: str, texts: Sequence[Any], rule: str, *, none: bool = False) -> None:
    for index, text in enumerate(texts):
        if not isinstance(text, str) and not (none and text is None):
            fix = (f"; decode it first, e.g. {name}[{index}].decode('utf-8')"
                   if isinstance(text, (bytes, bytearray)) else "")
            raise InvalidBatch(f"{name}[{index}]: {rule}, got {type(text).__name__}{fix}")


def _droste_shape(result: BatchResult, tasks: list[dict[str, Any]],
                  item_schema: ItemSchema) -> dict[str, Any]:
    dump = item_schema.dump
    values = [dump(result.values[t["task_id"]]) if t["task_id"] in result.values else None
              for t in tasks]
    attempts = [result.attempts_by_task.get(t["task_id"], 0) for t in tasks]
    errors = []
    for error in result.errors:
        index, kind = int(error["task_id"]), error.get("kind")
        if error["type"] != "provider_error" or not isinstance(kind, str) or not kind:
            kind = _DROSTE_TYPES.get(error["type"], "validation_error")  # else its source's own
        entry = {"index": index, "type": kind, "error": error["message"],
                 "attempts": attempts[index]}
        raw = result.raws.get(str(error.get("request")))  # the result keeps it per request
        if raw is not None and entry["type"] == "validation_error":
            entry["raw"] = raw[:RAW_SHOWN]
        errors.append(entry)
    errors.sort(key=lambda e: e["index"])  # droste reports one per failed index: the last
    return {"values": values, "errors": list({e["index"]: e for e in errors}.values()),
            "attempts": attempts, "repairs_made": result.repairs_made}
