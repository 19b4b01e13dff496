"""What one run of one batch revision is asked to do, its prompts and calls, and what it reports
back."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .._content.keys import Keys
from .._content.schema import ItemSchema, largest_answer, wire_schema
from .._content.tasks import (
    Request,
    TextSpool,
    render_items_prompt,
    render_value_prompt,
    sha,
    shared_head,
)
from .._providers.base import Call, CallKind, input_bound
from .budget import Pricing

_ECHO = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps's text, its encoder made once


@dataclass
class Plan:
    """Everything fixed for one run of one batch revision."""

    batch_id: int
    revision_id: int
    mode: str
    identity: tuple[str, ...]
    schema: ItemSchema
    validator: Callable[[Any, Mapping[str, Any]], Any] | None
    instructions: str | None
    keys: Keys
    repairs: int
    replays: int
    split: bool
    max_split_depth: int = 4
    reask_refusals: bool = False  # a refused return is asked again (within the replays)
    source: str | None = None  # the provider's answer source, written on every receipt
    accept: str = "whole"  # "items": a return may be committed in part (Settle.settle)

    @cached_property
    def _item_chars(self) -> int | None:
        """The most characters one answer takes (None: unbounded), its identity fields left out."""
        schema = self.schema.json_schema
        if self.mode != "value" and isinstance(schema.get("properties"), Mapping):
            schema = {**schema, "properties": {k: v for k, v in schema["properties"].items()
                                               if k not in self.identity}}
        return largest_answer(schema, declared=True)

    @cached_property
    def schema_shape(self) -> str:
        """What its calls' schemas share apart from each call's values (``Call.schema_shape``):
        the schema as written (the order a model writes its fields in), the mode, the identity."""
        return sha(f"{self.mode}\0{json.dumps(list(self.identity))}\0{self.schema._text}")

    def answer_chars(self, tasks: Sequence[Mapping[str, Any]]) -> int | None:
        """The most characters a return to ``tasks`` can take (None: unbounded)."""
        item = self._item_chars
        if item is None or self.mode == "value":
            return item
        echoed = sum(len(_ECHO(task[name])) for task in tasks for name in self.identity)
        return self._answer_chars(item, len(tasks), echoed)

    def most_answer_chars(self, count: int, tasks_chars: int) -> int | None:
        """At least :meth:`answer_chars` of ``count`` tasks whose JSON text has ``tasks_chars``
        (nothing decoded): an identity value is a scalar, echoed as its canonical text, which is
        part of that text."""
        item = self._item_chars
        if item is None or self.mode == "value":
            return item
        return self._answer_chars(item, count, tasks_chars)

    def _answer_chars(self, item: int, count: int, echoed: int) -> int:
        """``count`` answers of ``item`` characters, their identity values ``echoed`` characters."""
        named = sum(len(name) + 4 for name in self.identity)  # "name": and a comma, quoted
        return len('{"items":[]}') + count * (item + 1 + named) + echoed


@dataclass
class Transport:
    """How provider failures are retried, and how long a refusing rate limit is waited on."""

    retries: int = 3
    timeout: float = 120.0
    backoff_initial: float = 0.5
    backoff_max: float = 20.0
    max_rate_wait: float = 60.0


@dataclass
class Outcome:
    """Counters and per-task errors of one run; the values themselves live in the ledger."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = 0.0
    accepted_returns: int = 0
    rejected_returns: int = 0
    provider_errors: int = 0
    partial_returns: int = 0  # returns committed in part, their failing items asked again
    repairs_made: int = 0
    taken_from_ledger: int = 0  # requests another runner resolved while this run waited
    stopped: str | None = None  # why the run stopped opening calls early, if it did
    overrun: float = 0.0  # USD this run's calls billed beyond their cost-budget reservations
    odd_usage: int = 0  # returns whose usage no call can have, recorded as unknown
    # each call's task ids as JSON, spooled to disk (kept in memory when it has no room)
    calls_log: TextSpool = field(default_factory=lambda: TextSpool(keep_when_full=True))
    errors: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # requests a batch job holds as JSON ({"request", "where", "task_ids"}), spooled likewise
    pending: TextSpool = field(default_factory=lambda: TextSpool(keep_when_full=True))
    pending_tasks: int = 0
    # valid answers thrown away with a return rejected for its other items (accept="items" would
    # keep them): how many times, their tasks, their share of its cost (None: unknown) and tokens
    thrown_away: int = 0
    thrown_tasks: set[str] = field(default_factory=set)
    thrown_cost: float | None = 0.0
    thrown_tokens: float = 0.0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def tally(self) -> dict[str, Any]:
        """What it counts of the calls it settles (not their tasks' errors), to be put back with
        :meth:`restore` when another runner recorded those calls first: each call once."""
        return {name: getattr(self, name) for name in _TALLIED} | {
            "thrown_tasks": set(self.thrown_tasks)}

    def restore(self, tally: Mapping[str, Any]) -> None:
        for name, value in tally.items():
            setattr(self, name, value)


_TALLIED = ("calls", "input_tokens", "output_tokens", "cost", "accepted_returns",
            "rejected_returns", "provider_errors", "partial_returns", "odd_usage", "thrown_away",
            "thrown_cost", "thrown_tokens")


def system_prompt(plan: Plan) -> str:
    """Built once per run: the answer schema, and the envelope every return must use."""
    answer = json.dumps(plan.schema.json_schema, sort_keys=True)
    if plan.mode == "value":
        return ("Respond with only a JSON value, no markdown or explanation, matching this JSON "
                f"Schema: {answer}")
    return ('Respond with only JSON, no markdown or explanation: {"items": [...]} with exactly '
            "one object per task. Each object copies the task's identity fields ("
            f"{', '.join(plan.identity)}) unchanged and answers with fields matching this JSON "
            f"Schema: {answer}")


def first_prompt(plan: Plan, request: Request) -> str:
    """The prompt of a request's first call (and of its exact replays)."""
    if plan.mode == "value":
        return render_value_prompt(request.tasks[0])
    return render_items_prompt(request.tasks, plan.identity, plan.instructions,
                               request.tasks_json)


def make_call(plan: Plan, system: str, request: Request, kind: CallKind, prompt: str,
              number: int, cached_prefix: bool = False) -> Call:
    """``cached_prefix``: the shared prefix is long enough to cache, so the wire schema is the
    batch's constant one (docs/providers.md); the provider gets its own copy of the tasks."""
    tasks = request.fresh_tasks()
    shared, shape = "", plan.schema_shape
    if plan.mode == "value":
        schema: Mapping[str, Any] = plan.schema.json_schema
    else:
        schema = wire_schema(plan.schema, tasks, plan.identity, pinned=not cached_prefix)
        shared = shared_head(plan.instructions)
        if cached_prefix:  # typed identity fields follow the tasks' JSON types: none shared
            shape = ""
    return Call(tasks=tasks, prompt=prompt, system=system, schema=schema, attempt=number,
                kind=kind, request_key=request.key, mode=plan.mode, identity=plan.identity,
                shared=shared if prompt.startswith(shared) else "",
                answer_chars=plan.answer_chars(tasks), schema_shape=shape)


def cheapest_call(plan: Plan, provider: Any, pricing: Pricing,
                  requests: Sequence[Request]) -> Callable[[float], float | None]:
    """For ``Spender.refuse_if_short``: the worst case of the first pending call that fits what the
    cost budget has left, else the least worst case of all, which no call beats."""
    def cheapest(left: float) -> float | None:
        system, least = system_prompt(plan), None
        for request in requests:
            call = make_call(plan, system, request, "initial", first_prompt(plan, request), 0)
            worst = pricing.worst_case(input_bound(provider, call))
            if worst <= left:
                return worst
            least = worst if least is None else min(least, worst)
        return least

    return cheapest
