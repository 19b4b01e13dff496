"""Identity values are compared as the JSON the request holds: no Python conflations, no
duplicate keys, no schema coercion into another value."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from batchjson import CallableProvider, InvalidBatch, Session
from batchjson._content.schema import compile_schema
from tests.helpers import LABEL_SCHEMA, accept_items


def test_nested_identity_values_are_compared_as_json_not_python():
    tasks = [{"task_id": "t1", "case": {"ids": [1, 2], "flag": 1}, "prompt": "p"}]
    swapped = {"items": [{"task_id": "t1", "case": {"ids": [True, 2], "flag": 1.0},
                          "verdict": "match"}]}
    verdict = accept_items(json.dumps(swapped), tasks, ("task_id", "case"),
                           compile_schema(LABEL_SCHEMA), None)
    assert not verdict.accepted
    assert verdict.errors[0]["type"] == "identity"


def test_an_item_naming_an_identity_field_twice_is_rejected():
    tasks = [{"task_id": "t1", "case_id": "gold-pair-078", "prompt": "p"}]
    text = ('{"items": [{"task_id": "t1", "case_id": "gold-pair-079", '
            '"case_id": "gold-pair-078", "verdict": "match"}]}')
    verdict = accept_items(text, tasks, ("task_id", "case_id"), compile_schema(LABEL_SCHEMA),
                           None)
    assert not verdict.accepted
    assert verdict.errors[0]["type"] == "json"


def test_a_model_schema_cannot_commit_an_identity_value_other_than_the_request():
    class Label(BaseModel):
        case_id: int  # disagrees with the tasks, whose case_id is the string "078"
        verdict: str

    tasks = [{"task_id": "t1", "case_id": "078", "prompt": "p"}]
    reply = json.dumps({"items": [{"task_id": "t1", "case_id": "078", "verdict": "match"}]})
    session = Session(CallableProvider(lambda call: reply), repairs=0, replays=0)
    with pytest.raises(InvalidBatch, match="case_id"):  # refused before any call
        session.run_batch("r", tasks, Label, identity="task_id,case_id", on_exhausted="return")
    assert session.ledger.checkpoint("r") == {}  # 78 never committed for case "078"
    assert session.ledger.attempts("r") == []
