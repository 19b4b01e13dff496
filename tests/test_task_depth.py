"""A task nested deeper than every copy of it can be made is refused before anything is written:
its request is copied, keyed, stored and read back by recursive code on other threads' stacks
(the session's loop, a provider's executor), so "it encoded once here" is not enough."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from batchjson import CallableProvider, Session
from batchjson._content.tasks import MAX_TASK_DEPTH, normalize_tasks
from batchjson._errors import InvalidBatch
from tests.helpers import LABEL_SCHEMA


def _lists(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def _answer(call: Any) -> str:
    return json.dumps({"items": [{"task_id": t["task_id"], "verdict": "match"}
                                 for t in call.tasks]})


def test_a_task_nested_near_the_recursion_limit_is_refused_before_any_receipt():
    """Run from a fresh thread (a shallow stack, as a script's main thread is): at every depth
    up to where encoding fails, the run either resolves or is an InvalidBatch with nothing on
    record; never a RecursionError, never a receipt left in flight for a call not sent."""
    sent: list[int] = []
    session = Session(CallableProvider(lambda call: sent.append(1) or _answer(call),
                                       source="test-model"))
    outcomes: dict[int, str] = {}
    limit = sys.getrecursionlimit()

    def sweep() -> None:
        for depth in range(limit - 60, limit + 5):
            try:
                result = session.run_batch(f"d{depth}", [{"task_id": "a", "prompt": "p",
                                                          "ctx": _lists(depth)}],
                                           LABEL_SCHEMA, identity=["task_id"])
                outcomes[depth] = result.status
            except InvalidBatch:
                outcomes[depth] = "refused"
            except BaseException as exc:  # noqa: BLE001 - what the test is looking for
                outcomes[depth] = type(exc).__name__

    runner = threading.Thread(target=sweep)
    runner.start()
    runner.join()
    try:
        assert {o for o in outcomes.values()} <= {"resolved", "refused"}, {
            d: o for d, o in outcomes.items() if o not in ("resolved", "refused")}
        assert session.ledger.spend()["in_flight_calls"] == 0
        assert session.ledger.spend()["calls"] == len(sent)
    finally:
        session.close()


def test_a_task_deeper_than_the_bound_is_an_invalid_batch_naming_it():
    ok = [{"task_id": "a", "prompt": "p", "ctx": _lists(MAX_TASK_DEPTH - 1)}]
    assert normalize_tasks(ok, None)[0][0]["ctx"] == _lists(MAX_TASK_DEPTH - 1)
    deep = [{"task_id": "a", "prompt": "p"},
            {"task_id": "b", "prompt": "p", "ctx": _lists(MAX_TASK_DEPTH)}]
    with pytest.raises(InvalidBatch, match=r"task 'b' is nested too deeply .*flatten it"):
        normalize_tasks(deep, None)


def test_brackets_inside_strings_are_not_nesting():
    tasks = [{"task_id": "a", "prompt": "[" * (3 * MAX_TASK_DEPTH) + "{" * MAX_TASK_DEPTH}]
    assert normalize_tasks(tasks, None)[0][0]["prompt"] == tasks[0]["prompt"]


def test_a_task_that_holds_itself_is_refused_as_a_cycle_not_as_too_deep():
    """A task is encoded without a search for cycles; a cycle recurses to the interpreter's
    limit, and the error must still say it is a cycle (the fix differs from flattening)."""
    looped: dict[str, Any] = {"task_id": "b", "prompt": "p", "ctx": []}
    looped["ctx"].append(looped)
    for tasks in ([looped], (task for task in [{"task_id": "a", "prompt": "p"}, looped])):
        with pytest.raises(InvalidBatch, match=r"task 'b' is not JSON-serialisable \(Circular "
                                               r"reference detected\)"):
            normalize_tasks(tasks, None, pack=2)
    session = Session(CallableProvider(_answer))
    with pytest.raises(InvalidBatch, match="Circular reference"):
        session.run_batch("looped", [looped], {"type": "object"})
    assert session.ledger.spend()["calls"] == 0
    session.close()


RAISED_LIMIT = """
import sys
from batchjson import CallableProvider, InvalidBatch, Session
from batchjson._content.tasks import normalize_tasks

sys.setrecursionlimit(200_000)  # a notebook's raised limit: deeper than the C stack can go
looped = {"task_id": "loop", "prompt": "p"}
looped["self"] = looped
listed = {"task_id": "list", "prompt": "p", "ctx": []}
listed["ctx"].append(listed)
chain = first = {"task_id": "chain", "prompt": "p"}
for _ in range(2000):  # a cycle longer than the bound on depth
    chain["next"] = {}
    chain = chain["next"]
chain["next"] = first
deep = 0
for _ in range(150_000):
    deep = [deep]
deep_task = {"task_id": "deep", "prompt": "p", "ctx": deep}
for task in (looped, listed, first, deep_task):
    try:
        normalize_tasks([task], None, pack=1)
    except InvalidBatch as exc:
        print(exc)
session = Session(CallableProvider(lambda call: "{}", source="m"))
try:
    session.run_batch("looped", [looped], {"type": "object"})
except InvalidBatch as exc:
    print("run:", exc, session.ledger.spend()["calls"])
"""


def test_a_raised_recursion_limit_still_refuses_cycles_and_deep_tasks_without_a_crash():
    """The encoder recurses in C: with the interpreter's limit raised past what the stack holds,
    a cycle or a deep task must still be an InvalidBatch naming it, never a segfault."""
    out = subprocess.run([sys.executable, "-c", RAISED_LIMIT], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stdout.splitlines()
    assert [line.split(" is ")[0] for line in said] == [
        "task 'loop'", "task 'list'", "task 'chain'", "task 'deep'", "run: task 'loop'"], said
    for line in (said[0], said[1], said[2], said[4]):
        assert "not JSON-serialisable (Circular reference detected)" in line
    assert "nested too deeply to encode as JSON; flatten it" in said[3]
    assert said[4].endswith(" 0")  # nothing called


def test_a_cycle_longer_than_the_depth_bound_is_named_a_cycle():
    first = chain = {"task_id": "a", "prompt": "p"}
    for _ in range(2000):
        chain["next"] = {}
        chain = chain["next"]
    chain["next"] = first
    with pytest.raises(InvalidBatch, match=r"task 'a' is not JSON-serialisable \(Circular"):
        normalize_tasks([first], None)


def test_a_deep_list_shared_at_every_level_is_refused_as_deep_without_walking_every_path():
    """One list shared at each of 1,200 levels is 1,200 containers to the encoder, which stops
    at the recursion limit, but 2**1200 paths to a walk naming why: the walk is bounded."""
    shared: list[Any] = []
    for _ in range(1200):
        shared = [shared, shared]
    with pytest.raises(InvalidBatch, match="task 'x' is nested too deeply to encode as JSON"):
        normalize_tasks([{"task_id": "x", "prompt": "p", "ctx": shared}], None)
