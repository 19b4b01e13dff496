"""The RLM face: droste's ``llm_batch_json`` contract backed by content-keyed evidence.

A cell that defines its validator inline and is re-executed after an error hands batchjson a new
function object each time; the validator's *content* fingerprint and the request's content key
make the re-execution resume the same request instead of orphaning it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import InvalidBatch
from .schema import compile_schema
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
                   name: str | None = None) -> dict[str, Any]:
    """Run one prompt per call, each returning a bare JSON value; droste's return shape."""
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
    result = session._run(
        batch, tasks, item_schema, validator=validator, identity=("task_id",), pack=1,
        instructions=None, repairs=max_repair_attempts, replays=None, split=False,
        max_calls=None, on_exhausted="return", progress=False, mode="value",
        validator_name=None,
        adapt_validator=_index_form, refuse_short_budget=False)

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


def _index_form(fn: Callable[[Any, int], Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    """droste validators take (value, index); acceptance hands (value, task)."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        return fn(value, task["index"])

    return check


def bind(session: Session) -> Callable[..., dict[str, Any]]:
    """The ``llm_batch_json`` an RLM host injects into its REPL namespace."""
    def bound(prompts: Sequence[str], schema: Any, contexts: Sequence[str] | None = None,
              max_repair_attempts: int = 1, validator: Callable[[Any, int], Any] | None = None,
              *, name: str | None = None) -> dict[str, Any]:
        return llm_batch_json(session, prompts, schema, contexts, max_repair_attempts,
                              validator, name=name)

    bound.__name__ = "llm_batch_json"
    bound.__doc__ = llm_batch_json.__doc__
    return bound


def namespace(session: Session) -> dict[str, Any]:
    """Names an RLM host puts in a cell's globals: the helper, the session and its evidence."""
    return {"llm_batch_json": bind(session), "batch_session": session,
            "run_batch": session.run_batch, "validator": session.validators.define}
