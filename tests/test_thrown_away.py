"""A run that threw away valid answers with a rejected pack-mate says so, once, with the fix
(accepting items, or splitting) and what it would have saved."""

from __future__ import annotations

import pytest

from batchjson import FaultPlan, Session, SimulatedModel
from batchjson._money import money

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def tasks(n: int = 30) -> list[dict]:
    return [{"task_id": f"t{i:02d}", "prompt": f"Label item {i}."} for i in range(n)]


def every_third(item: dict, task: dict) -> None:
    """A stricter validator: the first task of each pack of 3 is never good enough."""
    if int(task["task_id"][1:]) % 3 == 0:
        raise ValueError("the label is too vague")


def ran(validator=every_third, *, pack: int = 3, split: bool = False,
        faults: FaultPlan | None = None):
    model = SimulatedModel(answer=lambda task: {"label": "ok"}, faults=faults, seed=1,
                           model="gpt-4o-mini", price_per_million=(0.15, 0.60))
    return Session(model).run_batch("strict", tasks(), SCHEMA, validator=validator, pack=pack,
                                    split=split, on_exhausted="return")


def test_a_run_that_threw_away_valid_pack_mates_suggests_items_or_split_with_the_saving():
    result = ran()  # the run: one item in each pack of 3 rejected, every attempt
    assert (len(result.values), result.calls) == (0, 30)
    thrown = result.thrown_away
    assert (thrown.answers, thrown.unresolved) == (60, 20)  # 20 good answers, thrown 3 times
    assert thrown.cost == pytest.approx(result.cost * 2 / 3)  # their share of each return
    saving = money(thrown.cost * 40 / 60)  # 40 of the 60 were asked for again
    said = result.notes[-1]
    assert said == thrown.said() == (
        'this run threw away 60 valid answer(s) with a rejected pack-mate: accept="items" '
        f"would have kept them, accepting 20 more and saving about {saving} of asking again "
        "(or split=True, which asks the halves apart)")
    assert said + "." in result.failure_report()
    assert thrown.said("--accept items", "--split").startswith(
        "this run threw away 60 valid answer(s) with a rejected pack-mate: --accept items would")


def test_a_run_that_already_splits_is_pointed_at_accepting_items_only():
    said = ran(split=True).thrown_away.said()
    assert 'accept="items" would have kept them' in said and "split=True" not in said


@pytest.mark.parametrize("case", ["clean", "no pack-mates", "every item rejected",
                                  "confused identities"])
def test_no_suggestion_when_nothing_valid_was_thrown_away(case: str) -> None:
    def every_one(item: dict, task: dict) -> None:
        raise ValueError("never good enough")

    result = {"clean": lambda: ran(None),
              "no pack-mates": lambda: ran(pack=1),
              "every item rejected": lambda: ran(every_one),
              "confused identities": lambda: ran(None, faults=FaultPlan(identity_swap=1.0)),
              }[case]()
    assert result.thrown_away is None
    assert not any("threw away" in note for note in result.notes)
    if not result.resolved:
        assert "threw away" not in result.failure_report()
