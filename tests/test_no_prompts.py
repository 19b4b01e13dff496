"""llm_batch_json with no prompts: droste's empty result, and bad input still refused."""

from __future__ import annotations

import pytest

from batchjson import Session
from batchjson._errors import InvalidBatch
from batchjson.testing.simulated import SimulatedModel

VALUE_SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}},
                "required": ["label"]}


def test_llm_batch_json_with_no_prompts_returns_droste_empty_result():
    droste = pytest.importorskip("droste.structured")

    class NoCalls:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return [], []

    expected = droste.structured_batch(NoCalls(), [], VALUE_SCHEMA)
    model = SimulatedModel(answer=lambda t: {"label": "x"})
    session = Session(model)
    assert session.llm_batch_json([], VALUE_SCHEMA) == expected
    assert model.calls == 0


def test_llm_batch_json_with_no_prompts_still_refuses_a_bad_schema():
    session = Session(SimulatedModel())
    with pytest.raises(InvalidBatch, match="invalid JSON Schema"):
        session.llm_batch_json([], {"type": "no-such-type"})
