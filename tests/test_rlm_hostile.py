"""A hostile RLM host and careless model-written cells against the promises of bind().

Each test is a fault that broke (or could break) a promise: a different validator clearing old
evidence, a false ValidatorChanged, a non-batchjson exception for bad input, a budget gate that
withholds free answers or misleads, a subcall helper that misbehaves, a restart.
"""

from __future__ import annotations

import functools
import threading

import pytest

from batchjson import BudgetExceeded, ValidatorChanged
from batchjson._content.keys import source_text
from batchjson._errors import BatchJsonError, ConfigError, InvalidBatch, SubcallClientError
from batchjson.rlm import bind, droste_environment

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
PROMPTS = ["Label the review: great film", "Label the review: dull film"]

STRICT_CHECK = (
    "def check(value, index):\n"
    "    if value['label'] != 'pos':\n"
    "        raise ValueError('label must be pos')\n")


class Subcalls:
    """droste's subcall protocol answering ``answer`` for every prompt; counts its calls."""

    def __init__(self, answer: str = '{"label": "maybe"}') -> None:
        self.answer = answer
        self.calls = 0

    def llm_batch_with_errors(self, prompts, contexts=None):
        self.calls += len(prompts)
        return [self.answer] * len(prompts), []


def cell(code: str, namespace: dict) -> None:
    exec(compile(code, "<cell>", "exec"), namespace)


# -- a different validator is a different validator -------------------------------------------
def test_a_loosened_validator_never_clears_old_evidence_even_without_strict():
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    bind(namespace, Subcalls(), strict=False)
    cell(STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n", namespace)
    assert namespace["batch_status"]()["minimum_exact_retry_calls"] == 2
    loosened = "def check(value, index):\n    return None\n"
    cell(loosened + "r = llm_batch_json(prompts, schema, validator=check)\n", namespace)
    assert namespace["r"]["errors"] == []  # the new validator accepts "maybe" ...
    status = namespace["batch_status"]()
    assert status["minimum_exact_retry_calls"] == 2  # ... but the old requests are still owed
    assert not status["ready_allowed"] and len(namespace["finalization_check"]()) == 2


def test_changed_global_constant_is_a_different_validator_whose_evidence_stays_apart():
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    session = bind(namespace, Subcalls(), strict=False)
    code = ("def check(value, index):\n    if value['label'] not in ALLOWED:\n"
            "        raise ValueError('no')\n"
            "r = llm_batch_json(prompts, schema, validator=check)\n")
    cell("ALLOWED = ('pos',)\n" + code, namespace)
    first = namespace["check"]
    cell("ALLOWED = ('pos', 'maybe')\n" + code, namespace)
    assert namespace["check"] is not first  # not made canonical to the old object
    assert len(session.validators.versions("check")) == 2
    assert namespace["batch_status"]()["minimum_exact_retry_calls"] == 2  # the first's, kept


def test_closures_of_one_factory_for_different_prompts_are_not_refused_as_changes():
    """A loop over label sets (default argument) and a factory (closure): the same code with
    other data, each for its own prompts. Nothing is orphaned, so strict mode lets them be."""
    namespace = {"schema": SCHEMA, "seen": []}
    session = bind(namespace, Subcalls())
    loop = ("for allowed in [('pos',), ('neg',)]:\n"
            "    def check(value, index, allowed=allowed):\n"
            "        if value['label'] not in allowed:\n"
            "            raise ValueError('no')\n"
            "    r = llm_batch_json([f'{allowed[0]} review'], schema, validator=check)\n"
            "    seen.append(check)\n")
    cell(loop, namespace)
    cell(loop, namespace)  # the host re-runs it: both closures are the first objects again
    seen = namespace["seen"]
    assert seen[0] is seen[2] and seen[1] is seen[3] and seen[0] is not seen[1]
    assert namespace["batch_status"]()["minimum_exact_retry_calls"] == 2  # one per prompt
    factory = ("def make(allowed):\n    def check(value, index):\n"
               "        if value['label'] not in allowed:\n            raise ValueError('no')\n"
               "    return check\n"
               "a = llm_batch_json(['x'], schema, validator=make(('pos',)))\n"
               "b = llm_batch_json(['y'], schema, validator=make(('neg',)))\n")
    cell(factory, namespace)
    assert len(session.evidence.requests()) == 4
    # The same prompts with the changed data is the case strict mode exists for: refused.
    spent = session.tally.calls
    with pytest.raises(ValidatorChanged, match="make.<locals>.check"):
        cell("b = llm_batch_json(['y'], schema, validator=make(('neg', 'maybe')))\n", namespace)
    assert session.tally.calls == spent


def test_changed_validator_message_names_the_owed_batch_and_a_name_a_model_can_type():
    namespace = {"schema": SCHEMA}
    bind(namespace, Subcalls())
    factory = ("def make(allowed):\n    def check(value, index):\n"
               "        if value['label'] not in allowed:\n            raise ValueError('no')\n"
               "    return check\n"
               "a = llm_batch_json(['x'], schema, validator=make(ALLOWED))\n")
    cell("ALLOWED = ('pos',)\n" + factory, namespace)
    with pytest.raises(ValidatorChanged) as refused:
        cell("ALLOWED = ('pos', 'maybe')\n" + factory, namespace)
    message = str(refused.value)
    owed = namespace["finalization_check"]()[0]["batch"]
    assert owed in message  # which evidence the old version still owes
    assert "check_v2" in message and "make.<locals>.check_v2" not in message
    assert 'validator(fn, name="check_v2")' in message


def test_a_refused_decorator_says_the_definition_was_refused_not_a_call():
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    bind(namespace, Subcalls())
    cell("@validator\n" + STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n",
         namespace)
    with pytest.raises(ValidatorChanged) as refused:
        cell("@validator\ndef check(value, index):\n    return None\n", namespace)
    assert str(refused.value).startswith("validator(check) refused")


# -- canonical validators of every kind a cell makes -------------------------------------------
@pytest.mark.parametrize("code", [
    "import functools\ndef base(value, index, allowed):\n    return None\n"
    "check = functools.partial(base, allowed=('pos',))\n",
    "class Check:\n    def __call__(self, value, index):\n        return None\ncheck = Check()\n",
    "class Checker:\n    def run(self, value, index):\n        return None\n"
    "check = Checker().run\n",
    "check = lambda value, index: None\n",
], ids=["partial", "callable-instance", "bound-method", "lambda"])
def test_every_kind_of_validator_a_cell_redefines_is_one_object(code):
    namespace = {"prompts": PROMPTS, "schema": SCHEMA, "seen": []}
    session = bind(namespace, Subcalls('{"label": "pos"}'))
    body = code + "r = llm_batch_json(prompts, schema, validator=check)\nseen.append(check)\n"
    for _ in range(3):
        cell(body, namespace)
    assert len({id(fn) for fn in namespace["seen"]}) == 1
    assert len(list(session.validators)) == 1


def test_rebinding_touches_only_names_bound_to_the_duplicate():
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    bind(namespace, Subcalls('{"label": "pos"}'))
    code = (STRICT_CHECK + "alias = check\n"
            "def check(value, index):\n    return 'another function'\n"
            "r = llm_batch_json(prompts, schema, validator=alias)\n")
    cell(code, namespace)
    first = namespace["alias"]
    cell(code, namespace)
    assert namespace["alias"] is first  # the duplicate was replaced by the first object
    assert namespace["check"](None, 0) == "another function"  # the other name was left alone


def test_a_host_copying_names_in_and_out_keeps_one_validator_and_one_request():
    host = {"prompts": PROMPTS, "schema": SCHEMA}
    subcalls = Subcalls()
    bind(host, subcalls)
    code = STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n"
    objects = []
    for _ in range(3):
        scope = dict(host)  # exec(code, dict(ns)) ...
        cell(code, scope)
        host.update(scope)  # ... then ns.update
        objects.append(host["check"])
    assert objects[0] is objects[1] is objects[2]
    assert host["batch_status"]()["minimum_exact_retry_calls"] == 2


# -- bad input: batchjson errors, before anything is spent -------------------------------------
def test_validator_helper_takes_a_name_and_refuses_bad_input_with_batchjson_errors():
    namespace: dict = {}
    session = bind(namespace, Subcalls())
    cell('@validator("labels_ok")\ndef check(value, index):\n    return None\n', namespace)
    assert session.validators.current("labels_ok").fn is namespace["check"]
    for bad in (lambda: namespace["validator"](5),
                lambda: namespace["validator"](lambda v, i: None, name=5),
                lambda: namespace["validator"](name="  ")(lambda v, i: None),
                lambda: namespace["llm_batch_json"](PROMPTS, SCHEMA, validator="check")):
        with pytest.raises(InvalidBatch):
            bad()


def test_an_answer_source_that_is_nothing_callable_is_refused_when_binding():
    with pytest.raises(ConfigError, match="bind cannot answer from a int"):
        bind({}, 42)

    class BadContext(Subcalls):
        def bind_context(self, context):
            raise RuntimeError("wrong context type")

    with pytest.raises(ConfigError, match="bind_context"):
        bind({}, BadContext(), context=object())


@pytest.mark.parametrize("budget", [{"calls": "10"}, {"calls": -1}, {"calls": 1.5},
                                    {"cost": "1"}, {"cost": -0.5}, -3, {"calls": True}])
def test_a_malformed_budget_is_refused_when_binding(budget):
    with pytest.raises(InvalidBatch, match="budget"):
        bind({}, Subcalls(), budget=budget)


def test_a_budget_of_zero_refuses_every_paid_call_but_answers_empty_ones():
    namespace: dict = {}
    subcalls = Subcalls('{"label": "pos"}')
    bind(namespace, subcalls, budget={"calls": 0})
    assert namespace["llm_batch_json"]([], SCHEMA)["values"] == []
    with pytest.raises(BudgetExceeded, match="only 0 call"):
        namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert subcalls.calls == 0 and namespace["finalization_check"]() == []


def test_wrong_contexts_length_is_refused_before_the_gate_or_any_call():
    namespace: dict = {}
    subcalls = Subcalls()
    bind(namespace, subcalls)
    with pytest.raises(InvalidBatch, match="contexts length"):
        namespace["llm_batch_json"](PROMPTS, SCHEMA, ["only one"])
    assert subcalls.calls == 0


# -- the budget gate ---------------------------------------------------------------------------
def test_the_gate_still_returns_a_fully_accepted_call_for_free():
    """Owed evidence that cannot be paid blocks spending, not the values already paid for."""
    answers = {"good": '{"label": "pos"}', "bad": '{"label": "maybe"}'}

    class ByPrompt(Subcalls):
        def llm_batch_with_errors(self, prompts, contexts=None):
            self.calls += len(prompts)
            return [answers[p.split()[0]] for p in prompts], []

    namespace = {"schema": SCHEMA}
    subcalls = ByPrompt()
    bind(namespace, subcalls, budget={"calls": 7})
    good = ["good one", "good two"]
    code = STRICT_CHECK + "r = llm_batch_json(P, schema, validator=check)\n"
    cell(code, {**namespace, "P": good})
    cell(code, {**namespace, "P": ["bad one", "bad two"]})  # 4 calls, 2 owed, 1 left
    spent = subcalls.calls
    scope = {**namespace, "P": good}
    cell(code, scope)  # refused to spend, but nothing is needed: the values come back
    assert scope["r"]["values"] == [{"label": "pos"}] * 2 and subcalls.calls == spent
    with pytest.raises(BudgetExceeded, match="at least 2 exact call"):
        cell(code, {**namespace, "P": ["good three"]})
    assert subcalls.calls == spent


def test_a_cost_budget_over_an_unpriced_helper_is_refused_before_spending():
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    subcalls = Subcalls()
    session = bind(namespace, subcalls, budget={"cost": 0.5})
    with pytest.raises(ConfigError, match="price") as refused:
        namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert "set_prices" in str(refused.value) and "nothing was spent" in str(refused.value)
    assert session.tally.calls == 0 and subcalls.calls == 0


def test_status_finalization_and_gate_hold_after_a_restart_on_the_same_ledger(tmp_path):
    ledger = tmp_path / "run.sqlite"
    code = STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n"
    live = {"prompts": PROMPTS, "schema": SCHEMA}
    session = bind(live, Subcalls(), ledger=ledger)
    cell(code, live)
    owed = live["finalization_check"]()
    session.close()
    restarted = {"prompts": PROMPTS, "schema": SCHEMA}  # a new kernel: a new Session
    good = Subcalls('{"label": "pos"}')
    bind(restarted, good, ledger=ledger, budget={"calls": 1})
    assert restarted["finalization_check"]() == owed
    assert restarted["batch_status"]()["minimum_exact_retry_calls"] == 2
    with pytest.raises(BudgetExceeded, match="at least 2 exact call"):
        cell(code, restarted)
    assert good.calls == 0
    again = {"prompts": PROMPTS, "schema": SCHEMA}
    bind(again, good, ledger=ledger)
    cell(code, again)  # the same content after the restart clears the same requests
    assert again["finalization_check"]() == [] and good.calls == 2


def test_a_changed_validator_after_a_restart_is_still_refused_for_the_prompts_it_owes(tmp_path):
    """The new kernel's registry is empty; the ledger still knows what the old version owes."""
    ledger = tmp_path / "run.sqlite"
    code = STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n"
    before = {"prompts": PROMPTS, "schema": SCHEMA}
    bind(before, Subcalls(), ledger=ledger)
    cell(code, before)
    loosened = "def check(value, index):\n    return None\n"
    after = {"prompts": PROMPTS, "schema": SCHEMA}
    subcalls = Subcalls()
    session = bind(after, subcalls, ledger=ledger)
    with pytest.raises(ValidatorChanged, match="restore the previous definition"):
        cell(loosened + "r = llm_batch_json(prompts, schema, validator=check)\n", after)
    assert subcalls.calls == 0
    cell(loosened + "r = llm_batch_json(['other prompt'], schema, validator=check)\n", after)
    assert after["r"]["errors"] == []  # the changed logic is fine for prompts it does not owe
    cell(code, after)  # and the original definition still replays the owed requests
    assert len(session.validators.versions("check")) == 2


def test_finalization_check_names_the_owed_prompts_and_their_last_error():
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    bind(namespace, Subcalls())
    cell(STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n", namespace)
    owed = namespace["finalization_check"]()
    assert [entry["prompts"] for entry in owed] == [[PROMPTS[0]], [PROMPTS[1]]]
    assert all("label must be pos" in entry["last_error"] for entry in owed)


def test_two_threads_running_the_cell_on_one_namespace_share_one_validator_and_request(
        monkeypatch):
    """Each thread's call is handed the same validator object, the one the namespace holds at
    the end. (What a thread reads from the shared namespace right after its call is not: the
    other thread's ``def`` may have just put its own new object there, until its call rebinds
    it.)"""
    class Locked(Subcalls):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()

        def llm_batch_with_errors(self, prompts, contexts=None):
            with self.lock:
                return super().llm_batch_with_errors(prompts, contexts)

    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    registry = bind(namespace, Locked()).validators
    handed = []  # (thread, the object its definition was handed)
    register = registry.register

    def spy(fn, **kwargs):
        definition = register(fn, **kwargs)
        handed.append((threading.current_thread().name, definition.fn))
        return definition

    monkeypatch.setattr(registry, "register", spy)
    code = compile(STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n",
                   "<cell>", "exec")
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def run() -> None:
        start.wait()
        try:
            exec(code, namespace)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert {name for name, _ in handed} == {thread.name for thread in threads}
    assert all(fn is namespace["check"] for _, fn in handed)
    assert [v.fn for v in registry.versions("check")] == [namespace["check"]]
    assert namespace["batch_status"]()["minimum_exact_retry_calls"] == 2


def test_binding_the_same_namespace_again_keeps_its_evidence_and_budget():
    """A careless host that calls bind() before every turn must not reset the ready gate."""
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    subcalls = Subcalls()
    first = bind(namespace, subcalls, budget={"calls": 6})
    cell(STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n", namespace)
    assert bind(namespace, Subcalls(), budget={"calls": 6}) is first  # same class: same source
    assert namespace["batch_status"]()["remaining_calls"] == 2
    assert len(namespace["finalization_check"]()) == 2
    with pytest.raises(BudgetExceeded):
        cell(STRICT_CHECK + "r = llm_batch_json(prompts + ['x'], schema, validator=check)\n",
             namespace)
    with pytest.raises(ConfigError, match="still owes 2 exact call"):
        bind(namespace, subcalls, budget={"calls": 100})  # a new in-memory ledger: refused
    assert bind(namespace, Subcalls(), budget={"calls": 6}) is first  # nothing was replaced


def test_rebinding_with_other_settings_on_the_same_ledger_file_keeps_the_evidence(tmp_path):
    namespace = {"prompts": PROMPTS, "schema": SCHEMA}
    first = bind(namespace, Subcalls(), ledger=tmp_path / "l.sqlite")
    cell(STRICT_CHECK + "r = llm_batch_json(prompts, schema, validator=check)\n", namespace)
    second = bind(namespace, Subcalls(), ledger=tmp_path / "l.sqlite", budget={"calls": 50})
    assert second is not first
    assert len(namespace["finalization_check"]()) == 2


def test_partials_of_different_helpers_are_different_answer_sources():
    """Every functools.partial has one class: the source is the function it calls."""
    from batchjson.rlm._subcalls import SubcallProvider

    def ask_a(prompts, model):
        return ['{"label": "pos"}'] * len(prompts)

    def ask_b(prompts, model):
        return ['{"label": "neg"}'] * len(prompts)

    a1 = source_text(SubcallProvider(functools.partial(ask_a, model="m1")))
    a2 = source_text(SubcallProvider(functools.partial(ask_a, model="m2")))
    b = source_text(SubcallProvider(functools.partial(ask_b, model="m1")))
    assert a1 == a2 and a1 != b
    session = bind({}, functools.partial(ask_a, model="m1"))
    with pytest.raises(ConfigError, match="already answers from"):
        bind({}, functools.partial(ask_b, model="m1"), session=session)


# -- misbehaving subcall helpers ---------------------------------------------------------------
def _raise(prompts):
    raise RuntimeError("connection reset")


def test_a_subcall_object_that_raises_gives_every_prompt_a_provider_error_still_owed():
    class Client:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return _raise(prompts)

    namespace: dict = {}
    bind(namespace, Client())
    out = namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert out["values"] == [None, None] and "connection reset" in out["errors"][0]["error"]
    assert {e["type"] for e in out["errors"]} == {"provider_error"}
    assert len(namespace["finalization_check"]()) == 2  # owed, never silently answered


@pytest.mark.parametrize("reply", [
    lambda prompts: (['{"label": "pos"}'] * (len(prompts) - 1), []),
    lambda prompts: ([{"label": "pos"}] * len(prompts), []),
    lambda prompts: None,
    lambda prompts: (None, []),
    lambda prompts: (['{"label": "pos"}'] * len(prompts), [{"index": 7}]),
    lambda prompts: (['{"label": "pos"}'] * len(prompts), ["boom"]),
    lambda prompts: (['{"label": "pos"}'] * len(prompts), {"index": 0}),
], ids=["short", "non-string", "none", "values-none", "bad-index", "bad-error", "errors-dict"])
def test_a_subcall_object_breaking_droste_s_protocol_fails_the_call_loudly(reply):
    """droste's helper raises RuntimeError for a broken client; so does bind, with its own
    error, after recording the calls made: nothing it returned is accepted."""
    class Client:
        def llm_batch_with_errors(self, prompts, contexts=None):
            return reply(prompts)

    namespace: dict = {}
    bind(namespace, Client())
    with pytest.raises(SubcallClientError, match="subcall client returned") as raised:
        namespace["llm_batch_json"](PROMPTS, SCHEMA)
    assert isinstance(raised.value, RuntimeError) and isinstance(raised.value, BatchJsonError)
    status = namespace["batch_status"]()
    assert status["calls"] == 2 and status["usable_results"] == 0  # the calls stay accounted
    assert len(namespace["finalization_check"]()) == 2


@pytest.mark.parametrize("reply", [
    lambda prompts: ['{"label": "pos"}'],  # fewer strings than prompts
    lambda prompts: None,
    lambda prompts: (s for s in ['{"label": "pos"}'] * len(prompts)),
    lambda prompts: ["error: rate limited"] * len(prompts),
    lambda prompts: ["  Error: LM query failed"] * len(prompts),
    lambda prompts: ["ERROR: no handler"] * len(prompts),
], ids=["fewer", "none", "generator", "lowercase", "leading-space", "uppercase"])
def test_a_plain_helper_that_misbehaves_or_reports_errors_gets_provider_errors(reply):
    namespace: dict = {}
    session = bind(namespace, functools.partial(reply))
    out = namespace["llm_batch_json"](PROMPTS, SCHEMA, max_repair_attempts=1)
    assert {e["type"] for e in out["errors"]} == {"provider_error"}
    assert out["repairs_made"] == 0  # a failure string never costs a repair prompt
    assert all(isinstance(e["error"], str) for e in out["errors"])
    assert session.evidence.minimum_exact_retry_calls == 2


def test_only_batchjson_errors_leave_the_helpers_for_bad_arguments():
    namespace: dict = {}
    subcalls = Subcalls()
    bind(namespace, subcalls)
    helper = namespace["llm_batch_json"]
    for args, kwargs in [((None, SCHEMA), {}), (([None], SCHEMA), {}), ((PROMPTS, "object"), {}),
                         ((PROMPTS, SCHEMA), {"name": ""}), ((PROMPTS, SCHEMA, None, -1), {}),
                         ((PROMPTS, SCHEMA, "ctx"), {})]:
        with pytest.raises(BatchJsonError):
            helper(*args, **kwargs)
    assert subcalls.calls == 0


# -- droste_environment ------------------------------------------------------------------------
def test_wrapping_a_wrapped_environment_with_another_session_is_refused():
    pytest.importorskip("droste")
    from droste.testing import MockEnvironment

    from batchjson import Session

    env = droste_environment(MockEnvironment({}))
    assert droste_environment(env) is env
    assert droste_environment(env, registry=env.validators) is env
    with pytest.raises(ConfigError, match="already wrapped"):
        droste_environment(env, session=Session(Subcalls()))
