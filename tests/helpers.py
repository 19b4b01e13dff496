"""Shared builders for tests: tasks shaped like the seed's review batch."""

from __future__ import annotations

import json
from typing import Any

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
