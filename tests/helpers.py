"""Shared builders for tests: tasks shaped like the seed's review batch, and calls and HTTP
providers pointed at the loopback server."""

from __future__ import annotations

import json
from typing import Any

from batchjson._providers.anthropic import AnthropicProvider
from batchjson._providers.base import Call
from batchjson._providers.openai import OpenAIProvider
from batchjson._schema import compile_schema, wire_schema
from batchjson._tasks import render_items_prompt
from batchjson.testing import LoopbackServer

LABEL_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]}},
    "required": ["verdict"],
}


def review_tasks(n: int = 20, case: str = "gold-pair-078") -> list[dict[str, Any]]:
    """n candidates of one case, identity fields as in the seed's failure record."""
    return [
        {
            "task_id": f"{case}::{case}-candidate-{127 + i}",
            "case_id": case,
            "candidate_id": f"{case}-candidate-{127 + i}",
            "prompt": f"Does candidate {127 + i} match {case}?",
        }
        for i in range(n)
    ]


def answer(task: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": "match" if int(task["candidate_id"].rsplit("-", 1)[1]) % 2 else "no_match"}


def items_reply(call: Any, **overrides: Any) -> str:
    """A correct {"items": [...]} return for a call, with per-task overrides."""
    items = []
    for task in call.tasks:
        item = {k: task[k] for k in call.identity} | answer(task)
        item.update(overrides.get(task["task_id"], {}))
        items.append(item)
    return json.dumps({"items": items})


class ConcurrentModel:
    """An async provider function that records each call's task_ids and the peak number of
    calls in flight at once, answering with ``respond(call)`` after ``delay`` seconds."""

    def __init__(self, respond=None, delay: float = 0.01) -> None:
        self.respond = respond or items_reply
        self.delay = delay
        self.in_flight = 0
        self.peak = 0
        self.sent: list[tuple[str, ...]] = []

    async def __call__(self, call: Any) -> str:
        import asyncio

        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        self.sent.append(tuple(t["task_id"] for t in call.tasks))
        return self.respond(call)


# -- HTTP providers against the loopback server ----------------------------------------

KEY = "sk-test-SECRETVALUE-0123456789abcdef"
IDENTITY = ("task_id", "case_id")
TASKS = [{"task_id": "t1", "case_id": "c1", "prompt": "alpha"},
         {"task_id": "t2", "case_id": "c2", "prompt": "beta"}]
ITEM_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}},
               "required": ["answer"], "additionalProperties": False}
def upper(task: dict[str, Any]) -> dict[str, Any]:
    return {"answer": task["prompt"].upper()}


def items_call(schema: dict | None = None, system: str = "Be exact.") -> Call:
    wire = wire_schema(compile_schema(schema or ITEM_SCHEMA), TASKS, IDENTITY)
    return Call(tasks=tuple(TASKS), prompt=render_items_prompt(TASKS, IDENTITY, "Shout."),
                system=system, schema=wire, attempt=0, kind="answer", request_key="rk",
                identity=IDENTITY)


def openai(srv: LoopbackServer, **kw: Any) -> OpenAIProvider:
    kw.setdefault("api_key", KEY)
    return OpenAIProvider(kw.pop("model", "gpt-4o-mini"), base_url=srv.base_url, **kw)


def anthropic(srv: LoopbackServer, **kw: Any) -> AnthropicProvider:
    kw.setdefault("api_key", KEY)
    return AnthropicProvider(kw.pop("model", "claude-haiku-4-5"),
                             base_url=srv.anthropic_base_url, **kw)
