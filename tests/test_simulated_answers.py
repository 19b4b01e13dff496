"""The simulated model answers real schemas: one seeded generator, every keyword batchjson
accepts, identity echoed, and a keyword it cannot meet named before anything runs."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field, field_validator

from batchjson import ProviderSetupError, Session, SimulatedModel
from batchjson.testing import LoopbackServer
from batchjson.testing._values import Generator, Unanswerable
from tests.helpers import review_tasks


class Tone(enum.Enum):
    WARM = "warm"
    COLD = "cold"


class Aspect(BaseModel):
    name: str = Field(min_length=2, max_length=20)
    weight: float = Field(gt=0, le=1)


class Review(BaseModel):
    verdict: Literal["match", "no_match"]
    stars: int = Field(ge=1, le=5)
    confidence: float = Field(ge=0, le=1)
    spam: bool
    summary: str = Field(min_length=10, max_length=80)
    sku: str = Field(pattern=r"^[A-Z]{3}-\d{4}$")
    tags: list[str] = Field(min_length=1, max_length=4)
    aspects: list[Aspect] = Field(min_length=1)
    tone: Tone
    seen_at: datetime.datetime
    reviewer: uuid.UUID
    price: float = Field(multiple_of=0.25, ge=1, le=100)
    note: str | None


def reviews(n: int) -> list[dict]:
    return [{"task_id": f"r{i:04d}", "product_id": f"p{i % 7}", "prompt": f"Review {i}: ..."}
            for i in range(n)]


def test_the_named_simulated_provider_resolves_a_pydantic_batch_of_many_required_types():
    session = Session(provider="simulated")
    result = session.run_batch("reviews", reviews(40), Review, pack=8)
    assert result.status == "resolved" and len(result.values) == 40
    assert result.rejected_returns == 0 and result.calls == 5
    for value in result.values.values():
        assert isinstance(value, Review)
        assert value.sku[3] == "-" and 1 <= value.stars <= 5 and value.aspects
    stored = session.ledger.checkpoint("reviews")
    assert all(Review.model_validate(item) for item in stored.values())
    session.close()


def test_batchjson_provider_simulated_answers_a_json_schema_with_identity_echoed(monkeypatch):
    monkeypatch.setenv("BATCHJSON_PROVIDER", "simulated")
    schema = {"type": "object", "required": ["verdict", "score"],
              "properties": {"verdict": {"enum": ["match", "no_match"]},
                             "score": {"type": "integer", "minimum": 0, "maximum": 10},
                             "case_id": {"type": "string"}}}
    session = Session()
    result = session.run_batch("review", review_tasks(10), schema, pack=5)
    assert result.status == "resolved" and result.rejected_returns == 0
    raws = [json.loads(r.raw) for r in session.ledger.attempts("review")]
    for raw in raws:
        for item in raw["items"]:  # the declared task field is echoed as the task has it
            assert item["case_id"] == "gold-pair-078" and "task_id" in item
    session.close()


def test_the_same_task_gets_the_same_answer_in_every_session_and_seed_decides_it():
    def values(seed: int, pack: int) -> dict:
        session = Session(SimulatedModel(seed=seed))
        out = session.run_batch("r", reviews(6), Review, pack=pack).values
        session.close()
        return {k: v.model_dump() for k, v in out.items()}

    assert values(0, 3) == values(0, 3) == values(0, 2)  # packing does not change an answer
    assert values(0, 3) != values(1, 3)


def test_a_pattern_the_generator_cannot_meet_is_named_before_anything_is_recorded():
    schema = {"type": "object", "required": ["code"],
              "properties": {"code": {"type": "string", "pattern": "^(?=.*Z)[a-y]+$"}}}
    model = SimulatedModel()
    session = Session(model)
    with pytest.raises(ProviderSetupError) as caught:
        session.run_batch("r", reviews(3), schema)
    message = str(caught.value)
    assert "keyword 'pattern' at $.code" in message and "SimulatedModel(answer=" in message
    assert model.calls == 0 and session.ledger.batch_names() == []
    session.close()


def test_a_pydantic_validator_the_generator_cannot_meet_is_refused_by_its_own_message():
    class Picky(BaseModel):
        word: str

        @field_validator("word")
        @classmethod
        def only_yes(cls, value: str) -> str:
            if value != "yes":
                raise ValueError("word must be yes")
            return value

    model = SimulatedModel()
    session = Session(model)
    with pytest.raises(ProviderSetupError, match="word must be yes"):
        session.run_batch("r", reviews(2), Picky)
    assert model.calls == 0
    session.close()


class Even(BaseModel):
    x: int

    @field_validator("x")
    @classmethod
    def even(cls, value: int) -> int:
        if value % 2:
            raise ValueError("x must be even")
        return value


SOMETIMES_INVALID = {  # schemas where an earlier generator's answer failed for some seeds
    "oneOf integer|number": {"type": "object", "required": ["x"], "properties": {
        "x": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
    "oneOf overlapping ranges": {"type": "object", "required": ["x"], "properties": {
        "x": {"oneOf": [{"type": "number", "minimum": 0, "maximum": 10},
                        {"type": "number", "minimum": 5, "maximum": 20}]}}},
    "uniqueItems over 1, 1.0, true": {"type": "object", "required": ["x"], "properties": {
        "x": {"type": "array", "items": {"enum": [1, 1.0, True]}, "minItems": 2,
              "uniqueItems": True}}},
    "uniqueItems over booleans": {"type": "object", "required": ["x"], "properties": {
        "x": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}}},
}


@pytest.mark.parametrize("name", list(SOMETIMES_INVALID))
def test_every_seed_s_answers_to_oneof_and_uniqueitems_schemas_resolve(name: str):
    """oneOf takes a value valid for exactly one branch (an integer is a number too), and
    uniqueItems compares as JSON Schema does (1 equals 1.0, true does not): for every seed,
    every task's answer passes, so no batch ends unresolved."""
    for seed in range(12):
        session = Session(SimulatedModel(seed=seed), repairs=0, replays=0)
        result = session.run_batch("b", reviews(25), SOMETIMES_INVALID[name],
                                   on_exhausted="return")
        assert result.status == "resolved" and result.rejected_returns == 0, (seed, result)
        session.close()


def test_a_pydantic_validator_some_answers_fail_is_refused_for_every_seed_before_any_call():
    """The simulated model cannot read code: each pending task's answer is checked up front,
    so the run is refused, saying why and how many, instead of ending unresolved after calls
    (its answer to a task never changes, so no repair could help)."""
    for seed in range(8):
        model = SimulatedModel(seed=seed)
        session = Session(model, repairs=0, replays=0)
        with pytest.raises(ProviderSetupError) as caught:
            session.run_batch("b", reviews(10), Even)
        message = str(caught.value)
        assert "of 10 task(s) fail the checks of Even's own code" in message, message
        assert "x must be even" in message and "cannot read code" in message
        assert "same answer on every attempt" in message and "SimulatedModel(answer=" in message
        assert model.calls == 0 and session.ledger.batch_names() == []
        session.close()


def test_a_schema_part_the_generator_cannot_honour_is_not_blamed_on_code():
    schema = {"type": "object", "required": ["v"],
              "properties": {"self": {"$ref": "#"}, "v": {"type": "string"}}}
    session = Session(SimulatedModel())
    with pytest.raises(ProviderSetupError) as caught:
        session.run_batch("b", reviews(2), schema)
    message = str(caught.value)
    assert "its generator cannot honour" in message and "code" not in message
    session.close()


def test_an_answer_function_still_decides_the_answers():
    session = Session(SimulatedModel(answer=lambda task: {"verdict": "match"}))
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}},
              "required": ["verdict"]}
    result = session.run_batch("r", reviews(4), schema, pack=2)
    assert {v["verdict"] for v in result.values.values()} == {"match"}
    session.close()


def test_the_loopback_server_answers_a_scalar_schema_with_the_same_generator():
    from batchjson._providers.anthropic import AnthropicProvider

    with LoopbackServer() as server:
        provider = AnthropicProvider("claude-haiku-4-5", base_url=server.anthropic_base_url,
                                     api_key="k")
        session = Session(provider)
        out = session.llm_batch_json(["a", "b", "c"], {"type": "integer", "minimum": 7,
                                                       "multipleOf": 7}, name="sevens")
        session.close()
    assert out["errors"] == [] and all(v >= 7 and v % 7 == 0 for v in out["values"])


# -- every keyword ---------------------------------------------------------------------------
KEYWORDS = {
    "type list": {"type": ["integer", "null"]},
    "enum and const": {"type": "object", "required": ["a", "b"],
                       "properties": {"a": {"enum": [1, "x", None]}, "b": {"const": [1, 2]}}},
    "closed object": {"type": "object", "properties": {"a": {"type": "string"}},
                      "required": ["a", "z"], "additionalProperties": {"type": "boolean"}},
    "pattern properties": {"type": "object", "required": ["x_1"], "additionalProperties": False,
                           "patternProperties": {"^x_": {"type": "integer"}}},
    "property counts": {"type": "object", "minProperties": 3, "maxProperties": 3,
                        "properties": {"a": {"type": "integer"}}},
    "dependent required": {"type": "object", "required": ["card"],
                           "properties": {"card": {"type": "string"},
                                          "billing": {"type": "string"}},
                           "dependentRequired": {"card": ["billing"]}},
    "tuples": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
               "items": False, "minItems": 2},
    "unique items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 5},
                     "minItems": 4, "uniqueItems": True},
    "contains": {"type": "array", "items": {"type": "integer"}, "maxItems": 3,
                 "contains": {"minimum": 100}, "minContains": 2},
    "exclusive bounds": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.5},
    "draft 4 exclusive": {"$schema": "http://json-schema.org/draft-04/schema#",
                          "type": "integer", "minimum": 3, "exclusiveMinimum": True,
                          "maximum": 4},
    "integer multiple": {"type": "integer", "multipleOf": 15, "minimum": 31},
    "float multiple": {"type": "number", "multipleOf": 0.1, "minimum": 0.25, "maximum": 0.75},
    "string lengths": {"type": "string", "minLength": 40, "maxLength": 41},
    "pattern with lengths": {"type": "string", "pattern": "^(ab|c)+$", "minLength": 7},
    "formats": {"type": "object", "required": ["e", "d", "u", "i", "h", "t"],
                "properties": {"e": {"format": "email", "type": "string"},
                               "d": {"format": "date", "type": "string"},
                               "u": {"format": "uuid", "type": "string"},
                               "i": {"format": "ipv4", "type": "string"},
                               "h": {"format": "hostname", "type": "string"},
                               "t": {"format": "date-time", "type": "string"}}},
    "any of": {"anyOf": [{"type": "string", "maxLength": 0}, {"type": "integer"}]},
    "one of": {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
    "all of": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                          "required": ["a"]},
                         {"properties": {"a": {"minimum": 5}, "b": {"type": "string"}},
                          "required": ["b"]}]},
    "not": {"type": "integer", "not": {"enum": [0, 1, 2]}, "minimum": 0},
    "if then else": {"type": "object", "required": ["kind"],
                     "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
                     "if": {"properties": {"kind": {"const": "a"}}},
                     "then": {"required": ["x"]}, "else": {"not": {"required": ["x"]}}},
    "refs and defs": {"$defs": {"Leaf": {"type": "object", "required": ["v"],
                                         "properties": {"v": {"type": "boolean"}}}},
                      "type": "object", "required": ["leaf"],
                      "properties": {"leaf": {"$ref": "#/$defs/Leaf"}}},
    "definitions (draft 7)": {"definitions": {"N": {"type": "integer", "maximum": -3}},
                              "$ref": "#/definitions/N"},
    "recursion": {"$defs": {"Node": {"type": "object", "required": ["kids"],
                                     "properties": {"kids": {"type": "array",
                                                             "items": {"$ref": "#/$defs/Node"}}}}},
                  "$ref": "#/$defs/Node"},
    "nullable (OpenAPI)": {"type": "string", "nullable": True, "minLength": 2},
    "pydantic": Review.model_json_schema(),
}


@pytest.mark.parametrize("name", list(KEYWORDS))
@pytest.mark.parametrize("minimal", [False, True], ids=["drawn", "smallest"])
def test_every_accepted_keyword_gets_a_value_the_schema_accepts(name: str, minimal: bool):
    schema = KEYWORDS[name]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = cls(schema, format_checker=cls.FORMAT_CHECKER)
    for seed in ("a", "b", "c"):
        value = Generator(schema, seed, minimal=minimal).value()
        assert checker.is_valid(value), (name, value)


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"type": "integer", "minimum": 5, "maximum": 3}, "minimum"),
    ({"type": "array", "items": {"enum": [1, 2]}, "minItems": 3, "uniqueItems": True},
     "uniqueItems"),
    ({"type": "string", "format": "email", "maxLength": 5}, "format"),
    ({"$defs": {"N": {"type": "object", "required": ["next"],
                      "properties": {"next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"},
     "$ref"),
    ({"type": "object", "required": ["x"], "additionalProperties": False}, "additionalProperties"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "type"),
])
def test_a_keyword_no_value_can_meet_is_named(schema: dict, keyword: str):
    with pytest.raises(Unanswerable) as caught:
        Generator(schema, "s").value()
    assert caught.value.keyword == keyword
