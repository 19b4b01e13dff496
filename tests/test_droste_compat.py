"""batchjson's llm_batch_json returns what droste's structured_batch returns, given the same
model outputs, and then also fixes droste's identity ratchet."""

from __future__ import annotations

import json
import re

import pytest

droste_structured = pytest.importorskip("droste.structured")

from batchjson import CallableProvider, InvalidBatch, Session  # noqa: E402

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
PROMPTS = [f"<<{i}>> label this" for i in range(5)]


def script(index: int, attempt: int) -> str:
    """Per-prompt behaviour: fine; malformed then fine; always wrong type; validator rejects
    then accepts; validator crash."""
    if index == 1 and attempt == 0:
        return '{"label": '
    if index == 2:
        return '{"label": 7}'
    if index == 3:
        return json.dumps({"label": "bad" if attempt == 0 else "good"})
    if index == 4:
        return json.dumps({"label": "crash"})
    return json.dumps({"label": "good"})


def validator(value, index):
    if value["label"] == "crash":
        raise TypeError("validator bug")
    if value["label"] != "good":
        raise ValueError("label must be good")


class ScriptedSubcalls:
    """droste's SubcallClient protocol, answering from the same script."""

    def __init__(self):
        self.seen: dict[int, int] = {}

    def llm_batch_with_errors(self, prompts, contexts=None):
        out = []
        for prompt in prompts:
            index = int(re.search(r"<<(\d+)>>", prompt).group(1))
            attempt = self.seen.get(index, 0)
            self.seen[index] = attempt + 1
            out.append(script(index, attempt))
        return out, []


def batchjson_model(call):
    index = call.tasks[0]["index"]
    return script(index, call.attempt)


def test_same_return_shape_and_content_as_droste():
    # Without the crashing prompt: batchjson, unlike droste, stops opening calls once a
    # validator crashes (tests/test_replay.py), so that case is compared there.
    clean = PROMPTS[:4]
    expected = droste_structured.structured_batch(
        ScriptedSubcalls(), clean, SCHEMA, max_repair_attempts=1, validator=validator)
    session = Session(CallableProvider(batchjson_model), replays=0)
    got = session.llm_batch_json(clean, SCHEMA, max_repair_attempts=1, validator=validator)

    assert set(got) == {"values", "errors", "attempts", "repairs_made"}
    assert got["values"] == expected["values"]
    assert got["attempts"] == expected["attempts"]
    assert got["repairs_made"] == expected["repairs_made"]
    assert [(e["index"], e["type"], e["attempts"]) for e in got["errors"]] == [
        (e["index"], e["type"], e["attempts"]) for e in expected["errors"]]
    assert all(isinstance(e["error"], str) and e["error"] for e in got["errors"])


def test_droste_evidence_ratchets_where_batchjson_resolves():
    """droste keys by validator identity: re-defining the same validator orphans evidence."""
    cell = (
        "def check(value, index):\n"
        "    if value['label'] != 'good':\n"
        "        raise ValueError('label must be good')\n"
        "result = llm_batch_json(prompts, schema, validator=check, max_repair_attempts=0)\n"
    )

    class AlwaysBad:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return ['{"label": "bad"}'] * len(prompts), []

    evidence = droste_structured._StructuredBatchEvidence()
    droste_ns = {"llm_batch_json": droste_structured.bind_structured_batch(AlwaysBad(), evidence),
                 "prompts": PROMPTS[:2], "schema": SCHEMA}
    session = Session(CallableProvider(lambda call: '{"label": "bad"}'), replays=0)
    ours_ns = {"llm_batch_json": session.llm_batch_json, "prompts": PROMPTS[:2],
               "schema": SCHEMA}
    for _ in range(3):
        exec(cell, droste_ns)
        exec(cell, ours_ns)
    assert evidence.minimum_exact_retry_calls == 6  # grows with every re-execution
    assert session.evidence.minimum_exact_retry_calls == 2  # stays at the one request's size


@pytest.mark.parametrize(("args", "message"), [
    ((["a"], SCHEMA, ["c1", "c2"]), "contexts length"),
    (("one prompt", SCHEMA), "prompts must be a list of strings"),
    ((["a"], SCHEMA, None, -1), "max_repair_attempts must be an integer >= 0"),
    (([1], SCHEMA), "prompt must be a string"),
    ((["a"], {"type": "nonsense"}), "invalid JSON Schema"),
])
def test_bad_arguments_raise_value_errors_like_droste(args, message):
    session = Session(CallableProvider(lambda call: "{}"))
    with pytest.raises(InvalidBatch, match=message) as raised:
        session.llm_batch_json(*args)
    assert isinstance(raised.value, ValueError)  # droste callers catch ValueError
