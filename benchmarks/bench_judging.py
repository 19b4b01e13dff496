"""Judging a 2,000-item return when some numbers are judged as written (exact decimals).

A number a float does not hold as written (``0.12345678901234567891``) is judged again exactly
where a schema decides on it; a return without one pays only a length check per number.
Baseline: the same return with 2-decimal numbers, judged in the same run. Targets (CPU time,
best of 25): one long number in 100 items <= 1.5x the baseline, one in every item <= 3.5x
(each such item is validated twice: as read, and as written).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

from _common import ci_or
from pydantic import BaseModel, Field

from batchjson._acceptance.judge import judge
from batchjson._content.schema import compile_schema
from batchjson._providers.reply import Reply, received

N = 2000
TASKS = [{"task_id": f"t{i}", "case_id": f"c{i % 50}", "prompt": "p"} for i in range(N)]
SCHEMA = {"type": "object", "required": ["label", "score", "count"], "properties": {
    "label": {"enum": ["pos", "neg", "mixed"]},
    "score": {"type": "number", "minimum": 0, "maximum": 1},
    "count": {"type": "integer", "minimum": 0}}}


class Review(BaseModel):
    label: str
    score: float = Field(ge=0, le=1)
    count: int = Field(ge=0)


def return_text(long_every: int = 0) -> str:
    rng = random.Random(1)
    items = []
    for i, task in enumerate(TASKS):
        score = "0.12345678901234567891" if long_every and i % long_every == 0 else (
            f"{rng.random():.2f}")
        items.append(f'{{"task_id": "{task["task_id"]}", "case_id": "{task["case_id"]}", '
                     f'"label": "pos", "score": {score}, "count": {i}}}')
    return '{"items": [' + ", ".join(items) + "]}"


def best_cpu(schema: Any, text: str) -> float:
    compiled, times, loop = compile_schema(schema), [], asyncio.new_event_loop()
    for _ in range(ci_or(25, 7)):  # the judge a return goes through, on a loop made once
        start = time.process_time()
        verdict = loop.run_until_complete(judge(
            received(Reply(text=text)), TASKS, mode="items", identity=("task_id",),
            schema=compiled, validator=None))
        times.append(time.process_time() - start)
    loop.close()
    assert verdict.accepted, verdict.errors[:2]
    return min(times)


def main() -> int:
    ok = True
    for name, schema in (("JSON Schema", SCHEMA), ("pydantic", Review)):
        base = best_cpu(schema, return_text())
        for label, every, target in (("1 in 100 long", 100, 1.5), ("every one long", 1, 3.5)):
            ratio = best_cpu(schema, return_text(every)) / base
            ok &= ratio <= target
            print(f"{name:12} {label:15} {ratio:4.2f}x the 2-decimal return "
                  f"({base * 1000:.1f} ms), target <= {target}x")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
