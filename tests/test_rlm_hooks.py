"""alexzhang13/rlm's real ``RLM`` loop with batchjson wired in through rlm's public options only.

The root model and the subcall model are one mock OpenAI endpoint on loopback, reached by rlm's
own ``OpenAIClient`` through its own LM handler: rlm's code runs unpatched, and every subcall
batchjson makes is one rlm counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

rlm = pytest.importorskip("rlm", reason="the rlms package is not installed")

from batchjson import ConfigError, NotReady  # noqa: E402
from batchjson.rlm import rlm_hooks  # noqa: E402
from tests.helpers import MockOpenAI, flaky_labels, labelling_cell  # noqa: E402

MODEL = "mock-model"
REVIEWS = ["great", "superb", "lovely"]

SEED_CELL = labelling_cell("context")

# A model that claims ready whatever the errors say: the gate must hold it back.
CLAIMING_CELL = SEED_CELL.replace(
    'if result["errors"]:\n    raise RuntimeError(f"{len(result[\'errors\'])} prompt(s) still '
    'failing")\n', "").replace(
    'answer["content"] = ",".join(value["label"] for value in result["values"])',
    'answer["content"] = "all labelled"')


def run_rlm(server: MockOpenAI, hooks: Any, max_iterations: int) -> Any:
    """One completion of rlm's own loop, wired in through its public options only."""
    loop = rlm.RLM(backend="openai",
                   backend_kwargs={"model_name": MODEL, "api_key": "sk-mock",
                                   "base_url": server.url, "max_retries": 0},
                   environment="local", environment_kwargs={"setup_code": hooks.setup_code},
                   custom_tools=hooks.custom_tools, max_iterations=max_iterations)
    return loop.completion(REVIEWS, root_prompt="Label each review pos or neg")


@pytest.fixture
def cell_reply() -> Iterator[Callable[[str], str]]:
    yield lambda code: f"Labelling the reviews.\n```repl\n{code}\n```"


def test_a_real_rlm_loop_re_running_an_inline_validator_reaches_ready(cell_reply):
    """The seed's cell under rlm: it raises while prompts fail and rlm re-runs it; evidence is
    keyed by content, so the re-run resumes the same requests and the gate lets ready through
    once nothing is owed. Every subcall went through rlm's own client and accounting."""
    hooks = rlm_hooks()
    with MockOpenAI(cell_reply(SEED_CELL), flaky_labels(bad=12)) as server:
        result = run_rlm(server, hooks, max_iterations=6)
    assert result.response == "pos,pos,pos"
    assert len(server.roots) == 2  # the cell failed once, and the re-run reached ready
    assert "RuntimeError: 3 prompt(s) still failing" in json.dumps(server.roots[1])
    status = hooks.batch_status()
    assert status["calls"] == len(server.subcalls) == 15  # 9 failing, then 3 + 3 repairs
    assert status["minimum_exact_retry_calls"] == 0 and hooks.finalization_check() == []
    usage = result.usage_summary.model_usage_summaries[MODEL]
    assert usage.total_calls == len(server.roots) + len(server.subcalls)  # rlm counted them
    assert len(hooks.session.validators.versions("validate_labels")) == 1


def test_rlm_s_prompt_describes_every_tool(cell_reply):
    hooks = rlm_hooks()
    with MockOpenAI(cell_reply(SEED_CELL), flaky_labels(bad=0)) as server:
        run_rlm(server, hooks, max_iterations=2)
    system = server.roots[0][0]["content"]
    assert "A custom function" not in system
    for name, entry in hooks.custom_tools.items():
        assert f"- `{name}`: {entry['description']}" in system


def test_ready_is_refused_while_requests_are_unresolved_and_rlm_gets_no_final_answer(
        cell_reply):
    hooks = rlm_hooks()
    with MockOpenAI(cell_reply(CLAIMING_CELL), flaky_labels(bad=10**6)) as server:
        result = run_rlm(server, hooks, max_iterations=2)
    assert result.response != "all labelled"  # rlm's own fallback answer, not the claim
    assert len(server.roots) == 3  # two cells refused, then rlm asks for a default answer
    assert "NotReady: answer['ready'] = True refused: 3 structured request(s)" in json.dumps(
        server.roots[1])
    assert len(hooks.finalization_check()) == 3  # the host can see why


def test_each_completion_answers_through_its_own_repl_and_resumes_the_same_evidence(
        cell_reply):
    """rlm makes a new REPL (and LM handler) per completion: the second completion's calls go
    through its own REPL, and the requests the first one left owed are resumed, not repeated."""
    hooks = rlm_hooks()
    with MockOpenAI(cell_reply(SEED_CELL), flaky_labels(bad=9)) as first:
        assert run_rlm(first, hooks, max_iterations=1).response != "pos,pos,pos"
    assert hooks.batch_status()["minimum_exact_retry_calls"] == 3
    with MockOpenAI(cell_reply(SEED_CELL), flaky_labels(bad=0)) as second:
        assert run_rlm(second, hooks, max_iterations=2).response == "pos,pos,pos"
    assert len(second.subcalls) == 3  # only the owed prompts, through the new handler
    assert hooks.finalization_check() == []


def test_the_hooks_refuse_what_is_not_an_rlm_repl():
    hooks = rlm_hooks()
    schema = {"type": "object"}
    with pytest.raises(ConfigError, match="llm_query_batched"):
        hooks.llm_batch_json(["a"], schema)  # called from host code, not from a REPL cell
    with pytest.raises(ConfigError, match="answer dict"):
        hooks.connect(["not", "a", "dict"])
    with pytest.raises(ConfigError, match="cannot gate"):
        hooks.connect({"content": "", "ready": False})  # a plain dict cannot be re-typed


def test_the_gate_holds_in_a_local_repl_run_by_hand_until_the_evidence_clears():
    """LocalREPL made directly with the same options, answered by rlm's LM handler over a
    mock LM client: the gate is rlm's own answer dict, refused ready included."""
    from rlm.clients.base_lm import BaseLM
    from rlm.core.lm_handler import LMHandler
    from rlm.core.types import ModelUsageSummary, UsageSummary
    from rlm.environments.local_repl import LocalREPL

    class ScriptedLM(BaseLM):
        def __init__(self, replies: list[str]) -> None:
            super().__init__(model_name=MODEL)
            self.replies = replies

        def completion(self, prompt: Any) -> str:
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

        async def acompletion(self, prompt: Any) -> str:
            return self.completion(prompt)

        def get_usage_summary(self) -> UsageSummary:
            return UsageSummary(model_usage_summaries={})

        def get_last_usage(self) -> ModelUsageSummary:
            return ModelUsageSummary(total_calls=1, total_input_tokens=0,
                                     total_output_tokens=0)

    hooks = rlm_hooks()
    handler = LMHandler(ScriptedLM(['{"label": "maybe"}'] * 4 + ['{"label": "pos"}']))
    handler.start()
    repl = LocalREPL(lm_handler_address=handler.address, custom_tools=hooks.custom_tools,
                     setup_code=hooks.setup_code)
    cell = ("schema = {'type': 'object', 'required': ['label']}\n"
            "def check(value, index):\n"
            "    if value['label'] != 'pos':\n"
            "        raise ValueError('label must be pos')\n"
            "r = llm_batch_json(['a', 'b'], schema, max_repair_attempts=0, validator=check)\n"
            "answer['content'] = str(r['values'])\n"
            "answer['ready'] = True\n")
    try:
        refused = repl.execute_code(cell)
        assert "NotReady" in refused.stderr and refused.final_answer is None
        assert len(hooks.finalization_check()) == 2
        with pytest.raises(NotReady):  # from the host's side too
            repl.locals["answer"]["ready"] = True
        accepted = repl.execute_code(cell)  # replays the two owed prompts
        assert accepted.stderr == "" and hooks.finalization_check() == []
        assert accepted.final_answer == str([{"label": "pos"}] * 2)
        assert len(accepted.rlm_calls) == 2  # rlm's own record of the subcalls
    finally:
        repl.cleanup()
        handler.stop()


# -- what cell code can defeat, and the host's check that it cannot -----------------------------
# One line each: in-process code can reach the base class of the gated answer dict (rlm's own
# _AnswerDict), whose __setitem__ / _on_ready capture the answer. docs/rlm.md lists them.
BYPASSES = {
    "the base class's __setitem__": 'type(answer).__mro__[1].__setitem__(answer, "ready", True)',
    "super().__setitem__": 'super(type(answer), answer).__setitem__("ready", True)',
    "re-typing the answer": 'answer.__class__ = type(answer).__mro__[1]\nanswer["ready"] = True',
    "rlm's private _on_ready": 'answer._on_ready(answer["content"])',
}


@pytest.mark.parametrize("bypass", list(BYPASSES))
def test_a_cell_that_gets_past_the_ready_gate_is_caught_by_the_host_s_check_after_completion(
        cell_reply, bypass):
    """rlm takes the claim (the gate lives in the cell's process and one line gets past it),
    but the documented host check reads the ledger, which the bypass did not touch."""
    hooks = rlm_hooks()
    cell = CLAIMING_CELL.replace('answer["ready"] = True', BYPASSES[bypass])
    assert cell != CLAIMING_CELL
    with MockOpenAI(cell_reply(cell), flaky_labels(bad=10**6)) as server:
        result = run_rlm(server, hooks, max_iterations=2)
    assert result.response == "all labelled"  # the bypass reached rlm
    owed = hooks.finalization_check()  # the host's check, as docs/rlm.md's snippet does it
    assert len(owed) == 3 and all("label must be" in entry["last_error"] for entry in owed)
    assert hooks.batch_status()["ready_allowed"] is False
    assert hooks.batch_status()["calls"] == len(server.subcalls)  # every subcall on record


def test_no_tool_a_cell_is_given_leads_to_the_session_or_its_ledger(cell_reply):
    """No bound method (``tool.__self__.session.ledger``), wrapped object or closure value
    hands a cell the session: it would let the cell forget its own gate."""
    from batchjson import Ledger, Session
    from batchjson.rlm import bind

    namespace: dict[str, Any] = {}
    session = bind(namespace, lambda prompts: ['{"label": "pos"}'] * len(prompts))
    hooks = rlm_hooks()
    given = [*namespace.values(), *(entry["tool"] for entry in hooks.custom_tools.values())]
    for tool in given:
        assert not hasattr(tool, "__self__") and not hasattr(tool, "__wrapped__"), tool
        reachable = [cell.cell_contents for cell in tool.__closure__ or ()]
        reachable += [*(tool.__defaults__ or ()), *vars(tool).values()]
        assert not [r for r in reachable if isinstance(r, (Session, Ledger, type(hooks)))
                    or hasattr(r, "session") or hasattr(r, "ledger")], tool
    probe = "seen = [hasattr(llm_batch_json, '__self__')]\n" + "".join(
        f"try:\n    {name}\n    seen.append(True)\nexcept NameError:\n    seen.append(False)\n"
        for name in ("batch_session", "run_batch", "session")) + (
        "answer['content'] = repr(seen)\nanswer['ready'] = True\n")  # LocalREPL has no eval
    with MockOpenAI(cell_reply(probe), flaky_labels(bad=0)) as server:
        result = run_rlm(server, hooks, max_iterations=2)
    assert result.response == "[False, False, False, False]"
    assert namespace["batch_status"]()["calls"] == 0 and session.evidence.unresolved_batches == 0
