"""OpenAI requests the real API accepts: strict schemas that hold, and the reasoning models.

The loopback server refuses, with the real API's recorded 400s, what OpenAI refuses
(batchjson/testing/_openai_rules.py: strict mode's subset and the reasoning models' parameters),
so a run it resolves sends nothing the real API would answer with a 400 on every call.
"""

from __future__ import annotations

import openai
import pytest

from batchjson import ProviderSetupError, Session, SimulatedModel
from batchjson._content.schema import compile_schema, wire_schema
from batchjson._providers.base import Call
from batchjson._providers.openai import OpenAIProvider
from batchjson._providers.strict import MAX_ENUM_VALUES, _shape_form
from batchjson.testing import LoopbackServer
from tests.helpers import items_call, review_tasks
from tests.test_providers_e2e import KEY

IDENTITY = ("task_id", "case_id", "candidate_id")
OPTIONAL = {"type": "object", "required": ["verdict"], "properties": {
    "verdict": {"enum": ["match", "no_match"]},
    "note": {"type": "string"},  # optional, and null is not a string
    "evidence": {"type": "object", "properties": {"page": {"type": "integer"},
                                                   "quote": {"type": "string"}},
                 "required": ["page"]}}}


def _odd(task) -> bool:
    return int(task["candidate_id"].rsplit("-", 1)[1]) % 2 == 1


def nulls_for_absent(task):
    """What a model held to the strict form writes: null for each optional field it leaves
    out (every property is required there)."""
    if _odd(task):
        return {"verdict": "match", "note": None, "evidence": {"page": 3, "quote": None}}
    return {"verdict": "no_match", "note": "differs", "evidence": None}


def openai_session(server, model="gpt-4o-mini", **kw) -> Session:
    provider = OpenAIProvider(model, base_url=server.base_url, api_key=KEY, **kw)
    return Session(provider, repairs=0, replays=0)


def test_optional_fields_go_out_strict_and_their_introduced_nulls_are_dropped_before_judging():
    """Faults: an optional field sent required but not nullable (the model must invent a
    value), an object left open (a 400 on every call), or the nulls the strict form lets the
    model write kept when judging (``note: null`` is not a string: every return rejected)."""
    with LoopbackServer(SimulatedModel(answer=nulls_for_absent), api_key=KEY) as server:
        session = openai_session(server)
        result = session.run_batch("r", review_tasks(4), OPTIONAL, identity=IDENTITY, pack=2)
        sent = server.last_body["response_format"]
    assert result.status == "resolved" and result.calls == 2 and not result.notes
    assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True
    item = sent["json_schema"]["schema"]["properties"]["items"]["items"]
    assert item["additionalProperties"] is False
    assert set(item["required"]) == {"task_id", "case_id", "candidate_id", "verdict", "note",
                                     "evidence"}
    assert item["properties"]["note"] == {"type": ["string", "null"]}
    assert item["properties"]["evidence"]["properties"]["quote"] == {"type": ["string", "null"]}
    values = list(result.values.values())
    assert {"verdict": "match", "evidence": {"page": 3}} in values  # nulls taken out
    assert {"verdict": "no_match", "note": "differs"} in values


def test_a_null_the_schema_itself_allows_is_kept():
    schema = {"type": "object", "required": ["verdict"], "properties": {
        "verdict": {"enum": ["match", "no_match"]}, "note": {"type": ["string", "null"]}}}
    with LoopbackServer(SimulatedModel(answer=lambda t: {"verdict": "match", "note": None}),
                        api_key=KEY) as server:
        result = openai_session(server).run_batch("r", review_tasks(1), schema,
                                                  identity=IDENTITY)
    assert list(result.values.values()) == [{"verdict": "match", "note": None}]


FREE_FORM = {"type": "object", "required": ["verdict", "scores"], "properties": {
    "verdict": {"enum": ["match", "no_match"]},
    "scores": {"type": "object", "additionalProperties": {"type": "integer"}},  # dict[str, int]
    "meta": {"type": "object"}}}  # a free-form object


def scored(task):
    return {"verdict": "match", "scores": {"name": 2, "date": 1}, "meta": {"any": ["thing"]}}


def test_a_schema_strict_mode_cannot_express_goes_as_a_json_object_with_a_note():
    """Fault: a dict[str, X] or free-form object sent with strict: true, which OpenAI answers
    with a 400 on every call of the batch."""
    with LoopbackServer(SimulatedModel(answer=scored), api_key=KEY) as server:
        result = openai_session(server).run_batch("r", review_tasks(3), FREE_FORM,
                                                  identity=IDENTITY, pack=3)
        sent = server.last_body["response_format"]
    assert result.status == "resolved" and result.provider_errors == 0
    assert sent == {"type": "json_object"}
    (note,) = result.notes
    assert "strict mode cannot express" in note and "scores" in note and "meta" in note
    assert all(v["scores"] == {"name": 2, "date": 1} for v in result.values.values())


def test_json_schema_asked_for_explicitly_is_refused_before_anything_is_spent(tmp_path):
    with LoopbackServer(SimulatedModel(answer=scored), api_key=KEY) as server:
        session = Session(OpenAIProvider("gpt-4o-mini", base_url=server.base_url, api_key=KEY,
                                         response_format="json_schema"),
                          ledger=tmp_path / "l.sqlite")
        with pytest.raises(ProviderSetupError, match="strict mode cannot express") as caught:
            session.run_batch("r", review_tasks(3), FREE_FORM, identity=IDENTITY, pack=3)
        assert server.requests == 0 and session.ledger.attempts("r") == []
    assert "response_format='auto'" in str(caught.value)


def test_the_official_sdk_sends_batchjsons_strict_body_and_the_server_takes_it():
    """The body batchjson builds for an optional-field schema, sent by openai-python itself."""
    blank = SimulatedModel(answer=lambda t: {"verdict": "match", "note": None, "evidence": None})
    with LoopbackServer(blank, api_key=KEY) as server:
        body = OpenAIProvider("gpt-4o-mini", base_url=server.base_url,
                              api_key=KEY).request_body(items_call(OPTIONAL))[0]
        sdk = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
        completion = sdk.chat.completions.create(**body)
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content.startswith('{"items"')


def _call_for(ids: list[str], schema: dict = OPTIONAL, shaped: bool = False) -> Call:
    """A call as a run makes it; ``shaped``: with the key of its schema's shape a run's calls
    share (``make_call``'s), by which the strict form of that shape is found."""
    tasks = tuple({"task_id": i, "prompt": f"about {i}"} for i in ids)
    compiled = compile_schema(schema)
    return Call(tasks=tasks, prompt="p", system="", attempt=0, kind="initial",
                request_key=ids[0], schema=wire_schema(compiled, tasks, ("task_id",)),
                schema_shape=f"items:{compiled.fingerprint}:[\"task_id\"]" if shaped else "")


@pytest.mark.parametrize("shaped", [False, True])
def test_each_call_of_a_batch_is_held_to_its_own_identity_values_and_count_in_strict_mode(
        shaped):
    """Fault: the strict form made once for a batch's schema and reused with the first call's
    pinned task ids and item count (every later call's answer refused by the API's schema),
    or a later call's values written into the form an earlier body holds."""
    provider = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    calls = [_call_for(ids, shaped=shaped) for ids in (["a", "b"], ["c"], ["d", "e", "f"])]
    bodies = [provider.request_body(call)[0] for call in calls]
    for call, body in zip(calls, bodies, strict=True):
        sent = body["response_format"]["json_schema"]["schema"]
        assert sent == _shape_form(call.schema).schema  # as the whole schema walked afresh
        array = sent["properties"]["items"]
        ids = [t["task_id"] for t in call.tasks]
        assert array["minItems"] == array["maxItems"] == len(ids)
        assert array["items"]["properties"]["task_id"] == {"enum": ids}


def test_a_schema_reordered_in_the_same_kernel_goes_out_in_its_own_order():
    """Strict mode writes fields in the schema's order (reasoning before its answer): two
    schemas equal but for that order share a fingerprint, never a strict form. Fault: the form
    found by the first schema's key sent for the second."""
    first = {"type": "object", "required": ["answer", "reasoning"], "properties": {
        "answer": {"type": "string"}, "reasoning": {"type": "string"}}}
    second = {**first, "properties": dict(reversed(first["properties"].items()))}
    sent = []
    with LoopbackServer(SimulatedModel(lambda task: {"answer": "a", "reasoning": "r"}),
                        api_key=KEY) as server:
        session = openai_session(server)
        for name, schema in (("a", first), ("b", second)):  # tasks of its own: each is sent
            tasks = review_tasks(1, case=f"gold-pair-{name}")
            assert session.run_batch(name, tasks, schema).calls == 1
            sent.append(server.last_body["response_format"]["json_schema"]["schema"])
    orders = [[name for name in s["properties"]["items"]["items"]["properties"]
               if name in first["properties"]] for s in sent]
    assert orders == [["answer", "reasoning"], ["reasoning", "answer"]]


@pytest.mark.parametrize("shaped", [False, True])
def test_a_call_whose_pinned_ids_pass_strict_modes_enum_limit_goes_as_a_json_object(shaped):
    """Fault: a call's own identity values left out of strict mode's size limits once the
    batch's form is shared, so the call alone over the limit gets a 400 on every try."""
    provider = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    small = provider.request_body(_call_for(["a", "b"], shaped=shaped))[0]["response_format"]
    ids = [f"t{i}" for i in range(MAX_ENUM_VALUES + 1)]
    large = provider.request_body(_call_for(ids, shaped=shaped))[0]["response_format"]
    assert small["type"] == "json_schema" and large == {"type": "json_object"}


# -- reasoning models --------------------------------------------------------------------------
def test_o1_mini_gets_no_system_role_no_response_format_and_max_completion_tokens():
    """Faults (the recorded o1-mini 400s, which the server answers word for word): a system
    or developer message, a response_format, max_tokens instead of max_completion_tokens."""
    with LoopbackServer(SimulatedModel(answer=scored), api_key=KEY) as server:
        session = openai_session(server, "o1-mini", extra_body={"max_tokens": 4000})
        result = session.run_batch("r", review_tasks(2), FREE_FORM, identity=IDENTITY, pack=2)
        body = server.last_body
    assert result.status == "resolved" and result.provider_errors == 0
    assert [m["role"] for m in body["messages"]] == ["user", "user"]
    assert "response_format" not in body and "max_tokens" not in body
    assert body["max_completion_tokens"] == 4000
    assert any("o1-mini takes no response_format" in n for n in result.notes)


def test_o3_mini_takes_the_system_text_as_developer_and_refuses_temperature_before_spending():
    with LoopbackServer(SimulatedModel(answer=nulls_for_absent), api_key=KEY) as server:
        result = openai_session(server, "o3-mini").run_batch("r", review_tasks(1), OPTIONAL,
                                                             identity=IDENTITY)
        assert [m["role"] for m in server.last_body["messages"]] == ["developer", "user"]
        assert server.last_body["response_format"]["json_schema"]["strict"] is True
        with pytest.raises(ProviderSetupError, match="'temperature'"):
            OpenAIProvider("o3-mini", base_url=server.base_url, api_key=KEY,
                           extra_body={"temperature": 0.2})
    assert result.status == "resolved"


def test_the_capability_table_is_overridden_by_the_provider_option():
    """An o1-mini deployment said to take a system message sends one, and the server answers
    the recorded 400 (so the table, not a hard-coded rule, decided the request)."""
    with LoopbackServer(SimulatedModel(answer=scored), api_key=KEY) as server:
        session = openai_session(server, "o1-mini", capabilities={"system_role": "system"})
        result = session.run_batch("r", review_tasks(1), FREE_FORM, identity=IDENTITY,
                                   on_exhausted="return")
    (error,) = result.errors
    assert "'messages[0].role' does not support 'system' with this model" in error["message"]
    with pytest.raises(ProviderSetupError, match="its fields are system_role"):
        OpenAIProvider("o1-mini", base_url="http://127.0.0.1:9/v1", api_key=KEY,
                       capabilities={"roles": "user"})
