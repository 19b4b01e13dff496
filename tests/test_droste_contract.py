"""droste's own structured-batch cases, run side by side against droste and batchjson.

Source: ``tests/test_structured_subcalls.py`` at tag v0.26.0 of tensor-systems/droste. Each of
its cases about ``structured_batch`` / ``llm_batch_json`` is re-expressed here (not copied) and
run against three helpers bound to the same kind of droste subcall client: droste's own
(``bind_structured_batch``), droste's own wrapped by ``batchjson.rlm.droste_environment``, and
``batchjson.rlm.bind``. Where batchjson differs on purpose (owed calls counted per prompt, its
own error wording), the expectation says so per helper; docs/rlm.md lists those differences.
droste's cases about droste-only code (its system prompt text, ``BudgetExhausted`` being a
``RuntimeError``, ``aggregate_json_counts``) have no batchjson counterpart and are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

droste_structured = pytest.importorskip("droste.structured")

from droste import BudgetExhausted  # noqa: E402
from droste.testing import MockEnvironment  # noqa: E402

from batchjson import BatchJsonError, SubcallClientError  # noqa: E402
from batchjson.rlm import bind, droste_environment  # noqa: E402

COUNT = {"type": "object", "required": ["count"], "additionalProperties": False,
         "properties": {"count": {"type": "integer", "minimum": 0}}}
HELPERS = ["droste", "droste_environment", "bind"]


@dataclass(frozen=True)
class Err:
    """A per-prompt failure the client reports in its batch errors."""

    type: str
    message: str


class ScriptedClient:
    """droste's subcall protocol, answering each prompt from its own script.

    ``script`` maps a word found in exactly one prompt to that prompt's successive outcomes (the
    last one repeats): a text, or an :class:`Err`. A repair prompt quotes the prompt it repairs,
    so it is answered from the same script. ``fail_after`` refuses, with droste's
    ``BudgetExhausted`` and before answering, a batch that would take the calls past it.
    """

    def __init__(self, script: dict[str, list[Any]], *, fail_after: int | None = None) -> None:
        self.script = {word: list(outcomes) for word, outcomes in script.items()}
        self.fail_after = fail_after
        self.sent: list[tuple[str, str | None]] = []  # every prompt text and its context

    @property
    def calls(self) -> int:
        return len(self.sent)

    def llm_query(self, prompt: str, context: str = "") -> str:
        values, errors = self.llm_batch_with_errors([prompt], [context])
        return values[0]

    def llm_batch(self, prompts: list[str], contexts: list[str] | None = None) -> list[str]:
        return self.llm_batch_with_errors(prompts, contexts)[0]

    def llm_batch_with_errors(self, prompts, contexts=None):
        if self.fail_after is not None and self.calls + len(prompts) > self.fail_after:
            raise BudgetExhausted("subcalls", len(prompts), max(0, self.fail_after - self.calls))
        values, errors = [], []
        for index, prompt in enumerate(prompts):
            self.sent.append((prompt, None if contexts is None else contexts[index]))
            outcome = self._next(prompt)
            if isinstance(outcome, Err):
                values.append("")
                errors.append({"index": index, "type": outcome.type, "error": outcome.message})
            else:
                values.append(outcome)
        return values, errors

    def _next(self, prompt: str) -> Any:
        words = [word for word in self.script if word in prompt]
        assert len(words) == 1, f"no single script for {prompt!r}"
        outcomes = self.script[words[0]]
        return outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]


class Helper:
    """One ``llm_batch_json`` bound to ``client`` and a view of the evidence it records."""

    def __init__(self, kind: str, client: Any) -> None:
        self.kind = kind
        if kind == "bind":
            namespace: dict[str, Any] = {}
            bind(namespace, client)
            self.call = namespace["llm_batch_json"]
            self._status = namespace["batch_status"]
            return
        self.evidence = droste_structured._StructuredBatchEvidence()
        self.call = droste_structured.bind_structured_batch(client, self.evidence)
        if kind == "droste_environment":  # droste's helper, as a wrapped run_rlm binds it
            env = droste_environment(MockEnvironment({}))
            env.globals()["llm_batch_json"] = self.call
            env.install()
            self.call = env.globals()["llm_batch_json"]
            assert self.call.__batchjson_canonical__  # the wrapper, not droste's helper itself

    def owed(self) -> tuple[int, int, int]:
        """(unresolved batches, unresolved items, minimum exact retry calls)."""
        if self.kind == "bind":
            status = self._status()
            return (status["unresolved_batches"], status["unresolved_items"],
                    status["minimum_exact_retry_calls"])
        return (self.evidence.unresolved_batches, self.evidence.unresolved_items,
                self.evidence.minimum_exact_retry_calls)


@pytest.fixture(params=HELPERS)
def helper(request):
    """A factory: ``helper(client)`` is the helper under test bound to that client."""
    return lambda client: Helper(request.param, client)


def counts(*values: int) -> list[str]:
    return [json.dumps({"count": v}) for v in values]


# -- results, repairs and call counts ----------------------------------------------------------
def test_valid_outputs_come_back_in_prompt_order_with_one_call_each(helper):
    client = ScriptedClient({"alpha": counts(2), "beta": counts(1)})
    result = helper(client).call(["alpha", "beta"], COUNT)
    assert result == {"values": [{"count": 2}, {"count": 1}], "errors": [], "attempts": [1, 1],
                      "repairs_made": 0}
    assert client.calls == 2


def test_only_malformed_items_are_repaired_and_each_repair_is_one_call(helper):
    client = ScriptedClient({"alpha": counts(3), "beta": ["not json", *counts(2)],
                             "gamma": counts(1)})
    result = helper(client).call(["alpha", "beta", "gamma"], COUNT, max_repair_attempts=1)
    assert result["values"] == [{"count": 3}, {"count": 2}, {"count": 1}]
    assert result["errors"] == [] and result["repairs_made"] == 1
    assert result["attempts"] == [1, 2, 1]
    assert client.calls == 4  # 1 + repairs: no exact replay on top
    repair = client.sent[-1][0]
    assert "beta" in repair and "not json" in repair  # the task and what was wrong with it


@pytest.mark.parametrize("host_type", ["provider_error", "rate_limited"])
def test_host_errors_keep_their_type_per_prompt_and_are_never_retried(helper, host_type):
    client = ScriptedClient({"alpha": [Err(host_type, "provider unavailable")],
                             "beta": ["bad", *counts(2)], "gamma": counts(4)})
    result = helper(client).call(["alpha", "beta", "gamma"], COUNT)
    assert result["values"] == [None, {"count": 2}, {"count": 4}]
    [error] = result["errors"]
    assert (error["index"], error["type"], error["attempts"]) == (0, host_type, 1)
    assert "provider unavailable" in error["error"]
    assert result["attempts"] == [1, 2, 1] and client.calls == 4


def test_an_item_still_malformed_after_its_repair_is_a_validation_error(helper):
    client = ScriptedClient({"alpha": ["bad", "still bad"]})
    result = helper(client).call(["alpha"], COUNT, max_repair_attempts=1)
    assert result["values"] == [None]
    [error] = result["errors"]
    assert (error["type"], error["attempts"], error["raw"]) == ("validation_error", 2,
                                                               "still bad")
    assert client.calls == 2


def test_a_host_budget_refusal_is_budget_exhausted_for_every_prompt_it_stopped(helper):
    client = ScriptedClient({"alpha": ["bad"], "beta": ["bad"]}, fail_after=2)
    result = helper(client).call(["alpha", "beta"], COUNT, max_repair_attempts=1)
    assert [e["type"] for e in result["errors"]] == ["budget_exhausted", "budget_exhausted"]
    assert result["values"] == [None, None] and result["attempts"] == [2, 2]
    assert client.calls == 2  # the refused repairs were never answered


def test_the_caller_validator_takes_part_in_bounded_repair(helper):
    client = ScriptedClient({"alpha": counts(1, 2)})

    def require_two(value, index):
        if value["count"] != 2:
            raise ValueError(f"item {index} count must equal 2")

    result = helper(client).call(["alpha"], COUNT, validator=require_two)
    assert result["values"] == [{"count": 2}] and result["errors"] == []
    assert "count must equal 2" in client.sent[1][0]


def test_a_validator_crash_is_reported_for_its_item_and_never_repaired(helper):
    client = ScriptedClient({"alpha": counts(1), "beta": counts(2), "gamma": counts(3)})

    def crash_on_the_middle(value, index):
        if index == 1:
            raise KeyError("validator bug")

    result = helper(client).call(["alpha", "beta", "gamma"], COUNT,
                                 validator=crash_on_the_middle)
    assert result["values"] == [{"count": 1}, None, {"count": 3}]
    [error] = result["errors"]
    assert (error["index"], error["type"], error["attempts"]) == (1, "validator_error", 1)
    assert "validator bug" in error["error"]
    assert result["attempts"] == [1, 1, 1] and result["repairs_made"] == 0
    assert client.calls == 3


def test_a_failed_assert_is_a_validator_error_never_repaired_as_droste_judges_it(helper):
    """droste's helper repairs only on ValueError: an AssertionError is a validator crash."""
    client = ScriptedClient({"alpha": counts(1, 9)})

    def above_five(value, index):
        assert value["count"] > 5, "count must be above 5"

    result = helper(client).call(["alpha"], COUNT, validator=above_five)
    assert result["values"] == [None] and result["repairs_made"] == 0
    [error] = result["errors"]
    assert (error["index"], error["type"], error["attempts"]) == (0, "validator_error", 1)
    assert "count must be above 5" in error["error"]
    assert client.calls == 1


@pytest.mark.parametrize("verdict", [False, "an error string", 0])
def test_what_a_validator_returns_is_ignored_as_droste_ignores_it(helper, verdict):
    """droste calls validator(value, index) for its exceptions only: returning False (or
    anything else) accepts the value, with no repair."""
    client = ScriptedClient({"alpha": counts(1, 9)})
    bound = helper(client)
    result = bound.call(["alpha"], COUNT, validator=lambda value, index: verdict)
    assert result == {"values": [{"count": 1}], "errors": [], "attempts": [1],
                      "repairs_made": 0}
    assert client.calls == 1 and bound.owed() == (0, 0, 0)


def test_repair_calls_send_contexts_apart_from_prompts_as_first_calls_do(helper):
    client = ScriptedClient({"alpha": counts(1), "beta": ["not json", *counts(2)]})
    result = helper(client).call(["alpha", "beta"], COUNT, ["record a", "record b"], 1)
    assert result["errors"] == []
    assert sorted(client.sent[:2]) == [("alpha", "record a"), ("beta", "record b")]
    repair, context = client.sent[2]
    assert context == "record b" and "record b" not in repair and "beta" in repair


def test_valid_json_null_is_told_apart_from_a_failed_prompt_by_errors(helper):
    client = ScriptedClient({"alpha": ["null"], "beta": [Err("provider_error", "unavailable")]})
    result = helper(client).call(["alpha", "beta"], {"type": "null"})
    assert result["values"] == [None, None]
    assert [(e["index"], e["type"], e["attempts"]) for e in result["errors"]] == [
        (1, "provider_error", 1)]
    assert client.calls == 2


@pytest.mark.parametrize("message", ["max subcalls exceeded",
                                     "provider reported max subcalls exceeded downstream"])
def test_only_a_typed_budget_error_is_budget_exhausted(helper, message):
    class Untyped(ScriptedClient):
        def llm_batch_with_errors(self, prompts, contexts=None):
            raise RuntimeError(message)

    result = helper(Untyped({})).call(["alpha"], COUNT)
    assert [e["type"] for e in result["errors"]] == ["provider_error"]


# -- schema semantics --------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "schema"), [
    (True, {"const": 1}), (False, {"enum": [0]}), ({"nested": [True]}, {"const": {"nested": [1]}}),
    ([{"nested": False}], {"enum": [[{"nested": 0}]]}),
    ({"actual": 1}, {"const": {"expected": 1}}),
], ids=["const", "enum", "const-nested", "enum-nested", "const-object-keys"])
def test_booleans_are_not_numbers_and_objects_need_the_same_keys(helper, value, schema):
    client = ScriptedClient({"alpha": [json.dumps(value)]})
    result = helper(client).call(["alpha"], schema, max_repair_attempts=0)
    assert result["values"] == [None]
    assert [e["type"] for e in result["errors"]] == ["validation_error"]


@pytest.mark.parametrize(("value", "schema"), [
    (1, {"const": 1.0}), (1.0, {"enum": [1]}), ({"nested": [1]}, {"const": {"nested": [1.0]}}),
    ([{"nested": 1.0}], {"enum": [[{"nested": 1}]]}),
], ids=["const", "enum", "const-nested", "enum-nested"])
def test_equal_numbers_match_const_and_enum_across_int_and_float(helper, value, schema):
    client = ScriptedClient({"alpha": [json.dumps(value)]})
    result = helper(client).call(["alpha"], schema, max_repair_attempts=0)
    assert result["errors"] == [] and result["values"] == [value]


@pytest.mark.parametrize(("text", "accepted"), [("3", True), ("3.0", False), ("true", False)])
def test_an_integer_is_an_integer_literal_as_droste_checks_it(helper, text, accepted):
    client = ScriptedClient({"alpha": [text]})
    result = helper(client).call(["alpha"], {"type": "integer"}, max_repair_attempts=0)
    assert (result["values"] == [3]) is accepted and (result["errors"] == []) is accepted


@pytest.mark.parametrize(("schema", "infinite", "finite", "expected"), [
    ({"type": "number"}, "1e999", "1", 1),
    ({"type": "object"}, '{"nested":[{"value":1e999}]}', '{"nested":[{"value":1}]}',
     {"nested": [{"value": 1}]}),
], ids=["top-level", "nested"])
def test_numbers_too_large_for_a_float_are_rejected_and_repaired_once(helper, schema, infinite,
                                                                       finite, expected):
    client = ScriptedClient({"alpha": [infinite]})
    rejected = helper(client).call(["alpha"], schema, max_repair_attempts=0)
    assert rejected["values"] == [None] and rejected["attempts"] == [1]
    assert rejected["errors"][0]["type"] == "validation_error"
    assert "finite" in rejected["errors"][0]["error"]
    json.dumps(rejected, allow_nan=False)  # the result stays plain JSON

    client = ScriptedClient({"beta": [infinite, finite]})
    repaired = helper(client).call(["beta"], schema, max_repair_attempts=1)
    assert repaired["values"] == [expected] and repaired["errors"] == []
    assert repaired["attempts"] == [2] and repaired["repairs_made"] == 1
    assert "finite" in client.sent[1][0]
    json.dumps(repaired, allow_nan=False)


# -- refused before spending -------------------------------------------------------------------
@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"x": {"pattern": "x"}}},
    {"type": "string", "format": "date"},
    {"type": "array", "items": {"type": "string", "maxLength": 3}},
    {"additionalProperties": {"minLength": 1}},
], ids=["nested-pattern", "format", "items-maxLength", "additional-minLength"])
def test_keywords_outside_droste_s_subset_are_refused_before_any_call(helper, schema):
    client = ScriptedClient({})
    with pytest.raises(ValueError, match="unsupported JSON schema keywords"):
        helper(client).call(["alpha"], schema)
    assert client.calls == 0


def test_a_typo_in_a_droste_schema_is_refused_naming_the_keyword_it_meant():
    namespace: dict[str, Any] = {}
    client = ScriptedClient({})
    bind(namespace, client)
    with pytest.raises(ValueError, match="unsupported JSON schema keywords: requried .*did you "
                                         "mean 'required' for 'requried'"):
        namespace["llm_batch_json"](["alpha"], {"type": "object", "requried": ["count"]})
    assert client.calls == 0


@pytest.mark.parametrize("schema", [
    {"type": "unsupported"}, {"type": ["object", 1]}, {"minimum": True}, {"maximum": "10"},
    {"minItems": True}, {"maxItems": -1}, {"required": "value"}, {"required": ["value", "value"]},
    {"enum": {}}, {"properties": []}, {"properties": {1: {"type": "string"}}},
    {"additionalProperties": "yes"}, {"items": []}, {"properties": {"nested": {"minimum": False}}},
    {"additionalProperties": {"type": "unsupported"}}, {"items": {"maxItems": True}},
    {1: {"type": "string"}}, {"type": "impossible"},
])
def test_malformed_schemas_are_refused_before_any_call(helper, schema):
    client = ScriptedClient({})
    with pytest.raises(ValueError) as refused:
        helper(client).call(["alpha"], schema)
    assert client.calls == 0
    if 1 in schema or 1 in schema.get("properties", {}):
        assert "keys must be strings" in str(refused.value)
    if schema.get("type") == "impossible":
        assert "impossible" in str(refused.value)


@pytest.mark.parametrize(("errors", "message"), [
    ([{"index": True, "error": "x"}], "invalid index"),
    ([{"index": -1, "error": "x"}], "out of range"),
    ([{"index": 1, "error": "x"}], "out of range"),
    ([{"index": 0, "error": "x"}, {"index": 0, "error": "again"}], "duplicate"),
    (["not an object"], "non-object"),
], ids=["bool", "negative", "past-the-end", "duplicated", "non-object"])
def test_a_client_s_broken_error_indices_fail_the_call_loudly(helper, errors, message):
    class BrokenIndices:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return counts(1), errors

    bound = helper(BrokenIndices())
    with pytest.raises(RuntimeError, match=message) as raised:
        bound.call(["alpha"], COUNT)
    if bound.kind == "bind":  # batchjson's own error, still a RuntimeError for droste callers
        assert isinstance(raised.value, SubcallClientError)
        assert isinstance(raised.value, BatchJsonError)


# -- evidence: an exact retry clears it ---------------------------------------------------------
def test_only_an_exact_retry_with_the_same_validator_clears_the_evidence(helper):
    client = ScriptedClient({"alpha": counts(1), "beta": ["bad", *counts(2)],
                             "other": counts(3)})
    bound = helper(client)
    prompts, contexts = ["classify alpha", "classify beta"], ["record a", "record b"]

    def accept_all(value, index):
        return None

    first = bound.call(prompts, COUNT, contexts, 0, accept_all)
    assert [e["index"] for e in first["errors"]] == [1]
    bound.call(["classify other"], COUNT, ["record c"], 0, accept_all)  # another request
    bound.call(prompts, COUNT, contexts, 0, lambda value, index: value is not None)
    assert bound.owed()[:2] == (1, 1)  # another validator clears nothing
    # The same check written again is another object: droste keys by identity, batchjson by
    # content, so only batchjson takes it for the validator that owes (docs/rlm.md).
    bound.call(prompts, COUNT, contexts, 0, lambda value, index: None)
    assert bound.owed()[:2] == ((0, 0) if bound.kind == "bind" else (1, 1))
    assert bound.call(prompts, COUNT, contexts, 0, accept_all)["errors"] == []
    assert bound.owed() == (0, 0, 0)


def test_owed_calls_count_every_request_recorded_with_a_different_validator(helper):
    """droste owes a replay of each whole recorded batch; batchjson owes one call per prompt
    still unresolved, since accepted prompts are never paid again (docs/rlm.md)."""
    client = ScriptedClient({"alpha": counts(1), "beta": counts(2),
                             "gamma": [Err("provider_error", "temporary"), *counts(3)]})
    bound = helper(client)
    prompts = ["alpha", "beta", "gamma"]

    def first_validator(value, index):
        return None

    def second_validator(value, index):
        if index == 0:
            raise ValueError("bad")

    bound.call(prompts, COUNT, None, 0, first_validator)
    bound.call(prompts, COUNT, None, 0, second_validator)
    batches, items, calls = bound.owed()
    assert (batches, items) == (2, 2)
    assert calls == (2 if bound.kind == "bind" else 6)


# -- only droste clients get droste's rules -----------------------------------------------------
def test_a_host_that_asks_for_replays_and_transport_retries_gets_them():
    client = ScriptedClient({"alpha": [Err("provider_error", "flaky"), *counts(1)]})
    namespace: dict[str, Any] = {}
    session = bind(namespace, client, replays=1, transport_retries=1)
    session.transport.backoff_initial = session.transport.backoff_max = 0.001
    result = namespace["llm_batch_json"](["alpha"], COUNT, max_repair_attempts=0)
    assert result["values"] == [{"count": 1}] and client.calls == 2


def test_other_hosts_keep_batchjson_s_full_schema_support_and_replays():
    replies = iter([["Error: busy"], ['"abc"']])

    def llm_query_batched(prompts):  # alexzhang13/rlm's helper shape
        return next(replies)

    namespace: dict[str, Any] = {}
    bind(namespace, llm_query_batched)
    result = namespace["llm_batch_json"](["alpha"], {"type": "string", "pattern": "^a"},
                                         max_repair_attempts=0)
    assert result["values"] == ["abc"] and result["attempts"] == [2]  # one exact replay


@pytest.mark.parametrize("kind", ["assert", "False"])
def test_other_hosts_keep_batchjson_s_verdicts_an_assert_or_false_rejects_and_is_repaired(kind):
    replies = iter([[json.dumps({"count": 1})], [json.dumps({"count": 9})]])

    def llm_query_batched(prompts):  # not a droste client: batchjson's own contract
        return next(replies)

    def above_five(value, index):
        if kind == "False":
            return value["count"] > 5
        assert value["count"] > 5, "count must be above 5"

    namespace: dict[str, Any] = {}
    bind(namespace, llm_query_batched)
    result = namespace["llm_batch_json"](["alpha"], COUNT, validator=above_five)
    assert result == {"values": [{"count": 9}], "errors": [], "attempts": [2],
                      "repairs_made": 1}


def test_binding_again_keeps_the_session_and_droste_s_rules_unless_others_are_asked():
    namespace: dict[str, Any] = {}
    first = bind(namespace, ScriptedClient({}))
    assert (first.replays, first.transport.retries) == (0, 0)
    assert bind(namespace, ScriptedClient({})) is first  # a host binding before every turn
    assert bind(namespace) is first  # no source named: the session already there
    with pytest.raises(ValueError, match="unsupported JSON schema keywords"):
        namespace["llm_batch_json"](["alpha"], {"type": "string", "format": "date"})
    other = bind(namespace, ScriptedClient({}), replays=1)
    assert other is not first and other.replays == 1
