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


# -- droste's own loop, wrapped ---------------------------------------------------------------
droste = pytest.importorskip("droste")

from droste.protocols.llm_client import TokenUsage  # noqa: E402
from droste.testing import MockEnvironment, MockLLMClient, MockResponse  # noqa: E402

from batchjson.rlm import droste_environment  # noqa: E402
from tests.helpers import labelling_cell  # noqa: E402

SEED_CELL = labelling_cell('["great", "dull", "fine", "awful", "superb"]')


class FlakyDrosteSubcalls:
    """A droste subcall client: the first 16 answers fail the validator, then one in 20 does.

    It binds to the run's context and reports attempts and successes, as droste's clients do.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.context = None

    def bind_context(self, context) -> None:
        self.context = context

    def llm_query(self, prompt, context=""):
        return self.llm_batch([prompt])[0]

    def llm_batch(self, prompts, contexts=None):
        out = []
        for _ in prompts:
            self.calls += 1
            bad = self.calls <= 16 or self.calls % 20 == 0
            out.append('{"label": "maybe"}' if bad else '{"label": "pos"}')
        if self.context is not None:
            self.context.record_subcall_attempts(len(prompts))
            self.context.record_subcall_successes(len(prompts))
        return out

    def llm_batch_with_errors(self, prompts, contexts=None):
        return self.llm_batch(prompts, contexts), []


def run_droste(wrap: bool):
    """droste.run_rlm, semantic policy, a root model that re-emits the seed cell after errors."""
    budget = droste.Budget(subcalls=30, max_iterations=6)
    context = droste.create_execution_context(budget=budget)
    subcalls = FlakyDrosteSubcalls()
    environment = droste.create_environment(
        droste.EnvironmentConfig(kind="native", budget=budget), context="five reviews",
        registry=None, subcalls=subcalls, execution_context=context)
    if wrap:
        environment = droste_environment(environment)
    reply = MockResponse(f"```python\n{SEED_CELL}\n```", TokenUsage.unavailable())
    result = droste.run_rlm(
        "Label each review pos or neg", environment=environment,
        root_llm=MockLLMClient([reply] * 20), subcalls=subcalls, context=context,
        config=droste.RLMConfig(budget=budget,
                                policy_hints=droste.PolicyHints(semantic=True)))
    return result, environment, subcalls


def droste_evidence(helper):
    """The identity-keyed evidence droste's run_rlm bound into its helper."""
    helper = getattr(helper, "__wrapped__", helper)
    cells = [c.cell_contents for c in helper.__closure__ or ()]
    return next(c for c in cells if isinstance(c, droste_structured._StructuredBatchEvidence))


def test_wrapped_droste_run_reaches_ready_where_the_unwrapped_run_ratchets():
    plain, plain_env, _ = run_droste(wrap=False)
    assert not plain.ready
    ended = plain.error or plain.recovered_error
    assert ended.details["reason"] == "semantic_exact_retry_budget_exhausted"
    assert droste_evidence(plain_env.globals()["llm_batch_json"]).unresolved_batches == 2

    wrapped, env, subcalls = run_droste(wrap=True)
    assert wrapped.ready and wrapped.error is None and wrapped.recovered_error is None
    assert wrapped.answer == "pos,pos,pos,pos,pos"
    evidence = droste_evidence(env.globals()["llm_batch_json"])
    assert evidence.unresolved_batches == 0 and evidence.minimum_exact_retry_calls == 0
    assert len(env.validators.versions("validate_labels")) == 1  # one validator object
    assert env.globals()["validate_labels"] is env.validators.current("validate_labels").fn
    assert subcalls.calls <= 30


def test_wrapper_survives_helpers_rebound_and_cells_run_with_separate_locals():
    """MockEnvironment runs exec(code, {}, env): names land in the locals, not __globals__."""
    class AlwaysBad:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return ['{"label": "bad"}'] * len(prompts), []

    env = droste_environment(MockEnvironment({"answer": {"content": "", "ready": False}}))
    evidence = droste_structured._StructuredBatchEvidence()
    helper = droste_structured.bind_structured_batch(AlwaysBad(), evidence)
    cell = ("def check(value, index):\n"
            "    if value['label'] != 'good':\n"
            "        raise ValueError('label must be good')\n"
            "result = llm_batch_json(['a', 'b'], {'type': 'object'}, None, 0, check)\n"
            "seen.append(check)\n")
    env.globals()["seen"] = []
    for _ in range(3):
        env.globals()["llm_batch_json"] = helper  # the host rebinds, as run_rlm does
        env.execute(cell)
    seen = env.globals()["seen"]
    assert seen[0] is seen[1] is seen[2]
    assert evidence.unresolved_batches == 1 and evidence.minimum_exact_retry_calls == 2
    assert droste_environment(env) is env  # wrapping twice is wrapping once
    assert env.capabilities() == env.environment.capabilities()


GUARDED_CELL = SEED_CELL.replace(
    "def validate_labels(value, index):\n"
    "    if value[\"label\"] not in (\"pos\", \"neg\"):\n"
    "        raise ValueError(f\"label must be 'pos' or 'neg', got {value['label']!r}\")",
    "if \"validate_labels\" not in globals():\n"
    "    def validate_labels(value, index):\n"
    "        if value[\"label\"] not in (\"pos\", \"neg\"):\n"
    "            raise ValueError(f\"label must be 'pos' or 'neg', got {value['label']!r}\")")


def test_a_wrapped_droste_run_with_droste_s_own_globals_guard_still_reaches_ready():
    """The model follows droste's advice: the wrapper must not get in its way."""
    assert GUARDED_CELL != SEED_CELL
    budget = droste.Budget(subcalls=30, max_iterations=6)
    context = droste.create_execution_context(budget=budget)
    subcalls = FlakyDrosteSubcalls()
    environment = droste_environment(droste.create_environment(
        droste.EnvironmentConfig(kind="native", budget=budget), context="five reviews",
        registry=None, subcalls=subcalls, execution_context=context))
    reply = MockResponse(f"```python\n{GUARDED_CELL}\n```", TokenUsage.unavailable())
    result = droste.run_rlm(
        "Label each review pos or neg", environment=environment,
        root_llm=MockLLMClient([reply] * 20), subcalls=subcalls, context=context,
        config=droste.RLMConfig(budget=budget, policy_hints=droste.PolicyHints(semantic=True)))
    assert result.ready and result.answer == "pos,pos,pos,pos,pos"
    evidence = droste_evidence(environment.globals()["llm_batch_json"])
    assert evidence.minimum_exact_retry_calls == 0


def test_the_wrapper_never_makes_a_changed_validator_canonical_for_droste():
    class AlwaysBad:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return ['{"label": "bad"}'] * len(prompts), []

    env = droste_environment(MockEnvironment({}))
    evidence = droste_structured._StructuredBatchEvidence()
    env.globals().update(llm_batch_json=droste_structured.bind_structured_batch(
        AlwaysBad(), evidence), seen=[])
    cell = ("def check(value, index, allowed=ALLOWED):\n"
            "    if value['label'] not in allowed:\n"
            "        raise ValueError('no')\n"
            "result = llm_batch_json(['a'], {'type': 'object'}, None, 0, check)\n"
            "seen.append(check)\n")
    env.execute("ALLOWED = ('good',)\n" + cell)
    env.execute("ALLOWED = ('good', 'fine')\n" + cell)  # a changed default: another validator
    seen = env.globals()["seen"]
    assert seen[0] is not seen[1]
    assert evidence.unresolved_batches == 2  # droste's own rule: different validator, new key
