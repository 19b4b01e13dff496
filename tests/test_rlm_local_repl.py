"""alexzhang13/rlm-style REPLs: no globals(), a failing cell's variables and underscore names
dropped. The registry lives on the host side, so define-once still holds there."""

from __future__ import annotations

import pytest

from batchjson import BudgetExceeded
from batchjson.rlm import bind, rlm_hooks

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}

SEED_CELL = '''
_tries = 1
def validate_labels(value, index):
    if value["label"] not in ("pos", "neg"):
        raise ValueError(f"label must be 'pos' or 'neg', got {value['label']!r}")

result = llm_batch_json(prompts, schema, max_repair_attempts=1, validator=validate_labels)
history.append((validate_labels, batch_status()["minimum_exact_retry_calls"]))
if result["errors"]:
    raise RuntimeError(f"{len(result['errors'])} prompt(s) still failing")
'''

DROSTE_ADVICE_CELL = '''
if "validate_labels" not in globals():
    def validate_labels(value, index):
        return None
'''


class LocalReplLike:
    """Behaves like rlm's LocalREPL: builtins without globals/locals, each cell run in a fresh
    {**globals, **locals}, and only a successful cell's non-underscore names copied back."""

    def __init__(self) -> None:
        safe = {name: getattr(__builtins__, name, None) if not isinstance(__builtins__, dict)
                else __builtins__.get(name) for name in (
                    "len", "str", "dict", "list", "print", "isinstance", "ValueError",
                    "RuntimeError", "TypeError", "range", "enumerate", "repr")}
        safe.update({"globals": None, "locals": None, "__build_class__": None})
        self.globals = {"__builtins__": safe, "__name__": "__main__"}
        self.locals: dict = {}

    def execute_code(self, code: str) -> str:
        combined = {**self.globals, **self.locals}
        try:
            exec(code, combined, combined)
        except Exception as exc:  # noqa: BLE001 - the REPL reports, the loop repairs
            return f"{type(exc).__name__}: {exc}"
        for key, value in combined.items():
            if key not in self.globals and not key.startswith("_"):
                self.locals[key] = value
        return ""


def flaky_llm_query_batched(bad: int):
    """rlm's helper shape: list of prompts in, list of strings out; counts its calls."""
    state = {"calls": 0}

    def llm_query_batched(prompts):
        out = []
        for _ in prompts:
            state["calls"] += 1
            out.append('{"label": "maybe"}' if state["calls"] <= bad else '{"label": "pos"}')
        return out

    return llm_query_batched, state


def test_define_once_holds_in_a_repl_without_globals_that_drops_failed_cells():
    repl = LocalReplLike()
    assert "TypeError" in repl.execute_code(DROSTE_ADVICE_CELL)  # droste's advice cannot work
    helper, state = flaky_llm_query_batched(bad=12)
    bind(repl.globals, helper)
    repl.locals.update(prompts=["Label: great", "Label: dull"], schema=SCHEMA, history=[])
    outputs = [repl.execute_code(SEED_CELL) for _ in range(7)]
    assert [bool(out) for out in outputs] == [True, True] + [False] * 5
    assert "validate_labels" in repl.locals and "_tries" not in repl.locals
    history = repl.locals["history"]
    assert len({id(fn) for fn, _ in history}) == 1  # failing cells were dropped, yet one object
    assert repl.locals["validate_labels"] is history[0][0]
    assert [owed for _, owed in history] == [2, 2, 0, 0, 0, 0, 0]
    assert repl.globals["finalization_check"]() == []
    calls = state["calls"]
    repl.execute_code(SEED_CELL)
    assert state["calls"] == calls


def test_budget_gate_in_a_repl_refuses_before_spending():
    repl = LocalReplLike()
    helper, state = flaky_llm_query_batched(bad=100)
    bind(repl.globals, helper, budget={"calls": 8})
    repl.locals.update(prompts=["Label: great", "Label: dull", "Label: fine"], schema=SCHEMA,
                       history=[])
    assert "RuntimeError" in repl.execute_code(SEED_CELL)  # 3 prompts: 8 calls, 3 owed
    spent = state["calls"]
    out = repl.execute_code(SEED_CELL)
    assert out.startswith("BudgetExceeded") and "at least 3 exact call(s)" in out
    assert state["calls"] == spent
    # without the validator the stored returns already pass: re-judged for free, so the gate
    # lets the call through and nothing is spent
    free = repl.globals["llm_batch_json"](["Label: great"], SCHEMA)
    assert free["errors"] == [] and state["calls"] == spent
    with pytest.raises(BudgetExceeded):  # a prompt never answered still needs a paid call
        repl.globals["llm_batch_json"](["Label: new"], SCHEMA)


def test_real_local_repl_gets_define_once_and_the_hooks_answer_through_its_own_helper():
    """Against alexzhang13/rlm itself (the rlms package, a test dependency)."""
    rlm_local_repl = pytest.importorskip("rlm.environments.local_repl",
                                         reason="the rlms package is not installed")
    repl = rlm_local_repl.LocalREPL()
    try:
        helper, state = flaky_llm_query_batched(bad=12)
        bind(repl.globals, helper)
        repl.locals.update(prompts=["Label: great", "Label: dull"], schema=SCHEMA, history=[])
        results = [repl.execute_code(SEED_CELL) for _ in range(7)]
        assert ["RuntimeError" in r.stderr for r in results] == [True, True] + [False] * 5
        history = repl.locals["history"]
        assert len({id(fn) for fn, _ in history}) == 1
        assert [owed for _, owed in history] == [2, 2, 0, 0, 0, 0, 0]
    finally:
        repl.cleanup()

    hooks = rlm_hooks()  # no LM handler: the REPL's own helper answers "Error: ..."
    bare = rlm_local_repl.LocalREPL(custom_tools=hooks.custom_tools, setup_code=hooks.setup_code)
    try:
        bare.locals.update(schema=SCHEMA)
        out = bare.execute_code("r = llm_batch_json(['Label: great'], schema)\n"
                                "print(r['errors'][0]['type'], r['errors'][0]['error'])")
        assert out.stdout.startswith("provider_error") and "No LM handler" in out.stdout
    finally:
        bare.cleanup()
