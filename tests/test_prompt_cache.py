"""Prompt caching: a batch's shared prefix goes first and byte-identical, is marked (Anthropic)
or keyed (OpenAI) for the provider's cache when long enough, cache reads and writes are priced
from the table, and a batch-constant schema never weakens the identity checks."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from batchjson import Call, FaultPlan, Reply, Session, SimulatedModel
from batchjson._content.schema import compile_schema, wire_schema
from batchjson._content.tasks import render_items_prompt, shared_head
from batchjson._providers.base import cache_minimum
from batchjson._providers.pricing import price_for
from batchjson._session.advice import Fit, estimate
from batchjson.testing import LoopbackServer
from tests.helpers import (
    IDENTITY,
    ITEM_SCHEMA,
    LABEL_SCHEMA,
    TASKS,
    anthropic,
    openai,
    review_tasks,
)

LONG = "Judge each candidate against the gold pair's record, field by field. " * 120  # ~2k tok
SHORT = "Judge each candidate."


def recording(provider: Any) -> list[dict[str, Any]]:
    """Every request body the provider sends."""
    bodies: list[dict[str, Any]] = []
    send = provider._post

    async def post(body: dict[str, Any]) -> Any:
        bodies.append(copy.deepcopy(body))
        return await send(body)

    provider._post = post
    return bodies


def run(provider: Any, instructions: str, n: int = 8, repairs: int = 1, **kw: Any) -> Any:
    session = Session(provider, ledger=":memory:", concurrency=1, repairs=repairs, replays=0)
    return session, session.run_batch("cached", review_tasks(n), LABEL_SCHEMA, pack=2,
                                      instructions=instructions, **kw)


def test_anthropic_marks_a_long_shared_prefix_and_sends_it_byte_identical() -> None:
    with LoopbackServer() as srv:
        provider = anthropic(srv, model="claude-sonnet-4-5", max_tokens=400)
        bodies = recording(provider)
        session, result = run(provider, LONG)
    assert result.status == "resolved" and len(bodies) == 4
    shared = bodies[0]["messages"][0]["content"][0]
    assert shared == {"type": "text", "text": LONG.strip() + "\n\n",
                      "cache_control": {"type": "ephemeral"}}
    for body in bodies:  # tools, system and the marked block: the same bytes in every request
        assert json.dumps(body["tools"]) == json.dumps(bodies[0]["tools"])
        assert body["system"] == bodies[0]["system"]
        assert body["messages"][0]["content"][0] == shared
    receipts = session.ledger.attempts("cached")
    assert [r.cached_tokens for r in receipts][1:] == [r.cached_tokens for r in receipts][1:2] * 3
    assert all((r.cached_tokens or 0) > 1024 for r in receipts[1:])  # read after the first


def test_a_short_prefix_keeps_identity_pinning_and_marks_nothing() -> None:
    with LoopbackServer() as srv:
        provider = anthropic(srv, model="claude-sonnet-4-5", max_tokens=400)
        bodies = recording(provider)
        _, result = run(provider, SHORT, n=4)
    assert result.status == "resolved"
    assert "cache_control" not in json.dumps(bodies)
    schemas = [b["tools"][0]["input_schema"]["properties"]["items"]["items"]["properties"]
               for b in bodies]
    assert all("enum" in s["task_id"] for s in schemas)  # each request's own ids, pinned
    assert schemas[0]["task_id"] != schemas[1]["task_id"]


def test_openai_sends_a_stable_prompt_cache_key_and_a_batch_constant_schema() -> None:
    with LoopbackServer() as srv:
        provider = openai(srv, extra_body={"max_completion_tokens": 400})
        bodies = recording(provider)
        session, result = run(provider, LONG)
    assert result.status == "resolved"
    keys = {b["prompt_cache_key"] for b in bodies}
    assert len(keys) == 1 and next(iter(keys)).startswith("batchjson-")
    assert len({json.dumps(b["response_format"]) for b in bodies}) == 1
    first = bodies[0]["messages"]
    assert all(b["messages"][0] == first[0] for b in bodies)  # the system message
    assert all(b["messages"][1]["content"].startswith(LONG.strip() + "\n\n") for b in bodies)
    cached = [r.cached_tokens for r in session.ledger.attempts("cached")]
    assert cached[0] == 0 and all(c >= 1024 for c in cached[1:])


def test_a_short_prefix_sends_no_prompt_cache_key_nor_does_a_user_who_says_none() -> None:
    with LoopbackServer() as srv:
        provider = openai(srv)
        bodies = recording(provider)
        run(provider, SHORT, n=2)
        refusing = openai(srv, extra_body={"prompt_cache_key": None})
        refused_bodies = recording(refusing)
        run(refusing, LONG, n=2)
    assert "prompt_cache_key" not in bodies[0]
    assert "prompt_cache_key" not in refused_bodies[0]


def test_a_batch_constant_schema_still_rejects_a_swapped_identity() -> None:
    with LoopbackServer(SimulatedModel(faults=FaultPlan(identity_swap=1.0))) as srv:
        provider = openai(srv, extra_body={"max_completion_tokens": 400})
        bodies = recording(provider)
        _, result = run(provider, LONG, n=4, repairs=0, on_exhausted="return")
    wire = bodies[0]["response_format"]["json_schema"]["schema"]
    assert wire["properties"]["items"]["items"]["properties"]["task_id"] == {"type": "string"}
    assert not result.values
    assert result.errors and {e["type"] for e in result.errors} <= {"identity", "coverage"}


def test_cache_reads_and_writes_are_priced_from_the_table() -> None:
    instructions = LONG * 2  # past Haiku 4.5's 4,096-token minimum
    call = Call(tasks=tuple(TASKS), prompt=render_items_prompt(TASKS, IDENTITY, instructions),
                system="Be exact.", schema=wire_schema(compile_schema(ITEM_SCHEMA), TASKS,
                                                       IDENTITY, pinned=False),
                attempt=0, kind="initial", request_key="rk", identity=IDENTITY,
                shared=shared_head(instructions))

    async def twice() -> list[Reply]:
        async with LoopbackServer() as srv:
            provider = anthropic(srv, model="claude-haiku-4-5", max_tokens=400)
            try:
                return [await provider.complete(call) for _ in range(2)]
            finally:
                await provider.aclose()

    write, read = asyncio.run(twice())
    written = write.extra["cache_creation_input_tokens"]
    assert written > 4096 and read.cached_tokens == written
    price = price_for("claude-haiku-4-5")
    plain = write.input_tokens - written
    assert write.cost == pytest.approx((plain * price.input + written * price.cache_write
                                        + write.output_tokens * price.output) / 1e6)
    assert read.cost == pytest.approx(((read.input_tokens - written) * price.input
                                       + written * price.cached_input
                                       + read.output_tokens * price.output) / 1e6)
    assert price.cache_write == 1.25 * price.input and price.cached_input == 0.1 * price.input


def test_the_cache_minimum_follows_the_model_and_is_largest_for_unknown_models() -> None:
    with LoopbackServer() as srv:
        assert cache_minimum(anthropic(srv, model="claude-sonnet-4-5-20250929")) == 1024
        assert cache_minimum(anthropic(srv, model="claude-haiku-4-5")) == 4096
        assert cache_minimum(anthropic(srv, model="claude-3-5-haiku-latest")) == 2048
        assert cache_minimum(anthropic(srv, model="claude-next-9")) == 4096
        assert cache_minimum(openai(srv)) == 1024
    assert cache_minimum(SimulatedModel()) is None


def test_the_pack_size_advice_prices_a_cached_prefix_at_the_cache_read_price() -> None:
    fit = Fit(tasks=100, returns=50, call_fault_rate=0.0, item_fault_rate=0.01,
              provider_error_rate=0.0, shared_input=2000, input_per_task=50,
              shared_output=5, output_per_task=20, repair_extra_input=100,
              input_price=1e-6, output_price=5e-6)
    cached = Fit(**{**fit.__dict__, "cached_input": 2000, "cached_price": 1e-7})
    plain, read = (estimate(f, 1, repairs=1, replays=1) for f in (fit, cached))
    assert read.cost == pytest.approx(plain.cost - read.calls * 2000 * 9e-7)
    assert read.per_usable < plain.per_usable
