"""A result shows the answers themselves: the first accepted values as a table, and for each field
with a fixed set of values (an enum, a boolean) how often each came back; a failed run shows its
failed requests first."""

from __future__ import annotations

import html
import json
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel

from batchjson import CallableProvider, Session
from batchjson._session import result as answers
from batchjson._session.result import fixed_set_fields
from tests.helpers import review_tasks

SCHEMA = {"type": "object", "required": ["verdict", "sure", "why"],
          "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]},
                         "sure": {"type": "boolean"}, "why": {"type": "string"},
                         "evidence": {"type": "object"}}}


def answered(call: Any) -> str:
    """match for odd candidates; ``sure`` for every third; a long reason and a nested object."""
    items = []
    for task in call.tasks:
        n = int(task["candidate_id"].rsplit("-", 1)[1])
        items.append({"task_id": task["task_id"], "verdict": "match" if n % 2 else "no_match",
                      "sure": n % 3 == 0, "why": "because " * 20,
                      "evidence": {"pages": [n, n + 1]}})
    return json.dumps({"items": items})


def wrong_first_pack(call: Any) -> str:
    if call.tasks[0]["candidate_id"].endswith("127"):
        return json.dumps({"items": []})
    return answered(call)


def run(provider: Any, n: int = 20, ledger: Any = None) -> Any:
    return Session(CallableProvider(provider), ledger=ledger, repairs=0, replays=0).run_batch(
        "b", review_tasks(n), SCHEMA, pack=2, on_exhausted="return")


def test_the_results_html_holds_accepted_values_and_the_counts_of_each_fixed_field(tmp_path):
    result = run(answered, ledger=tmp_path / "l.sqlite")
    page = result._repr_html_()
    assert "accepted values (the first 5 of 20)" in page
    assert page.count("gold-pair-078::gold-pair-078-candidate-") == 5
    assert "<th style='text-align:left'>verdict</th>" in page
    assert "counts over all 20 accepted values" in page
    assert "<code>verdict</code>: match 10, no_match 10" in page
    assert "<code>sure</code>: false 14, true 6" in page
    assert "<code>why</code>" not in page  # free text is shown, never counted
    assert "because because" in page and "because " * 20 not in page  # clipped
    assert html.escape('{"pages":[127,128]}') in page  # nested values as compact JSON


def test_print_shows_the_answers_as_an_aligned_table_with_their_counts():
    shown = str(run(answered))
    lines = shown.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("task_id"))
    assert lines[header].split() == ["task_id", "verdict", "sure", "why", "evidence"]
    assert set(lines[header + 1].replace(" ", "")) == {"-"}
    assert lines[header + 2].split()[:3] == ["gold-pair-078::gold-pair-078-candidate-127",
                                             "match", "false"]
    assert "  verdict: match 10, no_match 10" in lines


def test_a_failed_runs_display_lists_its_failures_before_the_values():
    result = run(wrong_first_pack)
    assert result.status == "unresolved"
    page, text = result._repr_html_(), str(result)
    assert "1 failed request(s)" in page and "accepted values (the first 5 of 18)" in page
    assert page.index("failed request(s)") < page.index("accepted values")
    assert text.index("failed requests:") < text.index("coverage") < text.index(
        "accepted values")
    assert "verdict: match 9, no_match 9" in text


def test_counts_stop_at_a_bound_and_say_how_many_values_they_read(tmp_path, monkeypatch):
    monkeypatch.setattr(answers, "COUNTED", 6)
    page = run(answered, ledger=tmp_path / "l.sqlite")._repr_html_()
    assert "counts over the first 6 of 20 accepted values" in page
    assert "<code>verdict</code>: match 3, no_match 3" in page


def test_a_result_without_values_shows_no_empty_table():
    result = run(lambda call: json.dumps({"items": []}), n=2)
    assert "accepted values" not in result._repr_html_() + str(result)


class Colour(Enum):
    RED = "red"
    BLUE = "blue"


class Graded(BaseModel):
    colour: Colour
    grade: Literal[1, 2, 3] | None = None
    passed: bool
    note: str
    tags: list[str]


def test_enums_literals_optionals_and_booleans_are_fixed_sets_free_text_is_not():
    assert fixed_set_fields(Graded.model_json_schema()) == ("colour", "grade", "passed")
    assert fixed_set_fields({"type": "string", "enum": ["x", "y"]}) == ("",)
    assert fixed_set_fields({"type": ["boolean", "null"]}) == ("",)
    assert fixed_set_fields({"type": "object", "properties": {"n": {"type": "integer"}}}) == ()


def test_a_pydantic_results_counts_name_its_enum_values(tmp_path):
    def graded(call: Any) -> str:
        return json.dumps({"items": [{"task_id": t["task_id"], "colour": "red", "passed": True,
                                      "note": "ok", "tags": []} for t in call.tasks]})

    result = Session(CallableProvider(graded), ledger=tmp_path / "l.sqlite").run_batch(
        "g", review_tasks(4), Graded, pack=2)
    text = str(result)
    assert "  colour: red 4" in text and "  passed: true 4" in text
    assert "  grade: null 4" in text  # an optional field left out reads as null


def test_an_answer_that_declares_its_task_id_shows_it_in_one_column():
    declared = {**SCHEMA, "properties": {"task_id": {"type": "string"}, **SCHEMA["properties"]}}
    result = Session(CallableProvider(answered)).run_batch("d", review_tasks(6), declared, pack=3)
    header = next(line for line in str(result).splitlines()
                  if line.lstrip().startswith("task_id"))
    assert header.split() == ["task_id", "verdict", "sure", "why", "evidence"]
    assert result._repr_html_().count("<th style='text-align:left'>task_id</th>") == 1
