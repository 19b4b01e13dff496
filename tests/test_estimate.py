"""An estimate before spending: what a run would send and spend, with nothing sent or recorded,
and a worst case the run that follows stays within."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from batchjson import (
    Budget,
    CallableProvider,
    ConfigError,
    Estimate,
    FaultPlan,
    InvalidBatch,
    OpenAIProvider,
    Session,
    SimulatedModel,
)
from tests.helpers import answer, items_reply, review_tasks

BOUNDED = {  # every answer's size is bounded, so the worst case has one
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]},
                   "confidence": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["verdict", "confidence"],
    "additionalProperties": False,
}
PRICE = (1.0, 2.0)


def graded(task: dict[str, Any]) -> dict[str, Any]:
    return {**answer(task), "confidence": 90}


def model(faults: FaultPlan | None = None) -> SimulatedModel:
    return SimulatedModel(answer=graded, faults=faults, seed=3, price_per_million=PRICE)


def ledger_bytes(path: Path) -> dict[str, bytes]:
    """The ledger file and its write-ahead log, as they are on disk."""
    return {p.name: p.read_bytes() for p in (path, path.with_name(path.name + "-wal"))
            if p.exists()}


def picky(item: Any, task: Any) -> None:
    if item["confidence"] < 50:
        raise ValueError("confidence too low")


def test_estimate_sends_and_records_nothing_the_ledger_file_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    simulated = model()
    session = Session(simulated, ledger=path)
    session.run_batch("earlier", review_tasks(4, case="gold-pair-090"), BOUNDED)
    before, sent = ledger_bytes(path), simulated.calls
    estimate = session.estimate("r", review_tasks(12), BOUNDED, pack=3, validator=picky,
                                split=True)
    assert isinstance(estimate, Estimate) and estimate.to_send == 4
    assert simulated.calls == sent  # nothing sent
    assert ledger_bytes(path) == before  # no revision, request, validator version or receipt
    assert session.ledger.batch_names() == ["earlier"]
    assert len(session.validators) == 0  # the run registers the validator, not its estimate
    session.close()


def test_a_resumed_runs_estimate_reuses_its_accepted_requests(tmp_path: Path) -> None:
    session = Session(model(FaultPlan(missing_item=0.5)), ledger=tmp_path / "l.sqlite",
                      repairs=0, replays=0)
    tasks = review_tasks(24)
    first = session.run_batch("r", tasks, BOUNDED, pack=3, on_exhausted="return")
    assert 0 < first.accepted_returns < 8
    estimate = session.estimate("r", tasks, BOUNDED, pack=3)
    assert (estimate.requests, estimate.reused) == (8, first.accepted_returns)
    assert estimate.to_send == estimate.calls[0] == 8 - first.accepted_returns

    session.provider = model()  # another source answers them all: then nothing is owed
    resolved = session.run_batch("r", tasks, BOUNDED, pack=3)
    assert resolved.status == "resolved"
    done = session.estimate("r", tasks, BOUNDED, pack=3)
    assert (done.reused, done.to_send, done.calls) == (8, 0, (0, 0))
    assert done.budget == "nothing to send" and done.cost_live == (0.0, 0.0)


@pytest.mark.parametrize("split", [False, True])
def test_the_worst_case_bounds_the_calls_and_cost_of_the_run_that_follows(split: bool) -> None:
    faults = FaultPlan(wrong_type=0.3, extra_item=0.2, missing_item=0.2)
    session = Session(model(faults), repairs=1, replays=1)
    tasks = review_tasks(40)
    estimate = session.estimate("r", tasks, BOUNDED, pack=4, split=split)
    result = session.run_batch("r", tasks, BOUNDED, pack=4, split=split, on_exhausted="return")
    assert result.rejected_returns > 0  # the faults did reject returns
    assert estimate.calls[0] == 10 <= result.calls <= estimate.calls[1]
    assert estimate.calls[1] == 10 * 3 * (7 if split else 1)  # 4 -> 2, 2 -> 1, 1, 1, 1
    low, high = estimate.cost_live
    assert result.cost is not None and low <= result.cost <= high
    assert estimate.input_tokens[0] <= result.tokens <= sum(
        (estimate.input_tokens[1], estimate.output_tokens[1]))
    assert estimate.cost_batch[1] == pytest.approx(high / 2)


def test_a_split_batch_job_is_never_halved_in_its_worst_case() -> None:
    unreachable = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1",
                                 api_key="sk-test")  # an estimate asks its batch API nothing
    estimate = Session(unreachable).estimate("r", review_tasks(8), BOUNDED, pack=4, split=True,
                                             transport="batch")
    assert estimate.calls == (2, 2 * 3)
    assert estimate.cost_batch[0] < estimate.cost_live[0]
    assert "24-hour window" in str(estimate)


def test_bad_input_is_refused_as_the_run_refuses_it_before_anything(tmp_path: Path) -> None:
    simulated = model()
    session = Session(simulated, ledger=tmp_path / "l.sqlite")
    tasks = review_tasks(4)
    bad = [dict(pack=0), dict(split="yes"), dict(identity=["nope"]),
           dict(validator=lambda item: None)]
    for options in bad:
        with pytest.raises(InvalidBatch) as by_run:
            session.run_batch("r", tasks, BOUNDED, **options)
        with pytest.raises(InvalidBatch) as by_estimate:
            session.estimate("r", tasks, BOUNDED, **options)
        assert str(by_estimate.value) == str(by_run.value)
    with pytest.raises(ConfigError, match="batch API"):  # as the run says, asking nothing
        session.estimate("r", tasks, BOUNDED, transport="batch")
    assert simulated.calls == 0 and session.ledger.batch_names() == []


def test_the_budget_verdict_says_whether_the_worst_case_fits() -> None:
    tasks = review_tasks(8)

    def verdict(budget: Any = None, **options: Any) -> Estimate:
        return Session(model(), budget=budget, repairs=1, replays=1).estimate(
            "r", tasks, BOUNDED, pack=2, **options)

    unlimited = verdict()
    assert unlimited.budget_suffices is None and "no budget" in unlimited.budget
    assert verdict(Budget(calls=12)).budget_suffices is True  # 4 first calls, 12 at worst
    short = verdict(Budget(calls=6))
    assert short.budget_suffices is False and "not the worst case" in short.budget
    refused = verdict(max_calls=3)
    assert refused.budget_suffices is False and "would be refused" in refused.budget


def test_a_cost_budget_is_held_to_the_cost_range() -> None:
    def verdict(cost: float) -> Estimate:
        capped = CallableProvider(lambda call: items_reply(call), model="capped", max_tokens=200,
                                  price=PRICE)
        return Session(capped, budget=Budget(cost=cost)).estimate("r", review_tasks(8),
                                                                  BOUNDED, pack=2)

    low, high = verdict(1.0).cost_live
    assert verdict(1.0).budget_suffices is True
    between = verdict((low + high) / 2)
    assert between.budget_suffices is False and "not the worst case" in between.budget


def test_an_unbounded_answer_is_said_rather_than_guessed() -> None:
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}},
              "required": ["verdict"]}
    estimate = Session(model()).estimate("r", review_tasks(4), schema)
    assert estimate.output_tokens[1] is None and estimate.cost_live[1] is None
    assert any("unbounded" in note for note in estimate.notes)
    assert "no known bound" in str(estimate)


def test_the_estimate_prints_as_text_and_html() -> None:
    estimate = Session(model(), rate_limits={"requests_per_minute": 60}).estimate(
        "r", review_tasks(6), BOUNDED, pack=2)
    text = str(estimate)
    assert text.startswith("estimate of batch 'r' (live): nothing was sent or recorded")
    for label in ("requests:", "calls: 3 if every first return is accepted", "tokens:",
                  "cost: live $", "time: at least", "budget:"):
        assert label in text
    assert estimate.minutes == (pytest.approx(3 / 60), pytest.approx(9 / 60))
    assert "<table>" in estimate._repr_html_()


MAGIC_MODEL = """
from batchjson import SimulatedModel
model = SimulatedModel(answer=lambda task: {"verdict": "match"})
"""
MAGIC_BODY = """
tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(4)]
schema = {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["match"]}},
          "required": ["verdict"], "additionalProperties": False}
def check(item, task):
    if item["verdict"] != "match":
        raise ValueError("no")
"""


def test_the_magic_estimate_prints_it_and_spends_nothing(ip: Any, capsys: Any) -> None:
    for cell in ("%load_ext batchjson", MAGIC_MODEL, "%config BatchJson.provider = model"):
        assert ip.run_cell(cell).success
    session = ip.user_ns["batch_session"]
    before = ledger_bytes(session.ledger.path)
    capsys.readouterr()
    ran = ip.run_cell(f"%%batch_json labels --pack 2 --validator check --estimate\n{MAGIC_BODY}")
    assert ran.success, ran.error_in_exec
    out = capsys.readouterr().out
    assert "estimate of batch 'labels' (live): nothing was sent or recorded" in out
    assert "calls: 2 if every first return is accepted" in out
    assert "labels" not in ip.user_ns  # no result bound
    assert ip.user_ns["model"].calls == 0 and len(session.validators) == 0
    assert ledger_bytes(session.ledger.path) == before
    bad = ip.run_cell(f"%%batch_json labels --pack 2 --identity nope --estimate\n{MAGIC_BODY}")
    assert "nope" in str(bad.error_in_exec) and ip.user_ns["model"].calls == 0


def test_earlier_returns_a_new_validator_accepts_count_as_rejudged_not_sent(
        tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    session = Session(model(), ledger=path, repairs=0, replays=0)
    tasks = review_tasks(8)

    def strict(item: Any, task: Any) -> None:
        if item["confidence"] < 95:
            raise ValueError("not sure enough")

    first = session.run_batch("r", tasks, BOUNDED, pack=2, validator=strict,
                              on_exhausted="return")
    assert first.values == {} and first.rejected_returns == 4
    before = ledger_bytes(path)
    estimate = session.estimate("r", tasks, BOUNDED, pack=2, validator=picky)
    assert (estimate.rejudged, estimate.to_send, estimate.calls) == (4, 0, (0, 0))
    assert ledger_bytes(path) == before  # judged again, nothing committed
    assert session.run_batch("r", tasks, BOUNDED, pack=2, validator=picky).rechecked == 4


def test_the_worst_case_output_is_the_ceiling_each_call_asks_for(tmp_path) -> None:
    """OpenAI's own API is sent a sized ``max_completion_tokens`` (4,096 for an answer the
    schema bounds nowhere): the estimate's worst case is that ceiling, not "no known bound"."""
    session = Session(OpenAIProvider("gpt-4o-mini", api_key="sk-test"),
                      ledger=tmp_path / "l.sqlite", repairs=0, replays=0)
    free_text = {"type": "object", "properties": {"label": {"type": "string"}}}
    tasks = [{"task_id": f"t{i}", "prompt": f"review {i}"} for i in range(3)]
    estimate = session.estimate("free", tasks, free_text)
    assert estimate.calls == (3, 3)
    assert estimate.output_tokens[1] == 3 * 4096
    assert estimate.cost_live[1] is not None
    session.close()
