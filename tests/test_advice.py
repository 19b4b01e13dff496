"""Pack-size advice, checked against a simulation of the very runs it advises on."""

from __future__ import annotations

import hashlib
import math

import pytest

from batchjson import FaultPlan, Session, SimulatedModel
from batchjson._errors import InvalidBatch
from batchjson._session.advice import Fit, Observations, estimate

SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string",
                                                       "enum": ["match", "no_match"]}},
          "required": ["verdict"]}
INSTRUCTIONS = "You review candidate entity matches against their gold case. " * 30
CANDIDATES = (2, 4, 8, 16, 32, 64)  # one step = a factor of two
TASKS = 384


def answer(task: dict) -> dict:
    return {"verdict": "match" if int(task["candidate_id"].rsplit("-", 1)[1]) % 2 else
            "no_match"}


def tasks(n: int = TASKS) -> list[dict]:
    return [{"task_id": f"t{i:04d}", "case_id": f"case-{i // 10}", "candidate_id": f"c-{i}",
             "prompt": f"Is candidate {i} the same entity as its case?"} for i in range(n)]


def run(rate: float, pack: int, seed: int, *, split: bool) -> Session:
    """One batch on the offline model with per-item faults, priced like gpt-4o-mini."""
    model = SimulatedModel(answer=answer, faults=FaultPlan(item_wrong_type=rate), seed=seed,
                           model="gpt-4o-mini", price_per_million=(0.15, 0.60))
    session = Session(model, repairs=0, replays=2, concurrency=4)
    session.run_batch("review", tasks(), SCHEMA, identity="task_id,case_id", pack=pack,
                      instructions=INSTRUCTIONS, split=split, on_exhausted="return")
    return session


def simulated_cost_per_usable(rate: float, pack: int, split: bool, seeds: int = 3) -> float:
    cost = usable = 0.0
    for seed in range(seeds):
        total = run(rate, pack, 1000 + seed, split=split).ledger.cost_summary()["total"]
        cost, usable = cost + total["cost"], usable + total["usable_results"]
    return cost / usable if usable else float("inf")


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_advice_matches_the_simulated_optimum_within_one_step_at_three_fault_rates(
        split: bool) -> None:
    chosen = {}
    for rate in (0.004, 0.015, 0.05):
        pilot = run(rate, 8, seed=0, split=split)  # what a user has: one run at some size
        advice = pilot.advise("review", candidates=CANDIDATES,
                              modes=["split" if split else "whole"], max_unresolved=1.0)
        simulated = {k: simulated_cost_per_usable(rate, k, split) for k in CANDIDATES}
        best = min(simulated, key=simulated.__getitem__)
        advised = advice["recommended"]["pack"]
        assert abs(CANDIDATES.index(advised) - CANDIDATES.index(best)) <= 1, (
            rate, advised, best, simulated)
        chosen[rate] = advised
    assert chosen[0.004] > chosen[0.05]  # more faults, smaller packs


def test_fit_recovers_the_fault_rate_and_the_shared_and_per_task_tokens() -> None:
    session = run(0.03, 8, seed=1, split=True)  # splitting observes several pack sizes
    f = Observations.read(session.ledger, "review").fit()
    assert f.tasks == TASKS and f.call_fault_rate == 0
    assert 0.015 < f.item_fault_rate < 0.05
    shared = len(INSTRUCTIONS) // 4
    assert shared < f.shared_input < shared * 1.6 and 10 < f.input_per_task < 40
    assert f.input_price == pytest.approx(0.15e-6) and f.output_price == pytest.approx(0.6e-6)


def test_shared_instructions_amortise_and_faults_amplify_in_the_model() -> None:
    f = Observations.read(run(0.0, 8, seed=2, split=False).ledger, "review").fit()
    clean = [estimate(f, k, repairs=0, replays=2).per_usable for k in CANDIDATES]
    assert clean == sorted(clean, reverse=True)  # no faults: bigger packs are always cheaper
    faulty = f.__class__(**{**vars(f), "item_fault_rate": 0.1})
    costs = [estimate(faulty, k, repairs=0, replays=2) for k in CANDIDATES]
    assert costs[-1].usable < 0.2 * TASKS  # one item's fault sinks a 64-task return
    assert min(costs, key=lambda e: e.per_usable).pack <= 8


def test_advice_needs_observed_returns_and_a_known_batch() -> None:
    down = SimulatedModel(answer=answer, faults=FaultPlan(provider_error=1.0))
    session = Session(down, transport_retries=0, repairs=0, replays=0)
    with pytest.raises(InvalidBatch, match="no batch named 'nope'"):
        session.advise("nope")
    session.run_batch("review", tasks(4), SCHEMA, on_exhausted="return")  # errors only
    with pytest.raises(InvalidBatch, match="no judged returns yet"):
        session.advise("review")


def test_at_fault_rate_one_advice_warns_that_no_pack_size_finishes() -> None:
    broken = SimulatedModel(answer=answer, faults=FaultPlan(item_wrong_type=1.0), seed=1)
    session = Session(broken, repairs=0, replays=1)
    session.run_batch("review", tasks(16), SCHEMA, pack=4, on_exhausted="return")
    advice = session.advise("review")
    assert advice["fit"]["item_fault_rate"] > 0.99
    assert advice["recommended"]["usable_results"] < 1
    assert "no pack size is expected to finish this batch" in advice["warning"]
    assert "batchjson receipts review --failed" in advice["warning"]


def test_at_fault_rate_zero_advice_is_finite_and_prefers_the_largest_pack() -> None:
    clean = SimulatedModel(answer=answer, seed=1, model="gpt-4o-mini",
                           price_per_million=(0.15, 0.60))
    session = Session(clean)
    session.run_batch("review", tasks(40), SCHEMA, pack=5, instructions=INSTRUCTIONS)
    advice = session.advise("review")
    assert advice["warning"] is None
    assert advice["fit"]["item_fault_rate"] == pytest.approx(0.5 / 40)  # half a fault, not 0
    assert all(c["cost_per_usable_result"] is not None and c["cost_per_usable_result"] > 0
               for c in advice["candidates"])
    assert advice["recommended"]["pack"] >= 20  # the shared instructions amortise


def _counted(f: Fit, k: int, repairs: int, replays: int) -> tuple[float, float, float]:
    """(calls, input tokens, usable) of one request, counting each attempt in turn."""
    s = (1 - f.call_fault_rate) * (1 - f.item_fault_rate) ** k
    calls = inp = 0.0
    reach = 1.0
    for attempt in range(1 + repairs + replays):
        calls += reach
        inp += reach * (f.shared_input + f.input_per_task * k
                        + (f.repair_extra_input if 1 <= attempt <= repairs else 0.0))
        reach *= 1 - s
    return calls, inp, k * (1 - reach)


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.5, 1.0])
def test_any_number_of_repairs_and_replays_is_estimated_exactly_and_at_once(
        rate: float) -> None:
    f = Fit(tasks=12, returns=10, call_fault_rate=0.1, item_fault_rate=rate,
            provider_error_rate=0.0, shared_input=500, input_per_task=30, shared_output=10,
            output_per_task=20, repair_extra_input=200, input_price=None, output_price=None)
    for repairs, replays in ((0, 0), (1, 1), (3, 2)):
        e = estimate(f, 12, repairs=repairs, replays=replays)
        assert (e.calls, e.input_tokens, e.usable) == pytest.approx(
            _counted(f, 12, repairs, replays))
    huge = estimate(f, 12, mode="split", repairs=10**9, replays=10**9)  # a loop would never end
    if rate < 1:
        assert huge.usable == pytest.approx(12) and math.isfinite(huge.calls)
    else:
        assert huge.usable == 0 and huge.calls > 2 * 10**9  # every attempt of every half made


def rejecting(share: float):
    """A validator that rejects a fixed share of the tasks, the same ones on every attempt."""
    def check(item: dict, task: dict) -> None:
        if int(hashlib.sha256(task["task_id"].encode()).hexdigest()[:8], 16) < share * 2**32:
            raise ValueError("this answer is not good enough")
    return check


def validated(share: float, pack: int, *, faults: FaultPlan | None = None,
              repairs: int = 1, replays: int = 1) -> Session:
    """A batch whose validator rejects ``share`` of the items, priced like gpt-4o-mini."""
    model = SimulatedModel(answer=answer, faults=faults, seed=3, model="gpt-4o-mini",
                           price_per_million=(0.15, 0.60))
    session = Session(model, repairs=repairs, replays=replays)
    own_cases = [{**task, "case_id": f"case-{i}"} for i, task in enumerate(tasks(400))]
    session.run_batch("review", own_cases, SCHEMA, validator=rejecting(share), pack=pack,
                      identity="task_id,case_id", instructions=INSTRUCTIONS,
                      on_exhausted="return")
    return session


def test_the_fit_tells_items_the_validator_rejects_from_confused_identities() -> None:
    by_validator = Observations.read(validated(0.15, 5, repairs=0, replays=0).ledger,
                                     "review").fit()
    assert 0.11 < by_validator.item_fault_rate < 0.19  # read from the task_ids errors name
    assert by_validator.identity_fault_rate == 0 and by_validator.call_fault_rate == 0
    swapped = Observations.read(validated(0.0, 5, faults=FaultPlan(identity_swap=0.3)).ledger,
                                "review").fit()
    assert swapped.identity_fault_rate > 0.02 and swapped.item_fault_rate == 0
    # a confused identity rejects a return whole in every mode: accepting items saves nothing
    whole, items = (estimate(swapped, 10, mode=m, repairs=1, replays=1) for m in ("whole", "items"))
    assert items.per_usable == pytest.approx(whole.per_usable)
    assert items.usable == pytest.approx(whole.usable)


def test_advice_prices_items_below_whole_and_split_when_a_validator_rejects_some_items() -> None:
    advice = validated(0.15, 10).advise("review")
    at_ten = {c["mode"]: c for c in advice["candidates"] if c["pack"] == 10}
    assert (at_ten["items"]["cost_per_usable_result"]
            < at_ten["split"]["cost_per_usable_result"]
            < at_ten["whole"]["cost_per_usable_result"])
    assert at_ten["items"]["unresolved"] < at_ten["whole"]["unresolved"]
    assert advice["recommended"]["mode"] == "items"
    assert advice["verdict"].startswith(f"pack {advice['recommended']['pack']} with "
                                        'accept="items"')


def open_items_chain(f: Fit, k: int, repairs: int, replays: int) -> tuple[float, ...]:
    """(calls, input tokens, output tokens, usable) of one request whose items are accepted one
    by one, counted attempt by attempt over the distribution of its open items."""
    e = (1 - f.call_fault_rate) * (1 - f.identity_fault_rate) ** k
    p = f.item_fault_rate
    open_now = [0.0] * k + [1.0]  # P(n items open), n = 0..k
    calls = inp = out = 0.0
    for attempt in range(1 + repairs + replays):
        made = 1 - open_now[0]
        asked = sum(n * q for n, q in enumerate(open_now))
        calls += made
        inp += made * f.shared_input + asked * f.input_per_task + (
            made * f.repair_extra_input if 1 <= attempt <= repairs else 0.0)
        out += made * f.shared_output + asked * f.output_per_task
        after = [(1 - e) * q for q in open_now]  # a broken return keeps every item open
        for n, q in enumerate(open_now):
            for still in range(n + 1):  # a sound one keeps each open item with probability p
                after[still] += e * q * math.comb(n, still) * p**still * (1 - p)**(n - still)
        open_now = after
    return calls, inp, out, k - sum(n * q for n, q in enumerate(open_now))


@pytest.mark.parametrize("rates", [(0.0, 0.0, 0.15), (0.1, 0.02, 0.3), (0.0, 0.0, 1.0),
                                   (1.0, 0.0, 0.2)])
def test_items_accepted_one_by_one_are_estimated_exactly(rates: tuple[float, ...]) -> None:
    c, i, p = rates
    f = Fit(tasks=6, returns=10, call_fault_rate=c, item_fault_rate=p, identity_fault_rate=i,
            provider_error_rate=0.0, shared_input=500, input_per_task=30, shared_output=10,
            output_per_task=20, repair_extra_input=200, input_price=None, output_price=None)
    for repairs, replays in ((0, 0), (1, 1), (3, 2)):
        e = estimate(f, 6, mode="items", repairs=repairs, replays=replays)
        assert (e.calls, e.input_tokens, e.output_tokens, e.usable) == pytest.approx(
            open_items_chain(f, 6, repairs, replays))
    huge = estimate(f, 6, mode="items", repairs=10**9, replays=10**9)  # no loop over attempts
    assert math.isfinite(huge.calls) and huge.usable == pytest.approx(6 if p < 1 > c else 0)


def test_advice_refuses_a_mode_it_does_not_know() -> None:
    session = run(0.0, 8, seed=2, split=False)
    with pytest.raises(InvalidBatch, match="advice modes must be"):
        session.advise("review", modes=["halves"])
