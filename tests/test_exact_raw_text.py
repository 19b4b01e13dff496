"""The model's output is sliced out of the response body, never re-serialised: whatever the
spacing, key order, number spelling or escapes, the slice is exactly that value's text."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from batchjson._providers.anthropic import value_span

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=20)


def spell(value: Any, rng: random.Random) -> str:
    """One of many JSON spellings of ``value``: odd spacing, escapes, exponents."""
    space = rng.choice(["", " ", "\n  ", "\t"])
    if isinstance(value, dict):
        members = [f"{json.dumps(k, ensure_ascii=rng.random() < 0.5)}{space}:{space}"
                   f"{spell(v, rng)}" for k, v in value.items()]
        return "{" + space + f"{space},{space}".join(members) + space + "}"
    if isinstance(value, list):
        return "[" + space + f",{space}".join(spell(v, rng) for v in value) + space + "]"
    if isinstance(value, float) and rng.random() < 0.5:
        return f"{value:e}" if value == float(f"{value:e}") else repr(value)
    return json.dumps(value, ensure_ascii=rng.random() < 0.5)


@settings(max_examples=150, deadline=None)
@given(VALUES, st.integers(0, 2**32))
def test_the_slice_is_the_exact_text_of_the_embedded_value(value, seed):
    rng = random.Random(seed)
    inner = spell(value, rng)
    body = ('{"id": "msg", "content": [ {"type": "text", "text": "hi"} , {"type": "tool_use", '
            f'"input" :{rng.choice(["", " ", chr(10)])}{inner} }} ], "usage": {{}} }}')
    span = value_span(body, ["content", 1, "input"])
    assert span is not None
    assert body[span[0]:span[1]] == inner
    assert json.loads(body[span[0]:span[1]]) == json.loads(inner)


def test_a_missing_path_or_broken_body_has_no_span():
    assert value_span('{"content": []}', ["content", 0, "input"]) is None
    assert value_span('{"content": [{"type": "text"}]}', ["content", 0, "input"]) is None
    assert value_span('{"content": [1, 2', ["content", 5]) is None
    assert value_span("[" * 100_000, [0]) is None  # too deep: no crash


def test_a_key_named_twice_resolves_to_its_last_value_as_json_loads_does():
    body = '{"input": {"a": 1}, "input": {"b": 2}}'
    span = value_span(body, ["input"])
    assert span is not None and body[span[0]:span[1]] == '{"b": 2}'
