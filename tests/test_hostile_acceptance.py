"""No bad item is ever committed: a hostile user's returns, schemas and validators, through the
public API only. Each test is the fault that broke (or would break) the promise."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, model_validator

from batchjson import CallableProvider, InvalidBatch, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

TASKS = [{"task_id": "a", "case_id": "078", "prompt": "p"}]
GOOD = '{"items": [{"task_id": "a", "case_id": "078", "verdict": "match"}]}'


def _session(reply: Any = GOOD, **options: Any) -> tuple[Session, list[int]]:
    sent: list[int] = []

    def fn(call: Any) -> str:
        sent.append(1)
        return reply(call) if callable(reply) else reply

    options.setdefault("repairs", 0)
    options.setdefault("replays", 0)
    return Session(CallableProvider(fn, source="hostile-acceptance"), **options), sent


class _Injects(BaseModel):
    """A before-validator that sets an identity field the item echoed correctly."""

    model_config = ConfigDict(extra="allow")
    verdict: str

    @model_validator(mode="before")
    @classmethod
    def _inject(cls, data: Any) -> Any:
        return {**data, "case_id": "079", "task_id": "b"} if isinstance(data, dict) else data


@pytest.mark.parametrize("identity", [None, ["task_id", "case_id"]])
def test_a_schema_that_adds_another_identity_value_commits_nothing(identity: Any) -> None:
    session, sent = _session()
    result = session.run_batch("inject", TASKS, _Injects, identity=identity,
                               on_exhausted="return")
    assert result.values == {} and sent == [1]
    assert session.ledger.checkpoint("inject") == {}
    assert any(e["type"] == "schema" and "case_id" in e["message"] for e in result.errors)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, GeneratorExit,
                                    asyncio.CancelledError])
def test_a_validator_raising_a_base_exception_is_a_validator_error_that_keeps_the_raw_text(
        raised: type[BaseException]) -> None:
    session, sent = _session()

    def check(item: Any, task: Any) -> None:
        raise raised("from the validator")

    result = session.run_batch("base", TASKS, LABEL_SCHEMA, validator=check,
                               on_exhausted="return")
    assert result.values == {}
    assert [e["type"] for e in result.errors] == ["validator_error"]
    (receipt,) = session.ledger.attempts("base")
    assert receipt.status == "rejected" and receipt.raw == GOOD  # paid for, and kept

    def fixed(item: Any, task: Any) -> None:
        return None

    again = session.run_batch("base", TASKS, LABEL_SCHEMA, validator=fixed)
    assert again.values["a"] == {"verdict": "match"}
    assert sent == [1] and again.rechecked == 1  # the kept return is re-judged, not re-bought


class _FalseLike:
    def __bool__(self) -> bool:
        return False


class bool_:  # noqa: N801 - the shape of numpy.bool_, without numpy
    __module__ = "numpy"

    def __init__(self, value: bool) -> None:
        self.value = value

    def __bool__(self) -> bool:
        return self.value


@pytest.mark.parametrize("returned", [0, "", "verdict must be no_match", [], 0.0, _FalseLike(),
                                      {"verdict": "no_match"}])
def test_a_validator_return_that_is_not_a_yes_never_commits(returned: Any) -> None:
    session, sent = _session()
    result = session.run_batch("ret", TASKS, LABEL_SCHEMA, on_exhausted="return",
                               validator=lambda item, task: returned)
    assert result.values == {} and session.ledger.checkpoint("ret") == {}
    assert [e["type"] for e in result.errors] == ["validator_error"]
    assert "return None or True to accept" in result.errors[0]["message"]


@pytest.mark.parametrize(("returned", "accepted"), [
    (None, True), (True, True), ("item", True), (False, False), (bool_(True), True),
    (bool_(False), False)])
def test_none_true_the_item_or_a_numpy_bool_decide_like_a_bool(returned: Any,
                                                               accepted: bool) -> None:
    session, _ = _session()

    def check(item: Any, task: Any) -> Any:
        return item if returned == "item" else returned

    result = session.run_batch("yes", TASKS, LABEL_SCHEMA, on_exhausted="return",
                               validator=check)
    assert bool(result.values) is accepted
    if not accepted:
        assert [e["type"] for e in result.errors] == ["validation"]


def test_an_async_validator_that_never_returns_ends_the_run_with_a_validator_error() -> None:
    session, sent = _session(items_reply, timeout=0.2)

    async def hangs(item: Any, task: Any) -> None:
        await asyncio.Event().wait()  # nothing ever sets it

    result = session.run_batch("hang", review_tasks(3), LABEL_SCHEMA, validator=hangs,
                               on_exhausted="return", identity=["task_id"])
    assert result.values == {}
    assert result.errors[0]["type"] == "validator_error"
    assert "did not return within" in result.errors[0]["message"]
    receipts = session.ledger.attempts("hang")
    assert receipts and all(r.status == "rejected" and r.raw for r in receipts)
    assert session.ledger.checkpoint("hang") == {}


def test_an_unpaired_surrogate_in_a_return_is_rejected_not_committed() -> None:
    session, _ = _session('{"items": [{"task_id": "a", "case_id": "078", "verdict": "\\ud800"}]}')
    result = session.run_batch("sur", TASKS, {"type": "object"}, on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("sur") == {}
    assert "surrogate" in result.errors[0]["message"]


@pytest.mark.parametrize("where", ["task_id", "prompt", "context", "instructions", "name"])
def test_an_unpaired_surrogate_in_the_input_is_refused_before_any_call(where: str) -> None:
    session, sent = _session()
    task = dict(TASKS[0])
    name, instructions = "sur", None
    if where == "instructions":
        instructions = "be \ud800 careful"
    elif where == "name":
        name = "sur\udfff"
    else:
        task[where] = task.get(where, "") + "\ud800"
    with pytest.raises(InvalidBatch, match="surrogate"):
        session.run_batch(name, [task], LABEL_SCHEMA, instructions=instructions)
    assert sent == [] and session.ledger.batch_names() == []


def test_a_return_echoing_an_unrequested_copy_of_a_task_is_rejected_whole() -> None:
    def reply(call: Any) -> str:
        items = json.loads(items_reply(call))["items"]
        twin = {**items[0], "verdict": "no_match" if items[0]["verdict"] == "match" else "match"}
        return json.dumps({"items": [*items, twin][::-1]})

    session, _ = _session(reply)
    result = session.run_batch("twin", review_tasks(4), LABEL_SCHEMA, pack=4,
                               on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("twin") == {}
    assert any(e.get("problem") == "duplicated" for e in result.errors)


@pytest.mark.parametrize("identity", [5, {"task_id": True}, object()])
def test_an_identity_that_is_not_a_list_of_names_is_refused_before_any_call(
        identity: Any) -> None:
    session, sent = _session()
    with pytest.raises(InvalidBatch, match="identity"):
        session.run_batch("ident", TASKS, LABEL_SCHEMA, identity=identity)
    assert sent == [] and session.ledger.batch_names() == []


def test_importing_receipts_inside_a_running_event_loop_rechecks_every_item(
        tmp_path: Any) -> None:
    """A Jupyter cell runs inside the kernel's event loop: import there must still judge."""
    from batchjson import Ledger
    from tests.test_recovery import items_for, receipt, write

    tasks = review_tasks(4)
    history = write(tmp_path / "old.jsonl",
                    receipt(tasks, items_for(tasks, {1: "gold-pair-079"})),
                    receipt(tasks, items_for(tasks)))
    ledger = Ledger(tmp_path / "ledger.sqlite")

    async def cell() -> dict[str, Any]:
        return ledger.import_receipts(history)

    report = asyncio.run(cell())
    assert [r["outcome"] for r in report["receipts"]] == ["diagnostic", "admitted"]
    assert report["items_admitted"] == 4


def test_a_validator_failing_on_stored_returns_sends_no_call() -> None:
    session, sent = _session(items_reply)
    tasks = review_tasks(6)
    session.run_batch("broken", tasks, LABEL_SCHEMA)
    assert len(sent) == 6

    def buggy(item: Any, task: Any) -> None:
        return item["missing-key"]  # KeyError on every item: retrying cannot help

    result = session.run_batch("broken", tasks, LABEL_SCHEMA, validator=buggy,
                               on_exhausted="return")
    assert len(sent) == 6 and result.calls == 0 and result.values == {}
    assert any(e["type"] == "validator_error" and "KeyError" in e["message"]
               for e in result.errors)
    assert "no call was sent" in " ".join(result.notes)


class _Lying(str):
    """A str whose own methods show other text than it holds."""

    def strip(self, *args: Any) -> str:
        return GOOD

    def startswith(self, *args: Any) -> bool:
        return False


def test_a_reply_text_that_is_a_lying_str_subclass_is_judged_by_what_it_holds() -> None:
    from batchjson import Reply

    bad = '{"items": [{"task_id": "a", "case_id": "079", "verdict": "match"}]}'
    session, _ = _session(lambda call: Reply(text=_Lying(bad)))
    result = session.run_batch("lie", TASKS, LABEL_SCHEMA, on_exhausted="return")
    assert result.values == {} and session.ledger.checkpoint("lie") == {}
    (receipt,) = session.ledger.attempts("lie")
    assert receipt.status == "rejected" and receipt.raw == bad  # judged what was kept


def _nested(depth: int, leaf: Any, wrap: Any) -> Any:
    for _ in range(depth):
        leaf = wrap(leaf)
    return leaf


@pytest.mark.parametrize("where", ["task", "schema"])
def test_input_nested_thousands_deep_is_refused_before_any_call(where: str) -> None:
    session, sent = _session()
    tasks, schema = [dict(TASKS[0])], dict(LABEL_SCHEMA)
    if where == "task":
        tasks[0]["meta"] = _nested(5000, [], lambda x: [x])
    else:
        schema = _nested(5000, {"type": "object"}, lambda x: {"anyOf": [x]})
    with pytest.raises(InvalidBatch, match="nested too deeply"):
        session.run_batch("deep", tasks, schema)
    assert sent == [] and session.ledger.batch_names() == []


_JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(returned=_JSONISH)
def test_only_none_or_true_from_a_validator_ever_commits(returned: Any) -> None:
    session, _ = _session()
    result = session.run_batch("prop", TASKS, LABEL_SCHEMA, on_exhausted="return",
                               validator=lambda item, task: returned)
    committed = bool(session.ledger.checkpoint("prop"))
    assert committed is (returned is None or returned is True)
    if not committed:
        assert result.errors[0]["type"] in ("validation", "validator_error")
    session.close()


@pytest.mark.parametrize("envelope", [None, "value"])
def test_an_enveloped_return_compares_identity_by_the_number_as_written(
        envelope: str | None) -> None:
    from batchjson import Reply

    text = '{"items": [{"task_id": "a", "v": 10000000000000001.0}]}'
    text = text if envelope is None else '{"value": ' + text + '}'
    session, _ = _session(lambda call: Reply(text=text, envelope=envelope))
    tasks = [{"task_id": "a", "v": 1e16, "prompt": "p"}]  # a float parse rounds the echo to it
    result = session.run_batch("env", tasks, {"type": "object"}, on_exhausted="return")
    assert result.values == {} and result.errors[0]["type"] == "identity"


@pytest.mark.parametrize("options", [
    {"mode": "value", "pack": 2},
    {"mode": "value", "identity": ["task_id", "case_id"]},
    {"validator_args": "index", "validator": lambda value, index: None},
], ids=["value-mode-packed", "value-mode-identity", "index-validator-without-index"])
def test_a_run_spec_its_mode_cannot_judge_is_refused_before_any_call(options: Any) -> None:
    from batchjson import RunSpec

    session, sent = _session('"match"')
    tasks = [{"task_id": "a", "case_id": "078", "prompt": "p"},
             {"task_id": "b", "case_id": "079", "prompt": "q"}]
    schema = {"type": "string"} if options.get("mode") == "value" else LABEL_SCHEMA
    with pytest.raises(InvalidBatch):
        session.run(RunSpec(name="spec", tasks=tasks, schema=schema, **options))
    assert sent == [] and session.ledger.batch_names() == []


def test_a_provider_widening_the_schema_it_was_sent_commits_nothing_outside_the_schema(
) -> None:
    import copy

    schema = copy.deepcopy(LABEL_SCHEMA)

    def widen(call: Any) -> str:
        call.schema["properties"]["items"]["items"]["properties"]["verdict"]["enum"].append(
            "BOGUS")
        return json.dumps({"items": [{"task_id": t["task_id"], "verdict": "BOGUS"}
                                     for t in call.tasks]})

    session, _ = _session(widen)
    result = session.run_batch("widen", review_tasks(2), schema, on_exhausted="return",
                               identity=["task_id"])
    assert result.values == {} and session.ledger.checkpoint("widen") == {}
    assert schema == LABEL_SCHEMA


def test_a_value_mode_provider_widening_its_schema_commits_nothing_outside_it() -> None:
    from batchjson import RunSpec

    def widen(call: Any) -> str:
        call.schema["enum"].append("BOGUS")
        return '"BOGUS"'

    session, _ = _session(widen)
    result = session.run(RunSpec(name="v", tasks=[{"task_id": "a", "prompt": "p"}],
                                 schema={"enum": ["match", "no_match"]}, mode="value",
                                 on_exhausted="return"))
    assert result.values == {} and result.errors[0]["type"] == "schema"
