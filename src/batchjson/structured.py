"""droste's ``llm_batch_json`` contract over a session: one prompt per call, a bare JSON value.

Core, not a face: it knows nothing of hosts. ``Session.llm_batch_json`` and the RLM binding
both call :func:`llm_batch_json`, which builds a :class:`RunSpec` like any other face.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import InvalidBatch
from .schema import compile_schema
from .spec import RunSpec
from .tasks import sha

if TYPE_CHECKING:
    from .session import Session

_DROSTE_TYPES = {
    "json": "validation_error", "schema": "validation_error", "validation": "validation_error",
    "coverage": "validation_error", "identity": "validation_error",
    "validator_error": "validator_error", "provider_error": "provider_error",
    "budget_exhausted": "budget_exhausted", "not_attempted": "budget_exhausted",
    "cancelled": "provider_error",
}


def default_batch_name(prompts: Sequence[str], contexts: Sequence[str] | None) -> str:
    """Same prompts and contexts -> same batch, so a changed validator or schema supersedes."""
    digest = sha(json.dumps([list(prompts), None if contexts is None else list(contexts)]))
    return f"llm_batch_json/{digest[:16]}"


def llm_batch_json(session: Session, prompts: Sequence[str], schema: Any,
                   contexts: Sequence[str] | None = None, max_repair_attempts: int = 1,
                   validator: Callable[[Any, int], Any] | None = None, *,
                   name: str | None = None, refuse_short_budget: bool = False) -> dict[str, Any]:
    """Run one prompt per call, each returning a bare JSON value; droste's return shape.

    droste spends what the budget has and reports the rest as ``budget_exhausted``;
    ``refuse_short_budget=True`` (the RLM binding's budget gate) instead refuses before spending
    when the calls still owed for these prompts exceed what remains.
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise InvalidBatch("prompts must be a list of strings")
    if (not isinstance(max_repair_attempts, int) or isinstance(max_repair_attempts, bool)
            or max_repair_attempts < 0):
        raise InvalidBatch(f"max_repair_attempts must be an integer >= 0, got "
                           f"{max_repair_attempts!r}")
    if contexts is not None:
        if isinstance(contexts, str) or not isinstance(contexts, Sequence):
            raise InvalidBatch("contexts must be a list of strings or None")
        if len(contexts) != len(prompts):
            raise InvalidBatch(f"contexts length ({len(contexts)}) must match prompts length "
                               f"({len(prompts)})")
    item_schema = compile_schema(schema)  # once: the run reuses it, and it dumps the values
    if not prompts:  # droste answers no prompts with an empty result, after checking the schema
        return {"values": [], "errors": [], "attempts": [], "repairs_made": 0}
    tasks = []
    for index, prompt in enumerate(prompts):
        task: dict[str, Any] = {"task_id": str(index), "index": index, "prompt": prompt}
        if contexts is not None:
            task["context"] = contexts[index]
        tasks.append(task)
    batch = name or default_batch_name(prompts, contexts)
    result = session.run(RunSpec(
        name=batch, tasks=tasks, schema=item_schema, validator=validator,
        identity=("task_id",), repairs=max_repair_attempts, on_exhausted="return",
        mode="value", validator_args="index", refuse_short_budget=refuse_short_budget))

    dump = item_schema.dump
    values = [dump(result.values[t["task_id"]]) if t["task_id"] in result.values else None
              for t in tasks]
    attempts = [result.attempts_by_task.get(t["task_id"], 0) for t in tasks]
    errors = []
    for error in result.errors:
        index = int(error["task_id"])
        entry = {"index": index, "type": _DROSTE_TYPES.get(error["type"], "validation_error"),
                 "error": error["message"], "attempts": attempts[index]}
        if "raw" in error and entry["type"] == "validation_error":
            entry["raw"] = error["raw"]
        errors.append(entry)
    errors.sort(key=lambda e: e["index"])
    return {"values": values, "errors": _one_per_index(errors), "attempts": attempts,
            "repairs_made": result.repairs_made}


def _one_per_index(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """droste reports one error per failed index: keep the last one seen for each."""
    last: dict[int, dict[str, Any]] = {}
    for e in errors:
        last[e["index"]] = e
    return [last[i] for i in sorted(last)]
