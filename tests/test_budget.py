"""Budgets hold under concurrency: worst case reserved before a call, settled with real usage;
a cost budget without a price is refused before spending; bad budgets are refused."""

from __future__ import annotations

import asyncio
import json
import math
import re

import pytest

from batchjson import (
    AnthropicProvider,
    Budget,
    BudgetExceeded,
    CallableProvider,
    InvalidBatch,
    OpenAIProvider,
    Session,
)
from batchjson._errors import ConfigError
from batchjson._providers._http import encode_body
from batchjson._providers.anthropic import FORCED_TOOL_SYSTEM_TOKENS
from batchjson._providers.base import Call, Reply, input_bound
from batchjson._replay.budget import pricing_of
from tests.helpers import LABEL_SCHEMA, ConcurrentModel, items_reply, review_tasks


@pytest.mark.parametrize("value", [
    Budget.__new__(Budget), {"calls": 1.5}, {"calls": 2.5}, {"calls": -1}, {"calls": True},
    {"calls": "10"}, {"cost": math.nan}, {"cost": math.inf}, {"cost": -0.01}, {"cost": "1"},
    {"cost": True}, 1.5, "10", {"calls": 10, "price": 1},
])
def test_every_invalid_budget_is_refused_before_anything_runs(value):
    if isinstance(value, Budget):  # the dataclass constructor itself checks too
        with pytest.raises(InvalidBatch, match="whole number"):
            Budget(calls=1.5)
        return
    with pytest.raises(InvalidBatch):
        Session(CallableProvider(items_reply), budget=value)


def test_valid_budgets_are_kept_as_given():
    assert Budget.of({"calls": 0, "cost": 0}) == Budget(calls=0, cost=0.0)
    assert Budget.of(3) == Budget(calls=3) and Budget.of(None) == Budget()
    assert Budget(cost=2).cost == 2.0


def test_a_cost_budget_with_an_unpriced_model_is_refused_before_spending():
    model = ConcurrentModel()
    session = Session(CallableProvider(model, model="my-local-llm"), budget=Budget(cost=1.0))
    with pytest.raises(ConfigError) as raised:
        session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    message = str(raised.value)
    assert "my-local-llm" in message and "set_prices" in message and "prices=" in message
    assert model.sent == [] and session.ledger.batch_names() == []


def test_a_cost_budget_at_concurrency_16_is_never_exceeded():
    price = {"input": 2.0, "output": 8.0}  # USD per million tokens
    bounds = []

    def respond(call):
        bounds.append(input_bound(None, call))
        return items_reply(call)

    model = ConcurrentModel(respond, delay=0.005)

    async def priced(call):
        text = await model(call)
        inp, out = len(call.system + call.prompt) // 4, 300  # a long answer, under the cap
        return Reply(text, input_tokens=inp, output_tokens=out,
                     cost=(inp * price["input"] + out * price["output"]) / 1e6)

    budget = 0.1
    session = Session(CallableProvider(priced, price=price, max_tokens=1000),
                      budget=Budget(cost=budget), concurrency=16)
    result = session.run_batch("r", review_tasks(200), LABEL_SCHEMA, on_exhausted="return")
    receipts = session.ledger.attempts("r")
    spent = sum(r.cost for r in receipts)
    assert spent <= budget and session.spent_cost <= budget
    assert model.peak > 1  # the calls really overlapped
    assert 0 < len(result.values) < 200  # it spent up to the ceiling, then stopped
    # it stopped only when one more worst-case call could not fit
    worst = max((bound * 2.0 + 1000 * 8.0) / 1e6 for bound in bounds)
    assert budget - spent < worst
    assert {e["type"] for e in result.errors} == {"budget_exhausted"}
    assert "may cost up to $" in result.errors[0]["message"]


def test_a_nan_cost_is_never_charged_as_nothing():
    def model(call):
        return Reply(items_reply(call), input_tokens=10, output_tokens=10, cost=math.nan)

    session = Session(CallableProvider(model, price={"input": 1000.0, "output": 1000.0},
                                       max_tokens=100), budget=Budget(cost=10.0), concurrency=1)
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    # the provider's NaN is read as "unknown" (never as a number that poisons the spend); the
    # budget then charges the reported usage at the model's price: 3 x (10 + 10) x $1000/M
    assert math.isfinite(session.spent_cost)
    assert session.spent_cost == pytest.approx(0.06)
    assert [r.cost for r in session.ledger.attempts("r")] == [None, None, None]


# -- a cost budget reserves a sound bound, in any script -------------------------------------
SCRIPTS = {
    "cjk": "日本語の文章を読んで、正しい答えを一つ選んでください。中文的句子也一样。",
    "emoji": "😀🎉🚀🧪🔥✨🌍🍣🎯🧭",
    "mixed": "Résumé: Привет, мир! مرحبا بالعالم 日本語 😀 ok ελληνικά",
}


def non_ascii_biller(price: dict[str, float], cap: int, bounds: list[int]):
    """Bills as a tokenizer does at its worst for these scripts: one token per non-ASCII
    character (len // 4 would count 8 CJK characters as 2 tokens), a token per four ASCII
    characters, and every answer as long as max_tokens allows. ``bounds`` collects the input
    bound batchjson reserved for each call."""
    def tokens(text: str) -> int:
        wide = sum(1 for ch in text if ord(ch) > 127)
        return wide + -(-(len(text) - wide) // 4)

    async def bill(call):
        bounds.append(input_bound(None, call))
        await asyncio.sleep(0.002)
        inp = tokens(call.system) + tokens(call.prompt) + tokens(json.dumps(call.schema))
        return Reply(items_reply(call), input_tokens=inp, output_tokens=cap,
                     cost=(inp * price["input"] + cap * price["output"]) / 1e6)

    return bill


@pytest.mark.parametrize("concurrency", [16, 64])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_cost_budget_holds_for_any_script_at_any_concurrency(script, concurrency):
    price, cap, bounds = {"input": 3.0, "output": 15.0}, 50, []
    tasks = [{**t, "prompt": f"{SCRIPTS[script] * 4} #{i}"}
             for i, t in enumerate(review_tasks(400))]
    provider = CallableProvider(non_ascii_biller(price, cap, bounds), price=price,
                                max_tokens=cap)
    budget = 0.05
    session = Session(provider, budget=Budget(cost=budget), concurrency=concurrency)
    result = session.run_batch("r", tasks, LABEL_SCHEMA, pack=2, on_exhausted="return")
    spent = sum(r.cost for r in session.ledger.attempts("r"))
    assert spent <= budget and session.spent_cost <= budget  # never over, in any script
    # progress: the budget fits several worst-case calls, and at least that many were made
    worst = max(bound * price["input"] + cap * price["output"] for bound in bounds) / 1e6
    fits = int(budget // worst)
    assert fits >= 5 and len(bounds) >= fits and len(result.values) >= 2 * fits
    assert len(result.values) < len(tasks)  # and it stopped at the ceiling
    assert {e["type"] for e in result.errors} == {"budget_exhausted"}


def test_a_budget_too_small_for_one_call_says_what_one_call_may_cost(tmp_path):
    price = {"input": 3.0, "output": 15.0}
    model = ConcurrentModel()
    session = Session(CallableProvider(model, price=price, max_tokens=1000),
                      ledger=tmp_path / "l.sqlite", budget=Budget(cost=0.01))
    with pytest.raises(BudgetExceeded) as raised:
        session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    message = str(raised.value)
    # 1000 output tokens alone are $0.015 at $15/M: more than the whole budget
    assert re.search(r"one call may cost up to \$0\.01[5-9]\d* .* the budget is \$0\.01\b",
                     message), message
    assert "max_tokens=1000" in message and "nothing was spent" in message
    assert "0 remain" not in message
    assert model.sent == [] and session.ledger.batch_names() == []


def test_a_cost_budget_without_an_output_ceiling_is_refused_before_spending():
    model = ConcurrentModel()
    session = Session(CallableProvider(model, price={"input": 1.0, "output": 1.0}),
                      budget=Budget(cost=1.0))
    with pytest.raises(ConfigError, match="output ceiling.*max_tokens=N"):
        session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert model.sent == [] and session.ledger.batch_names() == []


def test_the_http_providers_bound_their_whole_request_body_plus_documented_overhead():
    call = Call(tasks=({"task_id": "t1", "prompt": "日本語"},), prompt="日本語の文章 😀" * 20,
                system="答えてください", schema=LABEL_SCHEMA, attempt=0, kind="initial",
                request_key="k")
    anthropic = AnthropicProvider("claude-haiku-4-5", base_url="http://127.0.0.1:9",
                                  max_tokens=64)
    body = encode_body(anthropic.request_body(call)[0])
    assert anthropic.input_bound(call) == len(body) + FORCED_TOOL_SYSTEM_TOKENS
    assert len(body) >= len((call.system + call.prompt).encode()) + len(json.dumps(LABEL_SCHEMA))
    text = AnthropicProvider("claude-haiku-4-5", base_url="http://127.0.0.1:9", mode="text")
    assert text.input_bound(call) == len(encode_body(text.request_body(call)[0]))
    openai = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1")
    assert openai.input_bound(call) == len(encode_body(openai.request_body(call)[0])) + 9
    assert pricing_of(openai).max_output_tokens is None  # no ceiling unless extra_body sets one
    capped = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1",
                            extra_body={"max_completion_tokens": 300})
    assert pricing_of(capped).max_output_tokens == 300
