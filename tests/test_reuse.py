"""Reuse exactly when right: a stored answer is reused only under the same answer source and
rules; a change to the acceptance side alone re-judges stored returns instead of re-asking; bad
input is refused before anything is spent."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from pydantic import BaseModel, Field, field_validator

from batchjson import CallableProvider, Session, SimulatedModel
from batchjson._content.keys import answer_source
from batchjson._errors import ConfigError, InvalidBatch
from tests.helpers import LABEL_SCHEMA, answer, cell_ok, items_reply, review_tasks


def always(verdict: str):
    return lambda task: {"verdict": verdict}


# -- the answer source is part of every request key --------------------------------------------
def test_switching_the_provider_makes_calls_and_never_reuses_the_other_models_answers():
    session = Session(SimulatedModel(answer=always("match")))
    tasks = review_tasks(4)
    first = session.run_batch("labels", tasks, LABEL_SCHEMA)
    assert first.calls == 4
    session.provider = SimulatedModel(answer=always("no_match"))
    second = session.run_batch("labels", tasks, LABEL_SCHEMA)
    assert second.calls == 4
    assert {v["verdict"] for v in second.values.values()} == {"no_match"}
    other_name = session.run_batch("labels-again", tasks, LABEL_SCHEMA)  # same content
    assert other_name.calls == 0 and other_name.values == second.values


def test_switching_the_model_of_one_provider_makes_calls():
    session = Session(SimulatedModel(answer=answer, model="small-1"))
    tasks = review_tasks(2)
    assert session.run_batch("r", tasks, LABEL_SCHEMA).calls == 2
    session.provider = SimulatedModel(answer=answer, model="large-2")
    assert session.run_batch("r", tasks, LABEL_SCHEMA).calls == 2
    session.provider = SimulatedModel(answer=answer, model="small-1")
    assert session.run_batch("r", tasks, LABEL_SCHEMA).calls == 0  # back: its answers resume


def test_a_provider_counting_its_calls_keeps_one_answer_source():
    model = SimulatedModel(answer=answer)
    before = answer_source(model)
    session = Session(model)
    session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert model.calls == 3 and answer_source(model) == before
    assert session.run_batch("r", review_tasks(3), LABEL_SCHEMA).calls == 0


def test_an_http_provider_is_keyed_by_url_model_and_sent_settings_never_by_its_key():
    from batchjson._providers.openai import OpenAIProvider

    def source(model="llama3", **kw):
        settings = {"base_url": "http://127.0.0.1:9/v1", "api_key": "sk-first-secret", **kw}
        return answer_source(OpenAIProvider(model, **settings))

    base = source()
    assert "sk-first" not in base
    assert source(api_key="sk-another-secret") == base
    assert source(base_url="http://127.0.0.1:10/v1") != base
    assert source(model="llama3.1") != base
    assert source(response_format="json_object") != base
    assert source(extra_body={"temperature": 0.2}) != base


def test_receipts_show_provider_model_and_answer_source():
    model = SimulatedModel(answer=answer, model="sim-7")
    session = Session(model)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert result.provider == "simulated/sim-7"
    for receipt in session.ledger.attempts("r"):
        assert (receipt.provider, receipt.model) == ("simulated", "sim-7")
    assert {r.source for r in session.ledger.attempts("r")} == {answer_source(model)}
    assert "SimulatedModel" in answer_source(model)


def test_the_magic_switching_provider_by_config_makes_calls(ip: Any) -> None:
    def ok(source: str) -> Any:
        return cell_ok(ip, source)

    ok("%load_ext batchjson")
    ok("from batchjson import SimulatedModel\n"
       "offline = SimulatedModel(answer=lambda task: {'verdict': 'match'})\n"
       "other = SimulatedModel(answer=lambda task: {'verdict': 'no_match'}, model='other-1')")
    ok("%config BatchJson.provider = offline")
    cell = ("%%batch_json labels\n"
            "tasks = [{'task_id': f't{i}', 'prompt': f'question {i}'} for i in range(3)]\n"
            "schema = {'type': 'object', 'properties': {'verdict': {'type': 'string'}}, "
            "'required': ['verdict']}\n")
    ok(cell)
    assert ip.user_ns["labels"].calls == 3
    ok("%config BatchJson.provider = other")
    ok(cell)
    labels = ip.user_ns["labels"]
    assert labels.calls == 3 and labels.status == "resolved"
    assert {v["verdict"] for v in labels.values.values()} == {"no_match"}


# -- re-judge before re-asking -----------------------------------------------------------------
def test_a_validator_change_every_stored_answer_passes_spends_zero_calls(tmp_path):
    model = SimulatedModel(answer=answer)
    session = Session(model, ledger=tmp_path / "l.sqlite")
    tasks = review_tasks(20)

    def check(item, task):
        if item["verdict"] not in ("match", "no_match"):
            raise ValueError("unknown verdict")

    session.run_batch("r", tasks, LABEL_SCHEMA, validator=check, pack=4)
    assert model.calls == 5

    def check(item, task):  # noqa: F811 - the edited cell: one more check, all stored pass
        if item["verdict"] not in ("match", "no_match"):
            raise ValueError("unknown verdict")
        if not task["task_id"]:
            raise ValueError("no task id")

    again = Session(model, ledger=tmp_path / "l.sqlite")  # also across processes
    result = again.run_batch("r", tasks, LABEL_SCHEMA, validator=check, pack=4)
    assert result.status == "resolved" and result.revision == 2
    assert result.calls == 0 and model.calls == 5
    assert result.rechecked == 5
    rechecks = [r for r in again.ledger.attempts("r") if r.kind == "recheck"]
    assert len(rechecks) == 5
    assert all(r.status == "accepted" and r.cost == 0 and r.tokens == 0 for r in rechecks)
    assert again.ledger.spend("r")["cost"] == 0
    assert len(result.values) == 20


def test_a_validator_only_edit_after_repairs_pays_nothing_when_every_stored_answer_passes(
        tmp_path):
    calls = []

    def model(call):  # a first answer the validator refuses, a repair it accepts
        calls.append(call.kind)
        label = "no_match" if call.kind == "repair" else "match"
        return json.dumps({"items": [{"task_id": t["task_id"], "verdict": label}
                                     for t in call.tasks]})

    session = Session(CallableProvider(model, source="repairing"), ledger=tmp_path / "l.sqlite")
    tasks = review_tasks(10)

    def check(item, task):
        if item["verdict"] != "no_match":
            raise ValueError("every candidate here is no_match")

    first = session.run_batch("r", tasks, LABEL_SCHEMA, validator=check, pack=5)
    assert first.status == "resolved" and sorted(calls) == ["initial"] * 2 + ["repair"] * 2
    calls.clear()

    def check(item, task):  # noqa: F811 - the edited cell: still accepts every stored answer
        if item["verdict"] != "no_match":
            raise ValueError("every candidate here is no_match")
        if not task["candidate_id"]:
            raise ValueError("no candidate")

    again = Session(CallableProvider(model, source="repairing"), ledger=tmp_path / "l.sqlite")
    result = again.run_batch("r", tasks, LABEL_SCHEMA, validator=check, pack=5)
    assert result.status == "resolved" and result.revision == 2
    assert calls == [] and result.calls == 0 and result.rechecked == 2
    assert "2 of them came from repair calls" in " ".join(result.notes)
    assert {v["verdict"] for v in result.values.values()} == {"no_match"}

    def check(item, task):  # noqa: F811 - edited again: the re-judged rechecks are still repairs
        if item["verdict"] != "no_match" or not task["task_id"]:
            raise ValueError("every candidate here is no_match")

    third = again.run_batch("r", tasks, LABEL_SCHEMA, validator=check, pack=5)
    assert calls == [] and third.rechecked == 2
    assert "2 of them came from repair calls" in " ".join(third.notes)


def test_rejudging_resends_exactly_the_requests_whose_stored_answer_fails_the_new_check():
    state = {"verdict": "match"}
    calls = []

    def model(call):  # answers what its state says: its state, not its source
        calls.append(call.tasks[0]["task_id"])
        return json.dumps({"items": [{"task_id": t["task_id"], "verdict": state["verdict"]}
                                     for t in call.tasks]})

    session = Session(CallableProvider(model))
    tasks = review_tasks(6)
    session.run_batch("r", tasks, LABEL_SCHEMA)
    assert len(calls) == 6
    calls.clear()
    picky = {tasks[1]["task_id"], tasks[4]["task_id"]}
    state["verdict"] = "no_match"

    def check(item, task):
        if task["task_id"] in picky and item["verdict"] != "no_match":
            raise ValueError("these two are no_match")

    result = session.run_batch("r", tasks, LABEL_SCHEMA, validator=check)
    assert result.status == "resolved"
    assert sorted(calls) == sorted(picky)  # only the two that fail the new check are re-sent
    assert result.calls == 2 and result.rechecked == 4
    assert {k: v["verdict"] for k, v in result.values.items() if k in picky} == {
        k: "no_match" for k in picky}


def test_a_stored_value_the_schema_no_longer_loads_is_an_error_of_that_task():
    class Label(BaseModel):
        verdict: str

    session = Session(CallableProvider(items_reply), repairs=0, replays=0)
    tasks = review_tasks(2)
    session.run_batch("r", tasks, Label)

    class Label(BaseModel):  # noqa: F811 - the edited cell: "match" is no longer allowed
        verdict: str

        @field_validator("verdict")
        @classmethod
        def no_match_only(cls, value):
            if value == "match":
                raise ValueError("match is retired")
            return value

    result = session.run_batch("r", tasks, Label, on_exhausted="return")  # never a raw error
    failing = [t["task_id"] for t in tasks if answer(t)["verdict"] == "match"]
    assert result.status == "unresolved"
    assert set(result.unresolved) == set(failing)
    assert all(v.verdict == "no_match" for v in result.values.values())


# -- refused before spending -------------------------------------------------------------------
class Colour(enum.StrEnum):
    RED = "red"


class Aliased(BaseModel):
    case_id: str = Field(alias="caseId")
    verdict: str


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"n": value}
    return value


SCHEMA_WITH = {"type": "object", "properties": {"verdict": {"type": "string"}},
               "required": ["verdict"]}
BAD_INPUTS = {
    "validator with one parameter": dict(validator=lambda item: None),
    "validator with three required parameters": dict(validator=lambda item, task, extra: None),
    "schema not {}": dict(schema={"not": {}}),
    "schema false": dict(schema=False),
    "string schema in items mode": dict(schema={"type": "string"}),
    "schema requiring an undeclared identity field": dict(
        schema={**SCHEMA_WITH, "required": ["verdict", "case_id"]}, identity="task_id,case_id"),
    "schema typing an identity field differently": dict(
        schema={**SCHEMA_WITH, "properties": {**SCHEMA_WITH["properties"],
                                              "case_id": {"type": "integer"}}},
        identity="task_id,case_id"),
    "schema enum that excludes the identity value": dict(
        schema={**SCHEMA_WITH, "properties": {**SCHEMA_WITH["properties"],
                                              "case_id": {"enum": ["other"]}}}),
    "pydantic alias on an identity field": dict(schema=Aliased, identity="task_id,case_id"),
    "dangling $ref": dict(schema={"type": "object", "properties": {
        "verdict": {"$ref": "#/$defs/Missing"}}}),
    "int-keyed identity value": dict(tasks_extra={"m": {1: "a"}}, identity="task_id,m"),
    "identity value nested 600 deep": dict(tasks_extra={"m": _nested(600)},
                                           identity="task_id,m"),
    "list identity value": dict(tasks_extra={"m": [1, 2]}, identity="task_id,m"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_before_any_call_or_record(case):
    spec = dict(BAD_INPUTS[case])
    calls = []
    session = Session(CallableProvider(lambda call: calls.append(call) or items_reply(call)))
    extra = spec.pop("tasks_extra", {})
    tasks = [{**t, **extra} for t in review_tasks(3)]
    schema = spec.pop("schema", LABEL_SCHEMA)
    with pytest.raises(InvalidBatch) as raised:
        session.run_batch("r", tasks, schema, **spec)
    assert len(str(raised.value)) > 40  # names the problem and the fix
    assert calls == [] and session.ledger.attempts("r") == []
    assert session.ledger.batch_names() == []


@pytest.mark.parametrize("timeout", [0, -5, math.nan, math.inf, "10", True])
def test_a_timeout_that_is_not_finite_and_positive_is_refused(timeout):
    with pytest.raises(ConfigError, match="timeout"):
        Session(CallableProvider(items_reply), timeout=timeout)


class SyncComplete:
    name = "sync"

    def complete(self, call):
        return items_reply(call)


def test_a_provider_without_an_async_complete_is_refused_before_spending():
    session = Session(SyncComplete())
    with pytest.raises(ConfigError, match="async"):
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert session.ledger.batch_names() == []


def test_an_object_that_is_not_a_provider_is_a_config_error():
    session = Session(object())
    with pytest.raises(ConfigError):
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)


def test_an_enum_identity_value_is_compared_as_the_json_value_the_model_sees():
    tasks = [{**t, "colour": Colour.RED} for t in review_tasks(2)]
    session = Session(CallableProvider(items_reply))
    result = session.run_batch("r", tasks, LABEL_SCHEMA, identity="task_id,colour")
    assert result.resolved and result.calls == 2


def test_an_async_validator_and_a_validator_with_defaults_are_accepted():
    async def check(item, task, strict=True):
        return None

    session = Session(CallableProvider(items_reply))
    assert session.run_batch("r", review_tasks(2), LABEL_SCHEMA, validator=check).resolved


def test_the_droste_helper_re_judges_instead_of_re_asking_when_its_validator_is_edited():
    calls = []

    def model(call):
        calls.append(call.prompt)
        return json.dumps({"label": "good"})

    session = Session(CallableProvider(model))
    schema = {"type": "object", "properties": {"label": {"type": "string"}},
              "required": ["label"]}
    prompts = [f"label {i}" for i in range(4)]

    def check(value, index):
        if value["label"] not in ("good", "bad"):
            raise ValueError("unknown label")

    first = session.llm_batch_json(prompts, schema, validator=check)
    assert first["errors"] == [] and len(calls) == 4

    def check(value, index):  # noqa: F811 - the RLM cell, edited: every stored answer passes
        if value["label"] != "good":
            raise ValueError("only good")

    second = session.llm_batch_json(prompts, schema, validator=check)
    assert second["values"] == [{"label": "good"}] * 4 and second["errors"] == []
    assert len(calls) == 4  # re-judged, not re-asked


def test_the_result_says_how_many_requests_were_re_judged_without_a_call():
    session = Session(SimulatedModel(answer=answer))
    tasks = review_tasks(2)
    session.run_batch("r", tasks, LABEL_SCHEMA)
    result = session.run_batch("r", tasks, LABEL_SCHEMA, validator=lambda item, task: True)
    assert result.calls == 0 and result.rechecked == 2
    assert "2 request(s) resolved by re-judging" in result._repr_html_()
    assert result.summary()["rechecked"] == 2


@pytest.mark.parametrize("crash", [RuntimeError("lookup timed out"), KeyboardInterrupt()])
def test_an_answer_the_validator_crashed_on_is_judged_again_on_rerun_not_paid_again(
        tmp_path, crash):
    """A validator that raised on a paid answer (a flaky lookup, an interrupt raised inside it)
    never finished judging it: the re-run with the same validator judges that stored answer
    before asking again, as the failure's own message promises."""
    paid: list[list[str]] = []

    def provider(call: Any) -> str:
        paid.append([t["task_id"] for t in call.tasks])
        return items_reply(call)

    tripped: list[int] = []
    tasks = review_tasks(3)
    ids = [t["task_id"] for t in tasks]

    def check(item: dict[str, Any], task: dict[str, Any]) -> None:
        if task["task_id"] == ids[1] and not tripped:
            tripped.append(1)
            raise crash

    session = Session(CallableProvider(provider), ledger=tmp_path / "l.sqlite", concurrency=1)
    first = session.run_batch("b", tasks, LABEL_SCHEMA, validator=check, on_exhausted="return")
    assert first.status == "unresolved" and first.errors[0]["type"] == "validator_error"
    again = session.run_batch("b", tasks, LABEL_SCHEMA, validator=check, on_exhausted="return")
    assert again.resolved and again.calls == 1  # t2, never asked; t1's answer judged again
    assert sorted(paid) == sorted([i] for i in ids)
    session.close()
