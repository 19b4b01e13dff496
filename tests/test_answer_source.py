"""Each provider names what decides its answers (`source_key`), never a secret, so a stored
answer is reused only from the same source: another model, endpoint or setting asks again."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from batchjson import CallableProvider, FaultPlan, SimulatedModel
from batchjson._content.keys import answer_source, source_text
from batchjson._providers.anthropic import AnthropicProvider
from batchjson._providers.openai import OpenAIProvider
from tests.helpers import answer, items_reply

KEY = "sk-test-SECRETVALUE-0123456789abcdef"
BASE = "http://127.0.0.1:9/v1"


def openai_key(**kw: Any) -> str:
    kw.setdefault("base_url", BASE)
    kw.setdefault("api_key", KEY)
    return source_text(OpenAIProvider(kw.pop("model", "llama3"), **kw))


def anthropic_key(**kw: Any) -> str:
    kw.setdefault("base_url", "http://127.0.0.1:9")
    kw.setdefault("api_key", KEY)
    return source_text(AnthropicProvider(kw.pop("model", "claude-haiku-4-5"), **kw))


def test_http_providers_differing_in_model_url_or_any_sent_setting_have_different_sources():
    keys = [
        openai_key(),
        openai_key(model="llama3.1"),
        openai_key(base_url="http://127.0.0.1:10/v1"),
        openai_key(base_url="http://127.0.0.1:9/v1?api-version=2024-10-21"),
        openai_key(response_format="json_object"),
        openai_key(response_format="text"),
        openai_key(extra_body={"temperature": 0}),
        openai_key(extra_body={"temperature": 0.7}),
        openai_key(extra_body={"seed": 1}),
        openai_key(extra_body={"max_tokens": 100}),
        anthropic_key(),
        anthropic_key(mode="text"),
        anthropic_key(max_tokens=100),
        anthropic_key(extra_body={"temperature": 0}),
    ]
    assert len(set(keys)) == len(keys)
    assert "llama3" in keys[0] and "127.0.0.1:9" in keys[0]  # readable: model and endpoint


def test_the_same_http_config_has_the_same_source_whatever_the_key_or_timeout():
    assert openai_key() == openai_key(api_key="sk-another-key-0000000000000000")
    assert openai_key() == openai_key(api_key="", timeout=5, max_connections=2)
    assert openai_key(extra_body={"a": 1, "b": 2}) == openai_key(extra_body={"b": 2, "a": 1})
    for key in (openai_key(), anthropic_key()):
        assert KEY not in key and KEY[-8:] not in key


def test_a_simulated_model_is_keyed_by_its_answer_function_seed_and_faults():
    def other(task):
        return {"verdict": "match"}

    base = SimulatedModel(answer)
    keys = [source_text(base), source_text(SimulatedModel(other)),
            source_text(SimulatedModel(answer, seed=1)),
            source_text(SimulatedModel(answer, faults=FaultPlan(malformed_json=0.5))),
            source_text(SimulatedModel(answer, faults=FaultPlan(script={0: "missing_item"}))),
            source_text(SimulatedModel(answer, model="simulated-2"))]
    assert len(set(keys)) == len(keys)
    assert source_text(SimulatedModel(answer, latency=0.5, price_per_million=(1, 2))) == keys[0]


def test_a_simulated_model_keeps_its_source_while_it_counts_calls():
    model = SimulatedModel(answer)
    before = source_text(model)
    model.calls += 5
    assert source_text(model) == before


def test_a_callable_provider_is_keyed_by_its_function_or_the_source_it_names():
    def shout(call):
        return items_reply(call)

    def whisper(call):
        return items_reply(call).lower()

    assert source_text(CallableProvider(shout)) != source_text(CallableProvider(whisper))
    named = source_text(CallableProvider(shout, source="my-model-v2"))
    assert named == source_text(CallableProvider(whisper, source="my-model-v2"))
    assert named == "callable:my-model-v2"
    assert source_text(CallableProvider(shout, source="my-model-v3")) != named
    assert source_text(CallableProvider(shout, model="gpt-x")) != source_text(CallableProvider(
        shout))


def test_a_stub_that_counts_its_calls_keeps_one_source():
    seen: list[Any] = []

    def stub(call):
        seen.append(call)
        return "{}"

    provider = CallableProvider(stub)
    before = source_text(provider)
    stub(None)
    stub(None)
    assert seen and source_text(provider) == before


SCRIPT = textwrap.dedent("""
    import json
    from batchjson import CallableProvider, FaultPlan, SimulatedModel
    from batchjson._content.keys import answer_source, source_text
    from batchjson._providers.anthropic import AnthropicProvider
    from batchjson._providers.openai import OpenAIProvider
    from tests.helpers import answer, items_reply

    print(json.dumps([
        source_text(OpenAIProvider("llama3", base_url="http://127.0.0.1:9/v1",
                                   api_key="sk-x-000000000000",
                                   extra_body={"temperature": 0, "seed": 7})),
        source_text(AnthropicProvider("claude-haiku-4-5", base_url="http://127.0.0.1:9",
                                      mode="text", max_tokens=99)),
        source_text(SimulatedModel(answer, seed=3, faults=FaultPlan(malformed_json=0.25,
                                                                    script={1: "timeout"}))),
        source_text(CallableProvider(items_reply)),
    ]))
""")


def _keys_in_a_new_process() -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONHASHSEED": "random"}
    env.pop("OPENAI_API_KEY", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=os.getcwd(),
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_the_same_config_has_the_same_source_in_every_process():
    first, second = _keys_in_a_new_process(), _keys_in_a_new_process()
    assert first == second
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(SCRIPT, "<script>", "exec"), {})
    assert json.loads(buffer.getvalue()) == first  # and the same as in this process


ANSWER_SCALE = {"K": 1}


def _answer_from_unseen_global(task):
    return {"verdict": "match" if globals()["ANSWER_SCALE"]["K"] else "no_match"}


def test_an_answer_function_reading_what_no_fingerprint_sees_is_refused_before_any_call():
    from batchjson import ProviderSetupError, Session, SimulatedModel
    from tests.helpers import LABEL_SCHEMA, review_tasks

    calls = []

    def model(call):
        calls.append(call)
        return globals()["items_reply"](call)

    for provider in (SimulatedModel(answer=_answer_from_unseen_global),
                     CallableProvider(model)):
        session = Session(provider)
        with pytest.raises(ProviderSetupError, match=r"globals\(\)") as refused:
            session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
        assert "source='my-model-v1'" in str(refused.value)
        assert session.ledger.attempts("r") == [] and calls == []
    named = Session(CallableProvider(model, source="reviewer-v1"))  # named: the user's word
    assert named.run_batch("r", review_tasks(2), LABEL_SCHEMA).resolved


def test_answer_sources_of_existing_ledgers_do_not_change():
    """Pinned sources: if one moves, every stored answer of that source stops being reused."""
    openai = OpenAIProvider("gpt-4o", base_url="http://127.0.0.1:9/v1", api_key="sk-x",
                            extra_body={"seed": 7})
    anthropic = AnthropicProvider("claude-haiku-4-5", base_url="http://127.0.0.1:9",
                                  api_key="sk-x")
    sources = [answer_source(p).split(":")[1] for p in (
        openai, anthropic, SimulatedModel(), CallableProvider(answer, source="v1"))]
    assert sources == [
        "4d7c23bca777790d692c1dfa7ee91d5e47cadb1d4b25e0183fd22b8934ca18b2",
        "845197a48fc32584dbb0d308a195a56a5c12b577281681547e2f17bec0e95399",
        "12fc2790e3fc0ad581596ff2e120f5d8915fd3be61d07efcc1efcfde5356ffc8",
        "e1b08bc442b164e835cee54911bdb745c00ec2a456108458cb775f0a8443d198"]
