"""Acceptance is total and exact: every return is judged (never a crash), numbers are finite,
identity values compare as exact JSON values, and what is committed is what passed."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Literal, Optional, Union

import pytest
from pydantic import BaseModel, Field, create_model, field_validator

from batchjson import CallableProvider, Session
from batchjson._acceptance.judge import parse_json
from batchjson._content.schema import compile_schema
from batchjson._providers.base import Reply
from tests.helpers import LABEL_SCHEMA, accept_items, answer, items_reply, review_tasks

SEED_IDENTITY = ("task_id", "case_id", "candidate_id")


def one_shot(provider) -> Session:
    return Session(CallableProvider(provider) if not hasattr(provider, "complete") else provider,
                   repairs=0, replays=0)


def only_receipt(session: Session, name: str = "r"):
    (receipt,) = session.ledger.attempts(name)
    return receipt


# -- numbers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("number", ["1e400", "-1e999", "1E+309"])
def test_a_number_that_overflows_to_infinity_is_rejected(number):
    schema = {"type": "object", "properties": {"score": {"type": "number"}}}
    tasks = [{"task_id": "t1", "prompt": "p"}]
    text = '{"items": [{"task_id": "t1", "score": ' + number + "}]}"
    session = one_shot(lambda call: text)
    result = session.run_batch("r", tasks, schema, on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("r") == {}
    receipt = only_receipt(session)
    assert receipt.status == "rejected" and receipt.raw == text
    assert "overflows" in receipt.errors[0]["message"]


UNDERFLOWING = ["1e-400", "-1e-400", "4.9e-325", "0.0000001e-330"]


@pytest.mark.parametrize("number", UNDERFLOWING)
def test_a_non_zero_number_that_reads_as_zero_is_rejected_in_items_mode(number):
    """1e-400 is not zero, but a float reads it as 0.0, which passes "type": "integer"."""
    schema = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 0}},
              "required": ["score"]}
    text = '{"items": [{"task_id": "t1", "score": ' + number + "}]}"
    session = one_shot(lambda call: text)
    result = session.run_batch("r", [{"task_id": "t1", "prompt": "p"}], schema,
                               on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("r") == {}
    receipt = only_receipt(session)
    assert receipt.status == "rejected" and receipt.raw == text
    assert "underflows" in receipt.errors[0]["message"]


@pytest.mark.parametrize("number", UNDERFLOWING)
def test_a_non_zero_number_that_reads_as_zero_is_rejected_in_value_mode(number):
    session = one_shot(lambda call: number)
    out = session.llm_batch_json(["how many?"], {"type": "integer"}, max_repair_attempts=0)
    assert out["values"] == [None] and out["errors"][0]["type"] == "validation_error"
    assert "underflows" in out["errors"][0]["error"]
    (receipt,) = [r for name in session.ledger.batch_names() for r in
                  session.ledger.attempts(name)]
    assert receipt.status == "rejected" and receipt.raw == number


@pytest.mark.parametrize(("text", "value"), [
    ("0.1000000000000000055511151231257827", 0.1), ("5e-324", 5e-324), ("0.000", 0.0),
    ("-0.0e-400", -0.0), ("0e999", 0.0),
    ("123456789012345678901234567890.5", 1.2345678901234568e29),
])
def test_long_decimals_and_written_zeros_are_still_read(text, value):
    assert parse_json('{"x": ' + text + "}") == {"x": value}


ROUNDING_ONTO_A_VERDICT = [  # a float reads the number as a value the written one is not
    ({"type": "integer"}, "5.0000000000000000001"),
    ({"type": "integer"}, "9007199254740993.5"),
    ({"type": "number", "maximum": 0.3}, "0.30000000000000001"),
    ({"type": "number", "minimum": 0.30000000000000004}, "0.30000000000000003"),
    ({"enum": [1]}, "1.00000000000000000001"),
    ({"const": 2.5}, "2.50000000000000000001"),
    ({"type": "number", "multipleOf": 0.5}, "1.00000000000000000001"),
]


@pytest.mark.parametrize(("rule", "number"), ROUNDING_ONTO_A_VERDICT)
def test_a_long_decimal_that_only_its_float_lets_pass_is_rejected_live_and_on_import(
        tmp_path, rule, number):
    """Judged as written: 5.0000000000000000001 is no integer, though its float 5.0 is."""
    schema = {"type": "object", "properties": {"n": rule}, "required": ["n"]}
    text = '{"items": [{"task_id": "t1", "n": ' + number + "}]}"
    session = one_shot(lambda call: text)
    result = session.run_batch("r", [{"task_id": "t1", "prompt": "p"}], schema,
                               on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("r") == {}
    (error,) = only_receipt(session).errors
    assert error["type"] == "schema" and "(the number as written;" in error["message"]
    receipt = {"batch": "r", "tasks": [{"task_id": "t1", "prompt": "p"}], "raw": text,
               "status": "ok", "schema": schema}
    (tmp_path / "old.jsonl").write_text(json.dumps(receipt) + "\n")
    report = session.ledger.import_receipts(tmp_path / "old.jsonl")
    assert (report["rejected"], report["items_admitted"]) == (1, 0)


@pytest.mark.parametrize("schema", [{"type": "integer"}, {"type": "number", "maximum": 0.3}])
def test_a_long_decimal_is_judged_as_written_in_value_mode(schema):
    number = "0.30000000000000001" if "maximum" in schema else "5.0000000000000000001"
    session = one_shot(lambda call: number)
    out = session.llm_batch_json(["how many?"], schema, max_repair_attempts=0)
    assert out["values"] == [None] and "the number as written" in out["errors"][0]["error"]


class Scored(BaseModel):
    n: int
    score: float
    rank: int


def test_a_pydantic_model_judges_its_numbers_as_written_and_keeps_its_own_coercions():
    bounded = create_model("Bounded", score=(float, Field(le=0.3)), rank=(int, ...))
    tasks = [{"task_id": "t1", "prompt": "p"}]

    def judged(model, fields: str):
        text = '{"items": [{"task_id": "t1", ' + fields + "}]}"
        return accept_items(text, tasks, ("task_id",), compile_schema(model), None)

    assert not judged(Scored, '"n": 5.0000000000000000001, "score": 1, "rank": "3"').accepted
    assert not judged(bounded, '"score": 0.30000000000000001, "rank": 1').accepted
    kept = judged(bounded, '"score": 0.29999999999999999999, "rank": "7"')  # pydantic's "7"
    # the ledger's text of the value: json.dumps's form, keys sorted
    assert kept.accepted and kept.stored == {"t1": '{"rank": 7, "score": 0.3}'}


@pytest.mark.parametrize(("rule", "number", "stored"), [
    ({"type": "number"}, "3.14159265358979323846", 3.141592653589793),
    ({"type": "number", "maximum": 4}, "3.14159265358979323846", 3.141592653589793),
    ({"type": "integer"}, "5.0", 5.0),
    ({"type": "number", "maximum": 0.3}, "0.29999999999999999999", 0.3),
    ({"type": "number", "minimum": 0.1}, "0.1000000000000000055511151231257827", 0.1),
])
def test_a_long_decimal_that_passes_as_written_is_accepted_and_what_is_stored_passes(
        rule, number, stored):
    schema = compile_schema({"type": "object", "properties": {"n": rule}})
    text = '{"items": [{"task_id": "t1", "n": ' + number + "}]}"
    verdict = accept_items(text, [{"task_id": "t1", "prompt": "p"}], ("task_id",), schema, None)
    assert verdict.accepted and verdict.stored == {"t1": json.dumps({"n": stored})}
    assert schema.validate(json.loads(verdict.stored["t1"]), "$")[1] == []


def test_parse_json_keeps_large_finite_numbers():
    assert parse_json('{"x": 1e308, "y": 123456789012345678901234567890}') == {
        "x": 1e308, "y": 123456789012345678901234567890}


# -- exact identity ----------------------------------------------------------------------------
@pytest.mark.parametrize(("requested", "echoed"), [
    (0.0, "-0.0"), (-0.0, "0.0"), (1e16, "10000000000000001.0"), (0.1, "0.10000000000000001"),
])
def test_identity_values_compare_as_exact_json_values(requested, echoed):
    tasks = [{"task_id": "t1", "prompt": "p", "x": requested}]
    text = '{"items": [{"task_id": "t1", "x": ' + echoed + ', "verdict": "match"}]}'
    verdict = accept_items(text, tasks, ("task_id", "x"), compile_schema(LABEL_SCHEMA), None)
    assert not verdict.accepted
    assert verdict.errors[0]["type"] == "identity" and verdict.errors[0]["field"] == "x"


@pytest.mark.parametrize(("requested", "echoed"), [(1e16, "1e16"), (0.5, "0.50"), (-0.0, "-0.0")])
def test_the_same_json_number_written_another_way_is_the_same_identity(requested, echoed):
    tasks = [{"task_id": "t1", "prompt": "p", "x": requested}]
    text = '{"items": [{"task_id": "t1", "x": ' + echoed + ', "verdict": "match"}]}'
    assert accept_items(text, tasks, ("task_id", "x"), compile_schema(LABEL_SCHEMA),
                        None).accepted


# -- echoed task fields are identity by default ------------------------------------------------
def test_the_seeds_079_echo_is_rejected_under_the_default_identity():
    def swap(call):
        victim = call.tasks[0]["task_id"]
        return items_reply(call, **{victim: {"case_id": "gold-pair-079"}})

    session = one_shot(swap)
    tasks = review_tasks(5)
    result = session.run_batch("review", tasks, LABEL_SCHEMA, pack=5, on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("review") == {}
    receipt = only_receipt(session, "review")
    assert receipt.status == "rejected"
    assert [(e["type"], e["field"], e["got"]) for e in receipt.errors] == [
        ("identity", "case_id", "gold-pair-079")]
    assert result.identity_compared == ("task_id",)  # what the model is asked to copy
    assert result.compared_if_echoed == ("candidate_id", "case_id")


def test_under_the_default_identity_a_task_field_the_item_does_not_echo_is_not_required():
    def answers_only(call):
        return json.dumps({"items": [{"task_id": t["task_id"], **answer(t)} for t in call.tasks]})

    result = one_shot(answers_only).run_batch("review", review_tasks(4), LABEL_SCHEMA, pack=4)
    assert result.status == "resolved"


def test_an_explicit_identity_compares_exactly_the_fields_it_lists():
    def swap(call):  # candidate_id is wrong, but only case_id is listed
        victim = call.tasks[0]["task_id"]
        return items_reply(call, **{victim: {"candidate_id": "someone-else"}})

    session = one_shot(swap)
    result = session.run_batch("review", review_tasks(3), LABEL_SCHEMA, pack=3,
                               identity="task_id,case_id")
    assert result.status == "resolved" and result.identity_compared == ("task_id", "case_id")


# -- mutation ----------------------------------------------------------------------------------
def test_a_provider_rewriting_call_tasks_cannot_make_its_echo_pass():
    def forger(call):
        for task in call.tasks:  # the provider's copy, not the ledger's request
            task["case_id"] = "gold-pair-079"
        return items_reply(call)

    session = one_shot(forger)
    result = session.run_batch("review", review_tasks(4), LABEL_SCHEMA, pack=4,
                               identity=SEED_IDENTITY, on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("review") == {}
    assert {e["field"] for e in only_receipt(session, "review").errors} == {"case_id"}


def test_a_validator_mutating_its_item_cannot_change_what_is_committed():
    def vandal(item, task):
        item["verdict"] = "BOGUS"  # outside the schema's enum
        task["case_id"] = "gold-pair-079"

    session = one_shot(items_reply)
    tasks = review_tasks(4)
    result = session.run_batch("review", tasks, LABEL_SCHEMA, pack=4, validator=vandal)
    stored = session.ledger.checkpoint("review")
    assert {v["verdict"] for v in stored.values()} <= {"match", "no_match"}
    assert stored == {t["task_id"]: answer(t) for t in tasks}
    assert {v["verdict"] for v in result.values.values()} <= {"match", "no_match"}


# -- the caller's validator --------------------------------------------------------------------
def test_an_async_validator_is_awaited_and_its_rejection_counts():
    seen = []

    async def check(item, task):
        seen.append(task["task_id"])
        if item["verdict"] != "no_match":
            raise ValueError("only no_match is right here")

    session = one_shot(items_reply)
    tasks = review_tasks(2)
    result = session.run_batch("r", tasks, LABEL_SCHEMA, validator=check, on_exhausted="return")
    assert sorted(seen) == sorted(t["task_id"] for t in tasks)
    assert list(result.values) == [t["task_id"] for t in tasks if answer(t)["verdict"] ==
                                   "no_match"]


def test_a_validator_returning_false_rejects_the_item():
    session = one_shot(items_reply)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, on_exhausted="return",
                               validator=lambda item, task: item["verdict"] == "match")
    assert len(result.values) == 1
    rejected = [r for r in session.ledger.attempts("r") if r.status == "rejected"]
    assert "returned False" in rejected[0].errors[0]["message"]


def test_a_pydantic_validator_raising_type_error_is_a_rejected_receipt_not_a_crash():
    class Label(BaseModel):
        verdict: str

        @field_validator("verdict")
        @classmethod
        def broken(cls, value):
            raise TypeError("a bug in the model")

    session = one_shot(items_reply)
    result = session.run_batch("r", review_tasks(2), Label, on_exhausted="return")
    assert result.values == {}
    receipts = session.ledger.attempts("r")
    judged = [r for r in receipts if r.status == "rejected"]
    assert judged, "the crash is a rejected receipt, not an escape"
    for receipt in judged:
        assert receipt.raw and receipt.errors[0]["type"] == "validator_error"
        assert "TypeError" in receipt.errors[0]["message"]
    # a validator crash stops new calls: any other receipt was withdrawn before its call went out
    assert all(r.status == "cancelled" for r in receipts if r not in judged)
    assert session.ledger.spend("r")["calls"] == len(judged)


# -- crafted returns ---------------------------------------------------------------------------
def test_a_return_nested_2000_deep_is_a_rejected_receipt_with_its_raw_text():
    deep = '{"items": [{"task_id": "t1", "verdict": ' + "[" * 2000 + "]" * 2000 + "}]}"
    session = one_shot(lambda call: deep)
    tasks = [{"task_id": "t1", "prompt": "p"}, {"task_id": "t2", "prompt": "q"}]
    result = session.run_batch("r", tasks, LABEL_SCHEMA, on_exhausted="return")
    assert result.values == {}
    receipts = session.ledger.attempts("r")
    assert [r.status for r in receipts] == ["rejected", "rejected"]  # the run went on
    assert receipts[0].raw == deep and "nested" in receipts[0].errors[0]["message"]


@pytest.mark.parametrize("text", [None, b'{"items": []}', {"items": []}, 17])
def test_a_reply_whose_text_is_not_a_string_is_rejected_and_kept(text):
    session = one_shot(lambda call: Reply(text=text))
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    assert result.values == {}
    receipts = session.ledger.attempts("r")
    assert [r.status for r in receipts] == ["rejected", "rejected"]
    assert all(isinstance(r.raw, str) for r in receipts)
    assert "not str" in receipts[0].errors[0]["message"]


def test_string_token_counts_do_not_crash_the_run():
    def sloppy(call):
        return Reply(text=items_reply(call), input_tokens="12", output_tokens="many",
                     cost="free")

    session = one_shot(sloppy)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert result.status == "resolved" and result.tokens == 24
    assert [r.input_tokens for r in session.ledger.attempts("r")] == [12, 12]


def test_a_default_echo_of_a_deeply_nested_task_field_is_judged_not_a_crash():
    nested: object = "leaf"
    for _ in range(600):
        nested = {"n": nested}
    tasks = [{"task_id": "t1", "prompt": "p", "meta": nested}]

    def echo(call):
        return json.dumps({"items": [{"task_id": "t1", "meta": call.tasks[0]["meta"],
                                      "verdict": "match"}]})

    session = one_shot(echo)
    result = session.run_batch("r", tasks, LABEL_SCHEMA, on_exhausted="return")
    assert result.values == {}
    assert only_receipt(session).status == "rejected"


class ReturnsAnything:
    """A provider breaking the contract: complete() hands back whatever it was given."""

    name = "odd"

    def __init__(self, value):
        self.value = value

    async def complete(self, call):
        return self.value(call) if callable(self.value) else self.value


def test_a_provider_returning_a_bare_string_is_judged_like_a_reply():
    session = Session(ReturnsAnything(items_reply), repairs=0, replays=0)
    assert session.run_batch("r", review_tasks(2), LABEL_SCHEMA).resolved


def test_a_provider_returning_no_reply_at_all_gets_provider_error_receipts_and_the_run_ends():
    session = Session(ReturnsAnything(42), repairs=0, replays=0)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    assert result.values == {}
    receipts = session.ledger.attempts("r")
    assert {r.status for r in receipts} == {"provider_error"}
    assert "not a Reply" in receipts[0].errors[0]["message"]
    assert all(r.provider == "odd" for r in receipts)


def test_a_schema_coercing_a_string_into_infinity_is_rejected_not_committed():
    class Scored(BaseModel):
        score: float

    text = '{"items": [{"task_id": "t1", "score": "1e400"}]}'
    session = one_shot(lambda call: text)
    result = session.run_batch("r", [{"task_id": "t1", "prompt": "p"}], Scored,
                               on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("r") == {}
    receipt = only_receipt(session)
    assert receipt.status == "rejected" and receipt.errors[0]["type"] == "schema"


# -- schema keywords ---------------------------------------------------------------------------
def test_a_schema_with_x_and_vendor_keywords_runs_and_its_notes_name_them():
    verdict = {**LABEL_SCHEMA["properties"]["verdict"], "x-ui": {"widget": "radio"},
               "discriminator": {"propertyName": "kind"}}
    schema = {**LABEL_SCHEMA, "x-owner": "team-a", "properties": {"verdict": verdict}}
    result = one_shot(items_reply).run_batch("r", review_tasks(2), schema, pack=2)
    assert result.status == "resolved" and result.calls == 1
    (note,) = [n for n in result.notes if "JSON Schema does not define" in n]
    for named in ("x-owner (at <root>)", "x-ui (at properties/verdict)",
                  "discriminator (at properties/verdict)"):
        assert named in note


class Colour(str, Enum):  # noqa: UP042 (the pre-3.11 spelling pydantic users write)
    RED = "red"
    BLUE = "blue"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=0, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    name: str = Field(min_length=1, max_length=20, pattern=r"^\w+$")


class Owner(BaseModel):
    colour: Colour
    nickname: Optional[str] = None  # noqa: UP045 (the Optional spelling, as users write it)
    pet: Annotated[Union[Cat, Dog], Field(discriminator="kind")]  # noqa: UP007
    pets: list[Annotated[Cat | Dog, Field(discriminator="kind")]] = Field(max_length=3)
    score: float = Field(gt=0, lt=1, multiple_of=0.25, description="how sure", examples=[0.5])
    scores: dict[str, int] = Field(default_factory=dict, json_schema_extra={"x-ui": "table"})
    pair: tuple[int, str] = (1, "a")
    label: Literal["yes", "no"] = Field(title="Label")


@pytest.mark.parametrize("extra", [
    {"typeof": "string"}, {"deepRequired": ["/a/b"]}, {"deepProperties": {}},
    {"properties_order": ["verdict"]}, {"items_": 3}], ids=lambda e: next(iter(e)))
def test_a_vendor_keyword_that_extends_a_known_one_is_kept_with_a_note_not_refused(extra):
    """ajv-keywords' ``typeof``, ``deepRequired``: no typo of ``type`` or ``required``."""
    item = compile_schema({**LABEL_SCHEMA, **extra})
    assert item.unknown_keywords == (f"{next(iter(extra))} (at <root>)",)


@pytest.mark.parametrize("model", [Owner, Cat, Dog], ids=lambda m: m.__name__)
@pytest.mark.parametrize("mode", ["validation", "serialization"])
def test_every_json_schema_pydantic_writes_is_accepted_as_a_schema_dict(model, mode):
    """Enums, Optional, nested models, discriminated unions, Field constraints, Literal: only
    pydantic's own vendor keyword (``discriminator``) and an ``x-`` one are left unchecked."""
    item = compile_schema(model.model_json_schema(mode=mode))
    assert {k.split()[0] for k in item.unknown_keywords} <= {"discriminator", "x-ui"}
    assert ("discriminator (at properties/pet)" in item.unknown_keywords) == (model is Owner)


# -- a validator that crashes ------------------------------------------------------------------
def _field_of(item, name):
    return item[name]


def _crashing_check(item, task):
    return _field_of(item, "lable") == "x"


def _deep_check(item, task, depth=30):
    return _deep_check(item, task, depth - 1) if depth else item["lable"]


def test_a_crashed_validators_receipt_keeps_its_own_frames_and_none_of_batchjsons():
    session = one_shot(items_reply)
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=_crashing_check,
                               on_exhausted="return")
    (error,) = only_receipt(session).errors  # as the ledger keeps it
    assert error["message"].endswith("validator raised KeyError: 'lable'")
    line = _crashing_check.__code__.co_firstlineno + 1
    assert error["traceback"].splitlines() == [
        f'File "{__file__}", line {line}, in _crashing_check',
        '  return _field_of(item, "lable") == "x"',
        f'File "{__file__}", line {_field_of.__code__.co_firstlineno + 1}, in _field_of',
        "  return item[name]"]
    assert f'line {line}, in _crashing_check' in result.failure_report()


class _LabelError(Exception):
    def __str__(self):
        return f"bad label {self.lable!r}"  # a typo in the user's own exception class


def _raises_unprintable(item, task):
    raise _LabelError()


def test_a_validator_exception_that_cannot_be_printed_is_its_error_never_the_models():
    """Its ``__str__`` raising is the validator's bug too: a ``validator_error`` with its own
    frames, one call, never repaired or replayed as if the model had returned nonsense."""
    calls = []
    session = Session(CallableProvider(lambda call: calls.append(call) or items_reply(call)))
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=_raises_unprintable,
                               on_exhausted="return")
    (error,) = only_receipt(session).errors
    assert len(calls) == 1 and result.calls == 1 and error["type"] == "validator_error"
    assert "validator raised _LabelError: <its __str__ raised AttributeError(" in error["message"]
    assert error["traceback"].endswith("  raise _LabelError()")


def _lists_every_label(item, task):
    raise ValueError("wrong label; allowed: " + ", ".join(f"L{i}" for i in range(300_000)))


def test_a_huge_validator_message_is_capped_where_it_is_kept_shown_and_sent_for_repair():
    prompts = []
    session = Session(CallableProvider(lambda call: prompts.append(call.prompt) or
                                       items_reply(call)), repairs=1, replays=0)
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=_lists_every_label,
                               on_exhausted="return")
    kept = [e["message"] for a in session.ledger.attempts("r") for e in a.errors]
    assert len(prompts) == 2 and len(prompts[1]) < 5_000  # the repair call is not 2.5 MB
    assert kept and all(len(m) < 2_100 and m.endswith(" more characters cut)") for m in kept)
    assert "characters cut)" in prompts[1] and len(result.failure_report()) < 10_000


def test_a_deep_validator_traceback_is_capped_to_its_innermost_frames():
    session = one_shot(items_reply)
    session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=_deep_check,
                      on_exhausted="return")
    frames = only_receipt(session).errors[0]["traceback"].splitlines()
    assert frames[0] == "... 23 earlier frame(s)" and len(frames) == 1 + 8 * 2
    assert frames[-1] == '  return _deep_check(item, task, depth - 1) if depth else item["lable"]'
