"""Pack-size advice, checked against a simulation of the very runs it advises on."""

from __future__ import annotations

import math

import pytest

from batchjson import FaultPlan, Session, SimulatedModel
from batchjson._errors import InvalidBatch
from batchjson._session.advice import Fit, estimate, fit

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
        advice = pilot.advise("review", candidates=CANDIDATES, split=split,
                              max_unresolved=1.0)
        simulated = {k: simulated_cost_per_usable(rate, k, split) for k in CANDIDATES}
        best = min(simulated, key=simulated.__getitem__)
        advised = advice["recommended"]["pack"]
        assert abs(CANDIDATES.index(advised) - CANDIDATES.index(best)) <= 1, (
            rate, advised, best, simulated)
        chosen[rate] = advised
    assert chosen[0.004] > chosen[0.05]  # more faults, smaller packs


def test_fit_recovers_the_fault_rate_and_the_shared_and_per_task_tokens() -> None:
    session = run(0.03, 8, seed=1, split=True)  # splitting observes several pack sizes
    f = fit(session.ledger, "review")
    assert f.tasks == TASKS and f.call_fault_rate == 0
    assert 0.015 < f.item_fault_rate < 0.05
    shared = len(INSTRUCTIONS) // 4
    assert shared < f.shared_input < shared * 1.6 and 10 < f.input_per_task < 40
    assert f.input_price == pytest.approx(0.15e-6) and f.output_price == pytest.approx(0.6e-6)


def test_shared_instructions_amortise_and_faults_amplify_in_the_model() -> None:
    f = fit(run(0.0, 8, seed=2, split=False).ledger, "review")
    clean = [estimate(f, k, split=False, repairs=0, replays=2).per_usable for k in CANDIDATES]
    assert clean == sorted(clean, reverse=True)  # no faults: bigger packs are always cheaper
    faulty = f.__class__(**{**vars(f), "item_fault_rate": 0.1})
    costs = [estimate(faulty, k, split=False, repairs=0, replays=2) for k in CANDIDATES]
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
        e = estimate(f, 12, split=False, repairs=repairs, replays=replays)
        assert (e.calls, e.input_tokens, e.usable) == pytest.approx(
            _counted(f, 12, repairs, replays))
    huge = estimate(f, 12, split=True, repairs=10**9, replays=10**9)  # a loop would never end
    if rate < 1:
        assert huge.usable == pytest.approx(12) and math.isfinite(huge.calls)
    else:
        assert huge.usable == 0 and huge.calls > 2 * 10**9  # every attempt of every half made
