"""A cost budget against what providers really do: say nothing of usage, bill more answers or
more output than the call asked for, fail after the model ran. The budget holds for the session
as a whole, and what is not known is never recorded as a known cost."""

from __future__ import annotations

import asyncio
import json
import math
import random
import threading
from typing import Any

import pytest

from batchjson import (
    Budget,
    BudgetExceeded,
    CallableProvider,
    OpenAIProvider,
    Price,
    ProviderSetupError,
    Reply,
    Session,
    SimulatedModel,
)
from batchjson._money import usd
from batchjson._providers.base import input_bound
from batchjson.testing import HttpFaults, LoopbackServer
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

PRICE = {"input": 10.0, "output": 30.0}  # USD per million tokens


def cjk_tasks(n: int) -> list[dict[str, Any]]:
    rnd = random.Random(1)
    return [{**task, "prompt": "".join(chr(rnd.randint(0x4E00, 0x9FFF)) for _ in range(300))}
            for task in review_tasks(n)]


class ByteBiller:
    """Answers with bare text (as most SDK glue does) and keeps the true bill: one token per
    UTF-8 byte sent, and an answer as long as its bytes, up to ``cap``."""

    def __init__(self, cap: int) -> None:
        self.cap, self.billed, self.calls = cap, 0.0, 0
        self.worst = 0.0  # the largest worst case batchjson could have reserved for a call
        self.lock = threading.Lock()

    async def __call__(self, call: Any) -> str:
        sent = call.system + call.prompt + json.dumps(call.schema, ensure_ascii=False)
        self.worst = max(self.worst, (input_bound(None, call) * PRICE["input"]
                                      + self.cap * PRICE["output"]) / 1e6)
        answer = items_reply(call)
        inp, out = len(sent.encode()), min(self.cap, len(answer.encode()))
        await asyncio.sleep(0.002)
        with self.lock:
            self.calls += 1
            self.billed += (inp * PRICE["input"] + out * PRICE["output"]) / 1e6
        return answer


@pytest.mark.parametrize("concurrency", [16, 64])
def test_a_bare_text_reply_keeps_its_worst_case_and_its_cost_is_recorded_as_unknown(
        concurrency: int) -> None:
    """A str says nothing of what the call cost: settling it at a len//4 estimate let CJK
    prompts spend 4-7x the budget. It keeps its worst case instead, and the ledger says its
    cost is unknown (at least its labelled floor), never a known number."""
    biller = ByteBiller(cap=200)
    budget = 0.1
    session = Session(CallableProvider(biller, source="byte-biller", price=PRICE,
                                       max_tokens=200),
                      budget=Budget(cost=budget), concurrency=concurrency)
    result = session.run_batch("b", cjk_tasks(300), LABEL_SCHEMA, on_exhausted="return")
    assert 0 < biller.calls and biller.billed <= budget  # the provider's real bill
    assert session.spent_cost >= biller.billed  # the tally counts worst cases, never less
    fits = int(budget // biller.worst)
    assert fits >= 3 and len(result.values) >= fits  # as many calls as worst cases fit
    receipts = session.ledger.attempts("b")
    assert len(receipts) == biller.calls
    assert all(r.cost is None and r.input_tokens is None and r.output_tokens is None
               for r in receipts)
    spend = session.ledger.spend("b")
    assert spend["unknown_cost_calls"] == biller.calls and not spend["cost"]
    assert spend["cost_lower_bound_unknown"] > 0  # the estimated floor, labelled as such


@pytest.mark.parametrize("extra", [{"n": 8}, {"best_of": 3}, {"n": 2, "temperature": 1}])
def test_extra_body_asking_for_several_answers_per_call_is_refused_before_spending(
        extra: dict[str, Any]) -> None:
    """Every answer is billed and batchjson reads only the first: ``n`` (or ``best_of``)
    multiplies the bill past any reservation."""
    with pytest.raises(ProviderSetupError) as raised:
        OpenAIProvider("m1", base_url="http://127.0.0.1:9/v1", api_key="sk-test",
                       extra_body={"max_completion_tokens": 100, **extra})
    name = next(k for k in extra if k in ("n", "best_of"))
    assert f"extra_body {name}=" in str(raised.value) and "reads only the first" in str(
        raised.value)
    assert OpenAIProvider("m1", base_url="http://127.0.0.1:9/v1",
                          extra_body={"n": 1}).extra_body == {"n": 1}  # one answer is fine


class CeilingIgnoringServer(LoopbackServer):
    """An OpenAI-compatible server that ignores ``max_completion_tokens`` (some read only
    ``max_tokens``) and reports, honestly, ``output_tokens`` of output for every answer."""

    def __init__(self, output_tokens: int, **kwargs: Any) -> None:
        super().__init__(SimulatedModel(), **kwargs)
        self.output_tokens = output_tokens
        self.billed: list[dict[str, int]] = []

    async def _send(self, request: Any, payload: dict[str, Any], fault: Any) -> Any:
        usage = payload["usage"]
        usage["completion_tokens"] = self.output_tokens
        usage["total_tokens"] = usage["prompt_tokens"] + self.output_tokens
        self.billed.append(dict(usage))
        return await super()._send(request, payload, fault)


@pytest.mark.parametrize("budget", [0.05, 0.02])
def test_a_server_billing_past_the_output_ceiling_stops_the_budget_after_one_call(
        budget: float) -> None:
    """At concurrency 16 such a server was billed 16 calls (9.9x a $0.05 budget) before any
    reply came back. The session's first call goes alone, its real usage is charged, and a
    call billed beyond its reservation stops the budget opening any other: the overrun is that
    one call's excess, and the run and the next one say so."""
    price = (1.0, 10.0)
    with CeilingIgnoringServer(output_tokens=3000) as srv:
        provider = OpenAIProvider("m1", base_url=srv.base_url, api_key="sk-test",
                                  prices={"m1": price},
                                  extra_body={"max_completion_tokens": 100})
        session = Session(provider, budget=Budget(cost=budget), concurrency=16)
        result = session.run_batch("b", review_tasks(100), LABEL_SCHEMA, on_exhausted="return")
        assert srv.requests == 1
        billed = sum(u["prompt_tokens"] * price[0] + u["completion_tokens"] * price[1]
                     for u in srv.billed) / 1e6
        (receipt,) = session.ledger.attempts("b")
        assert receipt.output_tokens == 3000 and receipt.cost == pytest.approx(billed)
        assert session.spent_cost == pytest.approx(billed)  # settled at the real usage
        said = {e["message"] for e in result.errors if e["type"] == "budget_exhausted"}
        assert said and all("3000 output tokens against a ceiling of max_tokens=100" in m
                            for m in said)
        over = [n for n in result.notes if n.startswith("calls billed beyond")]
        assert over and f"the session has spent {usd(billed)} of its {usd(budget)}" in over[0]
        with pytest.raises(BudgetExceeded, match="does not hold the output ceiling"):
            session.run_batch("c", review_tasks(3), LABEL_SCHEMA)  # refused before spending
        assert srv.requests == 1
        session.close()


def test_calls_in_flight_when_one_overruns_are_the_only_overrun_and_no_call_opens_after() -> None:
    """A server that holds the ceiling at first and then stops: the calls already sent settle
    at their real cost (never hidden), none is opened once the first overrun is seen, and the
    session is over its budget by at most what those calls billed beyond their reservations,
    which the run reports."""
    lock, cap, concurrency = threading.Lock(), 50, 8
    opened: list[int] = []
    excess: list[float] = []  # what each overrunning call billed beyond its reservation

    async def model(call: Any) -> Reply:
        worst = (input_bound(None, call) * PRICE["input"] + cap * PRICE["output"]) / 1e6
        with lock:
            opened.append(len(opened) + 1)
            number = opened[-1]
        await asyncio.sleep(0.01)
        out = cap if number <= 6 else 40 * cap  # from the 7th call on, the ceiling is ignored
        cost = (20 * PRICE["input"] + out * PRICE["output"]) / 1e6
        if cost > worst:
            excess.append(cost - worst)
        return Reply(items_reply(call), input_tokens=20, output_tokens=out, cost=cost)

    budget = 0.2
    session = Session(CallableProvider(model, source="drifts", price=PRICE, max_tokens=cap),
                      budget=Budget(cost=budget), concurrency=concurrency)
    result = session.run_batch("b", review_tasks(200), LABEL_SCHEMA, on_exhausted="return")
    receipts = session.ledger.attempts("b")
    spent = sum(r.cost for r in receipts)
    assert len(receipts) == len(opened) and session.spent_cost == pytest.approx(spent)
    # the 7th call overran: only calls already opened while it was out came after it
    assert 7 <= len(opened) <= 7 + concurrency - 1
    assert excess and spent <= budget + sum(excess) + 1e-12
    over = next(n for n in result.notes if n.startswith("calls billed beyond"))
    assert f"reservations: {usd(sum(excess))} in this run" in over
    assert f"of its {usd(budget)} cost budget" in over
    assert any("2000 output tokens against a ceiling of max_tokens=50" in n
               for n in result.notes)


def test_a_gateway_5xx_without_usage_keeps_its_worst_case_while_a_4xx_costs_nothing() -> None:
    """A 5xx may come after the model ran (a gateway timing out on it): it is not known to
    cost $0, so it keeps its worst case and its receipt records the cost as unknown. A 429 is
    the API refusing before its model runs: it settles at 0."""
    price = (1.0, 10.0)
    tasks = review_tasks(20)
    with LoopbackServer(faults=HttpFaults(rate_500=1.0)) as srv:
        provider = OpenAIProvider("m1", base_url=srv.base_url, api_key="sk-test",
                                  prices={"m1": price},
                                  extra_body={"max_completion_tokens": 1000})
        session = Session(provider, budget=Budget(cost=0.02), concurrency=4,
                          transport_retries=3, replays=1)
        result = session.run_batch("b", tasks, LABEL_SCHEMA, on_exhausted="return")
        failed = session.ledger.attempts("b")
        # one worst case ($0.01 of output alone) fits in $0.02, a third does not
        assert 1 <= srv.requests <= 2 and len(failed) == srv.requests
        assert all(r.status == "provider_error" and r.cost is None for r in failed)
        assert session.spent_cost >= srv.requests * 1000 * price[1] / 1e6
        assert {e["type"] for e in result.errors} >= {"budget_exhausted"}
        session.close()
    with LoopbackServer(faults=HttpFaults(script={i: "429" for i in range(1, 5)},
                                          retry_after=0)) as srv:
        provider = OpenAIProvider("m1", base_url=srv.base_url, api_key="sk-test",
                                  prices={"m1": price},
                                  extra_body={"max_completion_tokens": 1000})
        session = Session(provider, budget=Budget(cost=0.05), concurrency=1,
                          transport_retries=4)
        result = session.run_batch("b", review_tasks(1), LABEL_SCHEMA)
        assert result.resolved and srv.responses[429] == 4
        (paid,) = [r for r in session.ledger.attempts("b") if r.status == "accepted"]
        assert session.spent_cost == pytest.approx(paid.cost)  # the 429s cost nothing
        session.close()


def test_budget_messages_show_tiny_amounts_in_significant_digits() -> None:
    """"one call may cost up to $0 ...; the budget is $0" said nothing."""
    session = Session(CallableProvider(lambda call: '{"items": []}', source="x",
                                       price=Price(0.0001, 0.0001), max_tokens=100),
                      budget=Budget(cost=1e-9))
    with pytest.raises(BudgetExceeded) as raised:
        session.run_batch("b", [{"task_id": "t", "prompt": "hi"}], LABEL_SCHEMA)
    message, worst = str(raised.value), raised.value.one_call
    assert worst is not None and f"may cost up to {usd(worst)} " in message
    assert "the budget is $0.000000001." in message and "$0 " not in message
    assert usd(8.57e-8) == "$0.0000000857" and usd(0.015) == "$0.015"
    assert usd(0.1234567) == "$0.123457" and usd(1234.5) == "$1,234.50" and usd(0.0) == "$0"
    for exponent in range(-300, 0):  # never "$0" for an amount that is not zero
        amount = 1.234 * 10.0 ** exponent
        assert usd(amount) != "$0" and math.isclose(float(usd(amount)[1:]), amount,
                                                    rel_tol=1e-2)
