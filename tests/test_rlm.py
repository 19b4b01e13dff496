"""batchjson.rlm.bind: droste's helpers in any namespace, canonical validators, a budget gate."""

from __future__ import annotations

import random
from typing import Any

import pytest

from batchjson import BudgetExceeded, Session, SimulatedModel, ValidatorChanged
from batchjson._content.keys import source_text
from batchjson._errors import ConfigError, InvalidBatch
from batchjson.rlm import HELPER_NAMES, bind
from batchjson.rlm._subcalls import SubcallProvider

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
PROMPTS = ["Label the review: great film", "Label the review: dull film"]

# The seed's cell: the validator is defined inline and a failure raises, so the host re-runs it.
SEED_CELL = '''
def validate_labels(value, index):
    if value["label"] not in ("pos", "neg"):
        raise ValueError(f"label must be 'pos' or 'neg', got {value['label']!r}")

result = llm_batch_json(prompts, schema, max_repair_attempts=1, validator=validate_labels)
history.append((validate_labels, batch_status()))
if result["errors"]:
    raise RuntimeError(f"{len(result['errors'])} prompt(s) still failing")
'''


class FlakySubcalls:
    """droste's subcall protocol: the first ``bad`` answers break the validator, then fine.

    It counts its calls (state), as droste's clients do.
    """

    def __init__(self, bad: int = 12) -> None:
        self.bad = bad
        self.calls = 0

    def llm_batch_with_errors(self, prompts, contexts=None):
        out = []
        for _ in prompts:
            self.calls += 1
            out.append('{"label": "maybe"}' if self.calls <= self.bad else '{"label": "pos"}')
        return out, []


def run_cell(code: str, namespace: dict) -> str:
    try:
        exec(compile(code, "<cell>", "exec"), namespace)
    except RuntimeError:
        return "error"
    return "ok"


def test_seed_cell_reexecuted_seven_times_keeps_one_request_and_one_validator():
    subcalls = FlakySubcalls(bad=8)  # droste's 2 calls a prompt a run: the cell fails twice
    namespace = {"prompts": PROMPTS, "schema": SCHEMA, "history": []}
    session = bind(namespace, subcalls)
    outcomes = []
    for _ in range(7):  # the RLM loop re-runs the cell after every error
        outcomes.append(run_cell(SEED_CELL, namespace))
        status = namespace["batch_status"]()
        assert status["unresolved_batches"] <= 1
        assert status["minimum_exact_retry_calls"] <= len(PROMPTS)  # never more than the one
    assert outcomes == ["error", "error"] + ["ok"] * 5
    owed = [status["minimum_exact_retry_calls"] for _, status in namespace["history"]]
    assert owed == [2, 2, 0, 0, 0, 0, 0]  # zero from the first success on
    validators = {id(fn) for fn, _ in namespace["history"]}
    assert len(validators) == 1  # seven definitions, one object
    assert namespace["validate_labels"] is namespace["history"][0][0]
    assert namespace["finalization_check"]() == []
    calls = subcalls.calls
    run_cell(SEED_CELL, namespace)
    assert subcalls.calls == calls  # a resolved request is never paid again
    assert session.evidence.minimum_exact_retry_calls == 0


def test_bind_installs_droste_names_into_any_dict_and_returns_the_session():
    namespace: dict = {}
    session = bind(namespace, SimulatedModel(answer=lambda task: {"label": "pos"}))
    assert isinstance(session, Session) and session.strict  # strict by default
    assert set(HELPER_NAMES) <= set(namespace)
    assert namespace["llm_query_batched_json"] is namespace["llm_batch_json"]
    out = namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert set(out) == {"values", "errors", "attempts", "repairs_made"}
    assert out["values"] == [{"label": "pos"}] * 2 and out["errors"] == []
    status = namespace["batch_status"]()
    assert {"unresolved_batches", "unresolved_items", "minimum_exact_retry_calls", "calls",
            "cost"} <= set(status)
    assert status["calls"] == 2 and status["ready_allowed"]
    with pytest.raises(InvalidBatch, match="dict a host runs cells in"):
        bind(["not", "a", "dict"], SimulatedModel())


def test_redefined_validator_is_rebound_in_the_globals_the_cell_ran_in():
    """The cell's globals are a fresh dict each run, not the dict given to bind."""
    host: dict = {}
    bind(host, SimulatedModel(answer=lambda task: {"label": "pos"}))
    code = ("def check(value, index):\n    return None\n"
            "out = llm_batch_json(prompts, schema, validator=check)\nseen = check\n")
    first = {**host, "prompts": PROMPTS, "schema": SCHEMA}
    exec(code, first)
    second = {**host, "prompts": PROMPTS, "schema": SCHEMA}
    exec(code, second)
    assert second["check"] is first["check"]  # rebound before the cell's next line ran
    assert second["seen"] is first["check"]


def test_a_validator_decorated_in_a_rerun_cell_is_the_first_object():
    namespace: dict = {}
    bind(namespace, SimulatedModel(answer=lambda task: {"label": "pos"}))
    code = "@validator\ndef check(value, index):\n    return None\n"
    exec(code, namespace)
    first = namespace["check"]
    exec(code, namespace)
    assert namespace["check"] is first


def test_changed_validator_with_open_evidence_is_refused_with_advice_for_the_model():
    subcalls = FlakySubcalls(bad=100)
    namespace = {"prompts": PROMPTS, "schema": SCHEMA, "history": []}
    bind(namespace, subcalls)
    assert run_cell(SEED_CELL, namespace) == "error"
    spent = subcalls.calls
    changed = SEED_CELL.replace('("pos", "neg")', '("pos", "neg", "maybe")')
    with pytest.raises(ValidatorChanged) as refused:
        exec(compile(changed, "<cell>", "exec"), namespace)
    message = str(refused.value)
    assert "validate_labels" in message and "restore the previous definition" in message
    assert "validate_labels_v2" in message and "finalization_check()" in message
    assert subcalls.calls == spent  # refused before spending
    assert namespace["batch_status"]()["minimum_exact_retry_calls"] == 2  # nothing lost


def test_without_strict_a_changed_validator_is_simply_a_different_one():
    subcalls = FlakySubcalls(bad=100)
    namespace = {"prompts": PROMPTS, "schema": SCHEMA, "history": []}
    bind(namespace, subcalls, strict=False)
    run_cell(SEED_CELL, namespace)
    changed = SEED_CELL.replace('("pos", "neg")', '("pos", "neg", "maybe")')
    assert run_cell(changed, namespace) == "ok"
    assert namespace["history"][0][0] is not namespace["history"][1][0]


def test_budget_gate_refuses_before_spending_when_owed_calls_exceed_what_remains():
    subcalls = FlakySubcalls(bad=100)
    namespace = {"prompts": PROMPTS + ["Label the review: fine film"], "schema": SCHEMA,
                 "history": []}
    bind(namespace, subcalls, budget={"calls": 7})
    assert run_cell(SEED_CELL, namespace) == "error"  # 6 calls spent, 3 requests owed
    assert namespace["batch_status"]()["remaining_calls"] == 1
    spent = subcalls.calls
    with pytest.raises(BudgetExceeded) as refused:
        exec(compile(SEED_CELL, "<cell>", "exec"), namespace)
    message = str(refused.value)
    assert "at least 3 exact call(s)" in message and "only 1 call(s) remain" in message
    assert "Do not set answer['ready'] = True" in message and "larger budget" in message
    assert subcalls.calls == spent  # nothing was spent
    assert len(namespace["finalization_check"]()) == 3  # and the evidence still blocks ready
    # A new prompt would fit the one call left, but the owed evidence could never be cleared.
    with pytest.raises(BudgetExceeded, match="clear the unresolved evidence already recorded"):
        namespace["llm_batch_json"](["Label the review: a new film"], SCHEMA)
    assert subcalls.calls == spent


def test_budget_gate_refuses_a_call_whose_own_prompts_cannot_be_paid():
    subcalls = FlakySubcalls(bad=0)
    namespace: dict = {}
    bind(namespace, subcalls, budget={"calls": 2})
    with pytest.raises(BudgetExceeded, match="at least 3 exact call"):
        namespace["llm_batch_json"](PROMPTS + ["a third"], SCHEMA)
    assert subcalls.calls == 0
    assert namespace["llm_batch_json"](PROMPTS, SCHEMA)["errors"] == []


def test_error_strings_from_an_rlm_helper_are_provider_errors_not_answers():
    answers = iter(["Error: LM query failed - timeout", '{"label": "pos"}'])

    def llm_query_batched(prompts):
        return [next(answers) for _ in prompts]

    namespace: dict = {}
    session = bind(namespace, llm_query_batched)
    out = namespace["llm_batch_json"](PROMPTS[:1], SCHEMA, max_repair_attempts=0, name="q")
    assert out["values"] == [{"label": "pos"}]  # the exact replay after the provider error
    attempts = session.ledger.attempts("q")
    assert [a.status for a in attempts] == ["provider_error", "accepted"]


def test_error_strings_alone_never_resolve_a_request():
    namespace: dict = {}
    bind(namespace, lambda prompts: ["Error: No LM handler configured"] * len(prompts))
    out = namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert out["values"] == [None, None]
    assert {e["type"] for e in out["errors"]} == {"provider_error"}
    assert "No LM handler configured" in out["errors"][0]["error"]


class RandomFaults:
    """A test double whose state is a random generator and a counter."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.calls = 0

    def llm_batch_with_errors(self, prompts, contexts=None):
        self.calls += len(prompts)
        return ['{"label": "pos"}' if self.rng.random() > 0.5 else "oops" for _ in prompts], []


def test_answer_source_is_keyed_by_code_not_state():
    counting = FlakySubcalls()
    provider = SubcallProvider(counting)
    key = source_text(provider)
    namespace: dict = {}
    bind(namespace, provider)
    namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert counting.calls > 0 and source_text(provider) == key
    assert source_text(SubcallProvider(FlakySubcalls(bad=3))) == key  # same code, other state
    assert source_text(SubcallProvider(RandomFaults(1))) == source_text(SubcallProvider(
        RandomFaults(2)))
    assert source_text(SubcallProvider(RandomFaults(1))) != key  # other code: other source

    count = 0

    def llm_query_batched(prompts):
        nonlocal count
        count += 1
        return ['{"label": "pos"}'] * len(prompts)

    before = source_text(SubcallProvider(llm_query_batched))
    llm_query_batched(["x"])
    assert source_text(SubcallProvider(llm_query_batched)) == before


def test_a_shared_session_keeps_one_registry_and_refuses_a_second_source():
    first: dict = {}
    session = bind(first, FlakySubcalls(bad=0))
    second: dict = {}
    assert bind(second, FlakySubcalls(bad=5), session=session) is session  # same code
    code = "def check(value, index):\n    return None\nout = llm_batch_json(prompts, schema, " \
           "validator=check)\n"
    exec(code, {**first, "prompts": PROMPTS, "schema": SCHEMA})
    scope = {**second, "prompts": PROMPTS, "schema": SCHEMA}
    exec(code, scope)
    assert session.validators.current("check").fn is scope["check"]
    with pytest.raises(ConfigError, match="already answers from"):
        bind({}, RandomFaults(0), session=session)


class RecordingContext:
    """The part of droste's ExecutionContext a subcall client reports to."""

    def __init__(self) -> None:
        self.attempts = 0
        self.successes = 0

    def record_subcall_attempts(self, count: int = 1) -> None:
        self.attempts += count

    def record_subcall_successes(self, count: int = 1) -> None:
        self.successes += count


class ContextBound(FlakySubcalls):
    def bind_context(self, context) -> None:
        self.context = context


def test_subcalls_are_accounted_to_a_droste_context_the_way_droste_does():
    context = RecordingContext()
    namespace: dict = {}
    bind(namespace, FlakySubcalls(bad=0), context=context)
    namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert (context.attempts, context.successes) == (2, 2)
    client = ContextBound(bad=0)
    other = RecordingContext()
    bind({}, client, context=other)
    assert client.context is other and other.attempts == 0  # the client accounts for itself


DOCS_PATTERN_CELL = '''
@validator
def validate_labels(value, index):
    if value["label"] not in ("pos", "neg"):
        raise ValueError(f"label must be 'pos' or 'neg', got {value['label']!r}")

for attempt in range(3):
    result = llm_batch_json(prompts, schema, max_repair_attempts=1, validator=validate_labels)
    if not result["errors"]:
        break
if result["errors"]:
    answer["content"] = f"{len(result['errors'])} of {len(prompts)} prompts unresolved"
else:
    answer["content"] = ",".join(v["label"] for v in result["values"])
    answer["ready"] = not finalization_check()
'''


def test_the_documented_in_cell_bounded_replay_reaches_ready_in_one_execution():
    subcalls = FlakySubcalls(bad=8)  # what took the seed cell three executions
    namespace = {"prompts": PROMPTS, "schema": SCHEMA,
                 "answer": {"content": "", "ready": False}}
    bind(namespace, subcalls)
    exec(compile(DOCS_PATTERN_CELL, "<cell>", "exec"), namespace)
    assert namespace["answer"] == {"content": "pos,pos", "ready": True}
    assert subcalls.calls == 10


def test_the_documented_pattern_reports_instead_of_claiming_ready_when_it_cannot_clear():
    subcalls = FlakySubcalls(bad=1000)
    namespace = {"prompts": PROMPTS, "schema": SCHEMA,
                 "answer": {"content": "", "ready": False}}
    bind(namespace, subcalls)
    exec(compile(DOCS_PATTERN_CELL, "<cell>", "exec"), namespace)
    assert namespace["answer"] == {"content": "2 of 2 prompts unresolved", "ready": False}
    assert subcalls.calls == 12  # three bounded turns of droste's 2 calls a prompt, then stop


class RecordingBatches:
    """Records each batch it is handed and how many calls overlap; item 1 always errors."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.active = 0
        self.overlapped = False

    def llm_batch_with_errors(self, prompts, contexts=None):
        self.active += 1
        self.overlapped |= self.active > 1
        self.sizes.append(len(prompts))
        errors = [{"index": i, "error": "rate limited", "type": "provider_error"}
                  for i, p in enumerate(prompts) if p == "p1"]
        self.active -= 1
        return ['{"label": "pos"}'] * len(prompts), errors


def test_waiting_prompts_go_out_as_one_batch_and_batch_errors_stay_with_their_item():
    client = RecordingBatches()
    namespace: dict = {}
    bind(namespace, client)
    prompts = [f"p{i}" for i in range(20)]
    out = namespace["llm_batch_json"](prompts, SCHEMA, contexts=[f"c{i}" for i in range(20)])
    assert max(client.sizes) > 1 and not client.overlapped  # batched, and one call at a time
    assert [e["index"] for e in out["errors"]] == [1]
    assert out["errors"][0]["type"] == "provider_error" and "rate limited" in out["errors"][0][
        "error"]
    assert out["values"][0] == {"label": "pos"} and out["values"][1] is None


@pytest.mark.parametrize("named", [False, True])
def test_an_rlm_call_fingerprints_its_validator_once(monkeypatch, named):
    """The face registers the validator (to rebind the canonical object) and names the batch
    by it; the run reuses that record instead of walking the validator (and everything it
    reads) again, whether or not the call names its batch."""
    from batchjson._session import registry as _registry

    walked = []
    real = _registry.fingerprint_function
    monkeypatch.setattr(_registry, "fingerprint_function",
                        lambda fn: walked.append(fn) or real(fn))
    namespace = {"prompts": PROMPTS, "schema": SCHEMA, "history": []}
    bind(namespace, FlakySubcalls(bad=0))
    cell = SEED_CELL if not named else SEED_CELL.replace(
        "validator=validate_labels)", "validator=validate_labels, name='labels')")
    assert ("name='labels'" in cell) == named and run_cell(cell, namespace) == "ok"
    assert len(walked) == 1


def test_a_refused_rerun_names_the_object_the_cell_makes_anew_and_how_to_keep_it():
    """A connection made in the re-executed cell is compared by identity, so every re-run is a
    changed validator: the refusal says so and what to do, since restoring the definition
    cannot help."""
    import sqlite3

    namespace: dict[str, Any] = {"prompts": ["a"], "schema": {"type": "object"},
                                 "sqlite3": sqlite3}
    bind(namespace, lambda prompts: ['{"x": 1}' for _ in prompts])
    cell = ("DB = sqlite3.connect(':memory:')\n"
            "def check(value, index):\n"
            "    DB.execute('select 1')\n"
            "    raise ValueError('rejected')\n"
            "result = llm_batch_json(prompts, schema, validator=check, max_repair_attempts=0)\n")
    exec(cell, namespace)
    with pytest.raises(ValidatorChanged) as refused:
        exec(cell, namespace)
    said = str(refused.value)
    assert "global DB changed (compared by identity)" in said
    assert said.endswith("make it once, in a cell that is not re-run.")
