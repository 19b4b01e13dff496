"""Judging a 2,000-item return when some numbers are judged as written (exact decimals).

A number a float does not hold as written (``0.12345678901234567891``) is judged again exactly
where a schema decides on it; a return without one pays only a length check per number.
Baseline: the same return with 2-decimal numbers, judged in the same rounds (each round judges
every return once). Targets (CPU time, best of 25): one long number in 100 items <= 1.5x the
baseline, one in every item <= 3.5x (each such item is validated twice: as read, and as
written); under ``make bench-ci``, best of 9, 1.8x and 4.2x.
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


def best_cpus(schema: Any, texts: list[str]) -> list[float]:
    """The least CPU time judging each of ``texts`` took, over rounds that judge each in turn:
    every text meets the same moments of a loaded machine's noise."""
    compiled, loop = compile_schema(schema), asyncio.new_event_loop()
    times: list[list[float]] = [[] for _ in texts]
    for _ in range(ci_or(25, 9)):  # the judge a return goes through, on a loop made once
        for text, taken in zip(texts, times, strict=True):
            start = time.process_time()
            verdict = loop.run_until_complete(judge(
                received(Reply(text=text)), TASKS, mode="items", identity=("task_id",),
                schema=compiled, validator=None))
            taken.append(time.process_time() - start)
            assert verdict.accepted, verdict.errors[:2]
    loop.close()
    return [min(taken) for taken in times]


# (label, one long number in every ``every`` items, target; under make bench-ci, its margin:
# a judge that scans the whole return for each item reads 4x and more)
CASES = (("1 in 100 long", 100, ci_or(1.5, 1.8)), ("every one long", 1, ci_or(3.5, 4.2)))


def main() -> int:
    ok = True
    for name, schema in (("JSON Schema", SCHEMA), ("pydantic", Review)):
        base, *long = best_cpus(schema, [return_text()] + [return_text(every)
                                                           for _, every, _ in CASES])
        for (label, _, target), taken in zip(CASES, long, strict=True):
            ratio = taken / base
            ok &= ratio <= target
            print(f"{name:12} {label:15} {ratio:4.2f}x the 2-decimal return "
                  f"({base * 1000:.1f} ms), target <= {target}x")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
