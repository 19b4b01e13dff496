"""A run's progress, as a person on a terminal sees it (tqdm's text bar on stderr): from the first
moment of a streamed input, with time, counts and cost, ending in the run's outcome; quiet where
nobody watches (pipes, tests, RLM bindings) and when asked."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from batchjson import Budget, CallableProvider, Session
from batchjson._providers.base import Reply
from batchjson.testing import LoopbackServer
from batchjson.testing.simulated import SimulatedModel
from tests.helpers import LABEL_SCHEMA, items_reply, openai, review_tasks

RED, GREEN, YELLOW = "\x1b[31m", "\x1b[32m", "\x1b[33m"
# tqdm's brackets: elapsed<remaining (the ETA), the rate
TIMES = re.compile(r"\[\d\d:\d\d<(\d\d:\d\d|\?), +(\?|[\d.]+k?)task/s")


def last_state(err: str) -> str:
    """The bar as it stands at the end: its last line, after the last carriage return."""
    return err.rstrip("\n").split("\n")[-1].split("\r")[-1]


def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)


def test_the_progress_says_time_eta_rate_returns_accepted_and_rejected_and_cost_of_the_budget(
        capsys: pytest.CaptureFixture) -> None:
    calls = iter(range(100))

    def model(call: Any) -> Reply:  # the first return is broken, then each one passes
        text = "not json" if next(calls) == 0 else items_reply(call)
        return Reply(text, input_tokens=100, output_tokens=20, cost=0.00014)

    provider = CallableProvider(model, price={"input": 1.0, "output": 2.0}, max_tokens=100)
    session = Session(provider, budget=Budget(cost=1.0), concurrency=1)
    result = session.run_batch("labels", review_tasks(8), LABEL_SCHEMA, pack=2, progress=True)
    end = last_state(capsys.readouterr().err)
    assert result.status == "resolved" and result.rejected_returns == 1
    assert end.startswith("labels resolved: 100%") and "| 8/8 " in end, end
    assert TIMES.search(end) and "<00:00" in end, end  # elapsed, then no time left
    # 5 calls of 100 tokens in at $1/M and 20 out at $2/M
    assert end.endswith("returns: 4 accepted, 1 rejected, $0.0007 (session $0.0007 of $1.00 "
                        "budget)]"), end
    assert GREEN in end
    session.close()


def test_a_streamed_input_shows_progress_while_its_first_pass_reads_it(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from batchjson._session import run as progress

    monkeypatch.setattr(progress, "READING_DELAY", 0.05)  # half a second, shortened
    shown_while_reading: list[str] = []

    def slowly() -> Iterator[dict[str, Any]]:
        tasks = review_tasks(6)
        for n, task in enumerate(tasks):
            time.sleep(0.05)
            if n == len(tasks) - 1:  # the last task: the first pass has not ended yet
                shown_while_reading.append(capsys.readouterr().err)
            yield task

    session = Session(CallableProvider(items_reply, source="m"))
    session.run_batch("streamed", slowly(), LABEL_SCHEMA, pack=2, progress=True)
    assert "streamed: reading tasks: " in shown_while_reading[0]
    assert re.search(r"reading tasks: [1-5]task \[00:00, ", shown_while_reading[0])
    assert last_state(capsys.readouterr().err).startswith("streamed resolved: 100%")
    session.close()


def test_a_run_that_ends_with_nothing_accepted_is_shown_unresolved_in_red_not_as_a_full_bar(
        capsys: pytest.CaptureFixture) -> None:
    session = Session(CallableProvider(lambda call: "not json", source="m"), repairs=0,
                      replays=0)
    result = session.run_batch("refused", review_tasks(6), LABEL_SCHEMA, pack=2,
                               on_exhausted="return", progress=True)
    end = last_state(capsys.readouterr().err)
    assert result.status == "unresolved" and not result.values
    assert end.startswith("refused unresolved:   0%") and "| 0/6 " in end, end
    assert RED in end and GREEN not in end and "100%" not in end
    assert "returns: 0 accepted, 3 rejected" in end, end
    session.close()


def test_a_resumed_batch_counts_its_resumed_tasks_from_the_start(
        capsys: pytest.CaptureFixture) -> None:
    session = Session(CallableProvider(items_reply, source="m"))
    session.run_batch("r", review_tasks(6), LABEL_SCHEMA, pack=2)
    capsys.readouterr()
    session.run_batch("r", review_tasks(8), LABEL_SCHEMA, pack=2, progress=True)
    err = capsys.readouterr().err
    assert "r:  75%" in err and "| 6/8 [" in err, err  # 2000/2000 at the end, not 20/20
    assert "| 8/8 [" in last_state(err)
    session.close()


def test_a_batch_job_run_says_it_waits_on_the_provider_and_a_pending_one_ends_amber(
        capsys: pytest.CaptureFixture) -> None:
    schema = {"type": "object", "properties": {"task_id": {"type": "string"},
                                               "label": {"type": "string"}},
              "required": ["task_id", "label"]}
    tasks = [{"task_id": f"t{i}", "prompt": f"Label review {i}."} for i in range(3)]
    with LoopbackServer() as srv:
        srv.batches.delay = 0.3
        session = Session(openai(srv))
        session.job_poll = 0.05
        pending = session.run_batch("jobs", tasks, schema, transport="batch", progress=True,
                                    on_exhausted="return")
        end = last_state(capsys.readouterr().err)
        assert pending.status == "pending"
        assert end.startswith("jobs pending:   0%") and YELLOW in end, end
        done = session.run_batch("jobs", tasks, schema, transport="batch", wait=True,
                                 progress=True)
        err = capsys.readouterr().err
        session.close()
    assert done.status == "resolved"
    assert "waiting on 1 provider batch job(s)" in err, err
    assert last_state(err).startswith("jobs resolved: 100%")


def test_progress_false_prints_nothing_even_on_a_terminal(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    on_a_terminal(monkeypatch)
    session = Session(CallableProvider(items_reply, source="m"))
    session.run_batch("r", review_tasks(4), LABEL_SCHEMA, progress=False)
    assert capsys.readouterr().err == ""
    session.close()


def test_by_default_progress_shows_on_a_terminal_and_not_in_a_pipe(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    session = Session(CallableProvider(items_reply, source="m"))
    session.run_batch("piped", review_tasks(4), LABEL_SCHEMA)  # stderr is no terminal here
    assert capsys.readouterr().err == ""
    on_a_terminal(monkeypatch)
    session.run_batch("watched", review_tasks(4), LABEL_SCHEMA)
    assert last_state(capsys.readouterr().err).startswith("watched resolved: 100%")
    session.close()


def test_rlm_bindings_are_quiet_by_default_even_on_a_terminal(
        capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host may feed what a cell prints to a model: a bar there is noise it pays for."""
    from batchjson.rlm import bind

    on_a_terminal(monkeypatch)
    session = Session(SimulatedModel(answer=lambda task: {"verdict": "match"}))
    namespace: dict[str, Any] = {}
    bind(namespace, session=session)
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}}}
    out = namespace["llm_batch_json"](["Is 1 a match?", "Is 2 a match?"], schema)
    direct = session.llm_batch_json(["Is 3 a match?"], schema)
    assert len(out["values"]) == 2 and len(direct["values"]) == 1
    assert capsys.readouterr().err == ""
    session.close()


def test_the_progress_counts_returns_accepted_in_part_under_item_acceptance(
        capsys: pytest.CaptureFixture) -> None:
    tasks = review_tasks(4)
    bad = tasks[0]["task_id"]
    session = Session(CallableProvider(lambda call: items_reply(
        call, **{bad: {"verdict": "perhaps"}}), source="m"), repairs=0, replays=0)
    result = session.run_batch("in_part", tasks, LABEL_SCHEMA, pack=2, accept="items",
                               on_exhausted="return", progress=True)
    end = last_state(capsys.readouterr().err)
    assert len(result.values) == 3 and result.partial_returns == 1
    assert "returns: 1 accepted, 1 in part, 0 rejected" in end, end
    session.close()
