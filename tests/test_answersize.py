"""A schema's answer size, read from the schema alone: the smallest answer is never more than a
valid answer (the input check refuses only a pack that cannot fit), and the largest is never
less than a valid answer, or unbounded where the schema sets no limit."""

from __future__ import annotations

import datetime
import json
import uuid

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from batchjson._content.schema import compile_schema, largest_answer, smallest_answers, wire_schema
from batchjson.testing._values import Generator
from batchjson.testing.simulated import answer_item
from tests.test_pack_fit import SCHEMA as PACK_FIT_SCHEMA
from tests.test_simulated_answers import KEYWORDS


def size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def least(schema) -> object:
    [text] = smallest_answers(compile_schema(schema), [{"task_id": "t"}], [], "value")
    return json.loads(text)


def test_the_smallest_answer_of_a_pack_is_what_the_schema_requires_with_each_task_s_echoes():
    tasks = [{"task_id": f"review-{i}", "case_id": f"product-{i % 2}", "prompt": "?"}
             for i in range(3)]
    texts = smallest_answers(compile_schema(PACK_FIT_SCHEMA), tasks, ["task_id", "case_id"],
                             "items")
    assert texts == [f'{{"task_id":"review-{i}","case_id":"product-{i % 2}",'
                     '"verdict":"match","stars":1}' for i in range(3)]
    assert smallest_answers(compile_schema(PACK_FIT_SCHEMA), tasks, [], "value") == [
        '{"verdict":"match","stars":1}'] * 3


class Part(BaseModel):
    name: str = Field(min_length=2)
    count: int = Field(ge=3, multiple_of=2)


class Order(BaseModel):
    status: str = Field(pattern="^[a-z]+$")
    parts: list[Part] = Field(min_length=1)
    placed: datetime.datetime
    ref: uuid.UUID
    price: float = Field(ge=0.25, multiple_of=0.1)
    debt: int = Field(lt=-9)
    note: str | None
    kind: str = "plain"  # optional: left out


def test_a_pydantic_model_s_smallest_answer_follows_refs_nullable_fields_and_bounds():
    assert least(Order) == {
        "status": "", "parts": [{"name": "aa", "count": 4}],
        "placed": "2024-01-01T00:00:00Z", "ref": "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa",
        "price": 0.3, "debt": -10, "note": ""}


@pytest.mark.parametrize("name", list(KEYWORDS))
def test_the_smallest_answer_is_never_more_than_an_answer_the_schema_accepts(name: str):
    schema = KEYWORDS[name]
    smallest = size(least(schema))
    for seed in ("a", "b", "c"):
        for minimal in (True, False):
            assert smallest <= size(Generator(schema, seed, minimal=minimal).value()), name


def test_the_largest_answer_counts_each_part_at_its_longest():
    assert largest_answer({"type": "boolean"}) == len("false")
    assert largest_answer({"enum": ["a", "longer", 7]}) == len('"longer"')
    assert largest_answer({"type": "integer", "minimum": -5, "maximum": 300}) == len("300.0")
    assert largest_answer({"type": "string", "maxLength": 3}) == 2 + 3 * len("\\u001f")
    assert largest_answer({"type": "array", "items": {"type": "null"}, "maxItems": 2}) == len(
        "[null,null]")
    closed = {"type": "object", "additionalProperties": False,
              "properties": {"ok": {"type": "boolean"}, "n": {"const": 12}}}
    assert largest_answer(closed) == len('{"ok":false,"n":12}')
    assert largest_answer({"anyOf": [{"type": "null"}, {"type": "boolean"}]}) == 5
    both = [{"type": "string", "maxLength": 4}, {"type": "string", "maxLength": 1}]
    assert largest_answer({"allOf": both}) == 2 + 1 * len("\\u001f")  # the tighter limit


@pytest.mark.parametrize("schema", [
    {"type": "string"}, {"type": "integer", "minimum": 0}, {"type": "number"},
    {"type": "array", "items": {"type": "boolean"}}, {"type": "object"},
    {"type": "object", "properties": {"a": {"type": "boolean"}}},  # open to other properties
    {}, True, {"anyOf": [{"type": "boolean"}, {"type": "string"}]},
    {"$defs": {"N": {"type": "object", "additionalProperties": False, "properties": {
        "next": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"},  # nests without end
    Order.model_json_schema(),
], ids=lambda s: json.dumps(s)[:40])
def test_the_largest_answer_is_unbounded_where_the_schema_sets_no_limit(schema):
    assert largest_answer(schema) is None


BOUNDED = {
    "$defs": {"Tag": {"type": "string", "maxLength": 6}},
    "type": "object", "additionalProperties": False, "required": ["verdict", "stars"],
    "properties": {
        "verdict": {"enum": ["match", "no_match"]},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "score": {"anyOf": [{"type": "number", "minimum": -1, "maximum": 1}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 3},
        "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"const": "x"}],
                 "items": False},
        "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
        "word": {"type": "string", "minLength": 2, "maxLength": 5},
    },
}


def test_every_drawn_answer_of_a_bounded_schema_fits_its_largest_answer():
    largest = largest_answer(BOUNDED)
    assert largest is not None and size(least(BOUNDED)) <= largest
    for seed in range(60):
        value = Generator(BOUNDED, str(seed)).value()
        assert size(value) <= largest, value


def test_the_wire_schema_of_a_closed_item_schema_bounds_the_whole_reply():
    item = compile_schema({**BOUNDED, "properties": {**BOUNDED["properties"],
                                                     "task_id": {"type": "string"}}})
    tasks = [{"task_id": f"task-{i}", "prompt": "?"} for i in range(4)]
    wire = wire_schema(item, tasks, ["task_id"])
    largest = largest_answer(wire)
    assert largest is not None
    for seed in range(20):
        reply = {"items": [answer_item(wire, t, ["task_id"], f"{seed}:{t['task_id']}")
                           for t in tasks]}
        jsonschema.validate(reply, wire)
        assert size(reply) <= largest


@given(st.text(max_size=8))
def test_no_string_within_max_length_outgrows_the_largest_answer(text: str):
    assert size(text) <= largest_answer({"type": "string", "maxLength": 8})


@given(st.integers(-1000, 99) | st.integers(-1000, 99).map(float)
       | st.floats(-1000, 99, allow_nan=False))
def test_no_number_within_the_bounds_outgrows_the_largest_answer(number: float):
    assert size(number) <= largest_answer({"type": "number", "minimum": -1000, "maximum": 99})
    if float(number).is_integer():
        assert size(number) <= largest_answer({"type": "integer", "minimum": -1000,
                                               "maximum": 99})
