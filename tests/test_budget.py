"""Budgets hold under concurrency: worst case reserved before a call, settled with real usage;
a cost budget without a price is refused before spending; bad budgets are refused."""

from __future__ import annotations

import math

import pytest

from batchjson import Budget, CallableProvider, InvalidBatch, Session
from batchjson._errors import ConfigError
from batchjson._providers.base import Reply
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

    def respond(call):
        return items_reply(call)

    model = ConcurrentModel(respond, delay=0.005)

    async def priced(call):
        text = await model(call)
        inp, out = len(call.system + call.prompt) // 4, 300  # a long answer, under the cap
        return Reply(text, input_tokens=inp, output_tokens=out,
                     cost=(inp * price["input"] + out * price["output"]) / 1e6)

    budget = 0.04
    session = Session(CallableProvider(priced, price=price, max_tokens=1000),
                      budget=Budget(cost=budget), concurrency=16)
    result = session.run_batch("r", review_tasks(200), LABEL_SCHEMA, on_exhausted="return")
    receipts = session.ledger.attempts("r")
    spent = sum(r.cost for r in receipts)
    assert spent <= budget and session.spent_cost <= budget
    assert model.peak > 1  # the calls really overlapped
    assert 0 < len(result.values) < 200  # it spent up to the ceiling, then stopped
    # it stopped only when one more worst-case call could not fit
    worst = max((r.input_tokens * 2.0 + 1000 * 8.0) / 1e6 for r in receipts)
    assert budget - spent < worst
    assert {e["type"] for e in result.errors} == {"budget_exhausted"}


def test_a_nan_cost_is_never_charged_as_nothing():
    def model(call):
        return Reply(items_reply(call), input_tokens=10, output_tokens=10, cost=math.nan)

    session = Session(CallableProvider(model, price={"input": 1000.0, "output": 1000.0},
                                       max_tokens=100), budget=Budget(cost=1.0), concurrency=1)
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    # the provider's NaN is read as "unknown" (never as a number that poisons the spend); the
    # budget then charges the reported usage at the model's price: 3 x (10 + 10) x $1000/M
    assert math.isfinite(session.spent_cost)
    assert session.spent_cost == pytest.approx(0.06)
    assert [r.cost for r in session.ledger.attempts("r")] == [None, None, None]
