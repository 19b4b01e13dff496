"""A deterministic offline model with injectable faults, so the safety machinery can be shown.

Without an ``answer`` function it answers every schema batchjson accepts: each item (or bare
value) is made by the seeded generator of :mod:`batchjson.testing._values` from the call's
own wire schema, with the identity fields copied from the task, so the same task gets the same
answer in every process and a batch of any schema can resolve offline.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._canon import canonical_json
from .._checks import seconds
from .._content.tasks import sha
from .._errors import ProviderError, ProviderSetupError
from .._providers.base import Call, OneService, Reply, estimate_tokens
from .._providers.select import OFFERED
from .._secrets import check_name
from .._sources import Code, Digest
from ._values import Generator, Unanswerable

GENERATOR = "schemagen-2"  # part of the simulated model's answer source: a new one re-asks
TRANSPORT_FAULTS = ("provider_error", "timeout")
OUTPUT_FAULTS = ("malformed_json", "identity_swap", "missing_item", "duplicate_item",
                 "extra_item", "wrong_type", "non_finite")
FAULTS = TRANSPORT_FAULTS + OUTPUT_FAULTS


@dataclass(frozen=True)
class FaultPlan:
    """Per-call fault probabilities, plus scripted faults by attempt number.

    Draws are seeded by (seed, request key, attempt), so the same run is reproduced exactly and a
    later attempt of a failing request draws afresh: replays can succeed. ``script`` maps an
    attempt number (0 = first call of a request) to fault names applied on that attempt;
    ``clean_after`` makes every attempt from that number on fault-free, so a plan can guarantee
    convergence.
    """

    malformed_json: float = 0.0
    identity_swap: float = 0.0
    missing_item: float = 0.0
    duplicate_item: float = 0.0
    extra_item: float = 0.0
    wrong_type: float = 0.0
    non_finite: float = 0.0
    provider_error: float = 0.0
    timeout: float = 0.0
    script: Mapping[int, str | Sequence[str]] = field(default_factory=dict)
    clean_after: int | None = None
    # Per *item*, not per call: each item's answer has the wrong type with this probability,
    # so a bigger pack is rejected more often (the fault pack-size advice is about).
    item_wrong_type: float = 0.0

    def __post_init__(self) -> None:
        for name in (*FAULTS, "item_wrong_type"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ProviderSetupError(f"FaultPlan.{name} must be a probability in [0, 1], "
                                         f"got {rate}")
        for attempt, names in self.script.items():
            for name in [names] if isinstance(names, str) else names:
                if name not in FAULTS:
                    raise ProviderSetupError(f"FaultPlan.script[{attempt}] names unknown fault "
                                       f"{name!r}; choose from {', '.join(FAULTS)}")

    @classmethod
    def uniform(cls, rate: float, **overrides: Any) -> FaultPlan:
        """Every output fault at the same rate."""
        return cls(**{name: rate for name in OUTPUT_FAULTS}, **overrides)

    def content(self) -> dict[str, Any]:
        """Every rate and scripted fault, as plain data (for the answer source)."""
        out: dict[str, Any] = {name: float(getattr(self, name)) for name in FAULTS}
        out["script"] = {str(attempt): [names] if isinstance(names, str) else list(names)
                         for attempt, names in sorted(self.script.items())}
        out["clean_after"] = self.clean_after
        return out

    def draw(self, seed: int, call: Call) -> list[str]:
        if self.clean_after is not None and call.attempt >= self.clean_after:
            return []
        scripted = self.script.get(call.attempt, ())
        chosen = [scripted] if isinstance(scripted, str) else list(scripted)
        rng = random.Random(int(sha(f"{seed}:{call.request_key}:{call.attempt}")[:16], 16))
        for name in FAULTS:
            if rng.random() < getattr(self, name) and name not in chosen:
                chosen.append(name)
        return chosen


class SimulatedModel(OneService):
    """``answer(task)`` gives the correct answer fields (default: schema-valid values made from
    the call's schema and the seed); faults corrupt the wire text."""

    name = "simulated"

    def __init__(
        self,
        answer: Callable[[Mapping[str, Any]], Any] | None = None,
        faults: FaultPlan | None = None,
        seed: int = 0,
        latency: float = 0.0,
        *,
        model: str = "simulated-1",
        price_per_million: tuple[float, float] | None = None,
    ) -> None:
        self.answer = answer  # None: generated from each call's schema
        self.faults = faults or FaultPlan()
        self.seed = seed
        self.latency = seconds("SimulatedModel latency", latency, ProviderSetupError)
        self.model = check_name(model, "SimulatedModel model",
                                "name the simulated model in plain words")
        self.price_per_million = price_per_million
        self.calls = 0
        self._code = None if answer is None else Code(answer, owner="SimulatedModel")

    def __repr__(self) -> str:
        answer = ("generated from the schema" if self.answer is None else
                  getattr(self.answer, "__qualname__", type(self.answer).__name__))
        rates = ", ".join(f"{k}={v:g}" for k, v in self.faults.content().items()
                          if isinstance(v, float) and v)
        return (f"SimulatedModel(model={self.model!r}, answer={answer}, seed={self.seed!r}"
                + (f", faults: {rates}" if rates else "") + ")")

    def source_key(self) -> tuple[Any, ...]:
        """What decides this model's answers: its answer function by content (or the version
        of the generator), its seed and its fault plan (never its call counter, latency or
        prices)."""
        answer = f"generated:{GENERATOR}" if self._code is None else self._code
        return (f"simulated:{self.model}#answer=", answer, f",seed={self.seed!r},faults=",
                Digest(self.faults.content()))

    def check_answerable(self, schema: Mapping[str, Any], mode: str, task: Mapping[str, Any],
                         identity: Sequence[str], *, verify: bool = True) -> Any:
        """The answer this model gives ``task`` under a call's ``schema``, checked against that
        schema (unless ``verify=False``: the caller judges it); a keyword the generator cannot
        satisfy is refused, by name, before any call."""
        try:
            return self._answer(schema, mode, task, identity, verify=verify)
        except Unanswerable as exc:
            raise ProviderSetupError(
                f"the simulated model cannot answer this schema: {exc}. Simplify that part of "
                "the schema, or give the answers yourself: SimulatedModel(answer=lambda task: "
                "{...})") from None

    def _answer(self, schema: Mapping[str, Any], mode: str, task: Mapping[str, Any],
                identity: Sequence[str], *, verify: bool = False) -> Any:
        if self.answer is not None:
            value = self.answer(task)
            return value if mode == "value" else {**{k: task[k] for k in identity}, **value}
        seed = f"{self.seed}:{canonical_json(task)}"  # the same task, the same answer
        if mode == "value":
            return answer_value(schema, seed, verify=verify)
        return answer_item(schema, task, identity, seed, verify=verify)

    def price_for_budget(self) -> Any:
        """The simulated price as a Price, for cost budgets; None when it has none."""
        if self.price_per_million is None:
            return None
        from .._providers.pricing import Price

        return Price(*self.price_per_million)

    async def complete(self, call: Call) -> Reply:
        self.calls += 1
        faults = self.faults.draw(self.seed, call)
        if self.latency:
            await asyncio.sleep(self.latency)
        if "timeout" in faults:
            raise ProviderError("simulated timeout: the model did not answer in time",
                                retryable=True)
        if "provider_error" in faults:
            raise ProviderError("simulated provider error (HTTP 503)", status=503, retryable=True)
        text = self.render(call, faults)
        return self.reply(call, text)

    def reply(self, call: Call, text: str) -> Reply:
        inp = estimate_tokens(call.system + call.prompt)
        out = estimate_tokens(text)
        cost = 0.0
        if self.price_per_million is not None:
            cost = (inp * self.price_per_million[0] + out * self.price_per_million[1]) / 1e6
        return Reply(text=text, input_tokens=inp, output_tokens=out, cost=cost, model=self.model)

    def _item_faults(self, items: list[dict], call: Call) -> None:
        for item in items:
            if _item_fault_draw(self.faults, self.seed, call, str(item.get("task_id"))):
                answer_fields = [k for k in item if k not in call.identity]
                if answer_fields:
                    item[answer_fields[0]] = _wrong_type(item[answer_fields[0]])

    def render(self, call: Call, faults: Sequence[str]) -> str:
        """The text a model with these faults would have returned for this call."""
        if call.mode == "value":
            value = self._answer(call.schema, "value", call.tasks[0], call.identity)
            if "wrong_type" in faults:
                value = _wrong_type(value)
            payload: Any = value
        else:
            items = [self._answer(call.schema, "items", t, call.identity) for t in call.tasks]
            self._item_faults(items, call)
            items = _corrupt_items(items, call, faults, self.seed)
            payload = {"items": items}
        text = json.dumps(payload, ensure_ascii=False)
        if "non_finite" in faults:
            text = _inject_nan(text)
        if "malformed_json" in faults:
            text = text[: max(1, len(text) // 2)]
        return text


def _item_fault_draw(plan: FaultPlan, seed: int, call: Call, task_id: str) -> bool:
    if not plan.item_wrong_type or (plan.clean_after is not None
                                    and call.attempt >= plan.clean_after):
        return False
    rng = random.Random(int(sha(f"item:{seed}:{call.request_key}:{call.attempt}:{task_id}")[:16],
                            16))
    return rng.random() < plan.item_wrong_type


def _corrupt_items(items: list[dict], call: Call, faults: Sequence[str], seed: int) -> list[dict]:
    rng = random.Random(int(sha(f"items:{seed}:{call.request_key}:{call.attempt}")[:16], 16))
    victim = rng.randrange(len(items))
    if "identity_swap" in faults:
        _swap_identity(items, victim, call.identity)
    if "wrong_type" in faults:
        answer_fields = [k for k in items[victim] if k not in call.identity]
        if answer_fields:
            key = answer_fields[0]
            items[victim][key] = _wrong_type(items[victim][key])
    if "duplicate_item" in faults:
        items.append(dict(items[victim]))
    if "extra_item" in faults:
        items.append({**items[victim], "task_id": f"{items[victim]['task_id']}-extra"})
    if "missing_item" in faults:
        del items[victim]
    return items


def _swap_identity(items: list[dict], victim: int, identity: Sequence[str]) -> None:
    """Copy a neighbour's value into one identity field, preferring a non-task_id field."""
    fields = [f for f in identity if f != "task_id"] + ["task_id"]
    for offset in range(1, len(items)):
        neighbour = items[(victim + offset) % len(items)]
        for name in fields:
            if neighbour[name] != items[victim][name]:
                items[victim][name] = neighbour[name]
                return
    items[victim]["task_id"] = f"{items[victim]['task_id']}-swapped"


def _wrong_type(value: Any) -> Any:
    if isinstance(value, dict) and value:
        key = next(iter(value))
        return {**value, key: _wrong_type(value[key])}
    if isinstance(value, str):
        return 12345
    return "not-the-right-type"


def _inject_nan(text: str) -> str:
    if text.endswith("}]}"):
        return text[:-3] + ', "score": NaN}]}'
    if text.endswith("}"):
        return text[:-1] + (', "score": NaN}' if text != "{}" else '"score": NaN}')
    return "NaN"


# -- what the simulated model answers ----------------------------------------------------------
def item_schema_of(wire: Mapping[str, Any]) -> Any:
    """The item schema inside a call's wire schema (``{"items": [item, ...]}``), or None."""
    items = (wire.get("properties") or {}).get("items") if isinstance(wire, Mapping) else None
    item = items.get("items") if isinstance(items, Mapping) else None
    return item if isinstance(item, Mapping) and item else None


def answer_item(wire: Mapping[str, Any], task: Mapping[str, Any], identity: Sequence[str],
                seed: str, *, verify: bool = False) -> dict[str, Any]:
    """One item answering ``task`` under a call's wire schema: the identity fields copied from
    the task, every other field generated (only the identity fields when the call carries no
    item schema), and each other task field the schema declares whose value fits it, as a
    model echoing the task would (under the default identity an echoed field is compared, so
    it must be the task's own)."""
    fixed = {k: task[k] for k in identity if k in task}
    node = item_schema_of(wire)
    if node is None:
        return dict(fixed)
    made = Generator(wire, seed)
    flat = made.flat(node, "$")
    props = flat.get("properties") if isinstance(flat.get("properties"), Mapping) else {}
    for name, value in task.items():
        if (name in props and name not in fixed and name not in ("prompt", "context")
                and made.fits(props[name], value)):
            fixed[name] = value
    return made.value(node, fixed=fixed, verify=verify)


def answer_value(schema: Mapping[str, Any], seed: str, *, verify: bool = False) -> Any:
    """A bare value of ``schema`` (value mode); ``{}`` when the call carries no schema."""
    return Generator(schema, seed).value(verify=verify) if schema else {}


OFFERED["simulated"] = lambda model: SimulatedModel(model=model) if model else SimulatedModel()
