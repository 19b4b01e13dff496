"""A validator edited while a batch job runs: the new revision's requests ask what the job's
asked (request keys name the validator; what the model sees does not), so they are left to that
job, paid once. Once it ends it is collected by its own revision's rules and its answers are
re-judged by the new ones, for free; only what they reject is asked again."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from batchjson import Budget
from batchjson.testing import LoopbackServer
from tests.helpers import ledger_rows
from tests.test_batch_jobs import SCHEMA, session, srv, tasks, within  # noqa: F401


def lenient(item: dict, task: dict) -> None:
    return None


def strict_on_t0(item: dict, task: dict) -> None:
    if task["task_id"] == "t0":
        raise ValueError("t0 needs a second look")


def labelled(item: dict, task: dict) -> None:
    if not item["label"].strip():
        raise ValueError("an empty label")


def in_background(work: Any) -> tuple[threading.Thread, list[Any]]:
    """``work()`` started on a thread of its own: the thread, and the list its result joins."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    return thread, out


def paid_receipts(target: Any) -> int:
    return ledger_rows(target, "SELECT COUNT(*) FROM attempts WHERE kind != 'recheck'")[0][0]


def test_a_validator_edited_while_its_job_runs_takes_that_jobs_answers_without_asking_again(
        ledger_at, srv):  # noqa: F811
    target = ledger_at()
    s = session(srv, target)
    first = s.run_batch("labels", tasks(), SCHEMA, transport="batch", validator=lenient)
    assert first.status == "pending" and srv.batches.created == 1
    edited = s.run_batch("labels", tasks(), SCHEMA, transport="batch", validator=strict_on_t0,
                         on_exhausted="return")
    assert edited.status == "pending" and srv.batches.created == 1  # not asked again
    assert {job["id"] for job in edited.jobs} == {first.jobs[0]["id"]}
    time.sleep(0.4)  # the job ends
    done = s.run_batch("labels", tasks(), SCHEMA, transport="batch", validator=strict_on_t0,
                       wait=True, repairs=1, replays=0, on_exhausted="return")
    s.close()
    assert set(done.values) == {"t1", "t2", "t3", "t4", "t5"} and done.status == "unresolved"
    # the first job's six answers, judged by its own rules, then re-judged by the new ones for
    # free: only t0, whose answer they reject, is asked again (its own first call and repair)
    assert any("under another revision's rules" in note for note in done.notes)
    asked = ledger_rows(target, "SELECT l.job_id, a.task_ids, a.kind FROM job_lines l JOIN "
                        "attempts a ON a.id = l.attempt_id WHERE l.job_id > 1 ORDER BY a.id")
    assert [(ids, kind) for _, ids, kind in asked] == [('["t0"]', "initial"),
                                                       ('["t0"]', "repair")]
    assert paid_receipts(target) == 8


def test_a_run_waiting_on_its_jobs_waits_for_the_job_an_edit_left_its_requests_to(srv):  # noqa: F811
    s = session(srv)
    assert s.run_batch("labels", tasks(), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    done = within(20, lambda: s.run_batch("labels", tasks(), SCHEMA, transport="batch",
                                          validator=labelled, wait=True))
    s.close()
    assert done.resolved and len(done.values) == 6 and not done.jobs
    assert srv.batches.created == 1 and done.cost == 0  # re-judged: no call of its own
    assert done.calls == 0


def test_a_run_counts_its_own_calls_beside_the_answers_it_re_judged(srv):  # noqa: F811
    """Fault: the run was planned again once the earlier job was collected, and its result
    kept only the second plan's counts: the calls it paid for its own job (t3-t5) read 0."""
    s = session(srv)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    done = within(20, lambda: s.run_batch("labels", tasks(6), SCHEMA, transport="batch",
                                          validator=labelled, wait=True))
    s.close()
    assert done.resolved and srv.batches.created == 2
    assert done.calls == 3 and done.cost > 0  # t3-t5, asked and paid by this run


def test_tasks_from_a_generator_are_read_once_when_an_earlier_job_is_re_judged(srv):  # noqa: F811
    """Fault: planning the run again read the generator a second time: "empty batch"."""
    s = session(srv)
    assert s.run_batch("labels", tasks(), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    time.sleep(0.4)
    done = within(20, lambda: s.run_batch("labels", (t for t in tasks()), SCHEMA,
                                          transport="batch", validator=labelled, wait=True))
    s.close()
    assert done.resolved and len(done.values) == 6 and srv.batches.created == 1


def test_a_wait_ends_when_the_earlier_jobs_output_cannot_be_read(srv):  # noqa: F811
    """Fault: the runner collecting the earlier job by its own rules knew its output was refused
    (a 403), but the run waiting on it did not, and polled it for ever."""
    s = session(srv)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    srv.batches.refuse_results = 403
    done = within(10, lambda: s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                                          validator=labelled, wait=True, on_exhausted="return"))
    s.close()
    assert done.status == "pending" and srv.batches.created == 1


def test_a_run_short_of_budget_does_not_ask_again_what_the_earlier_job_answered(tmp_path):
    """A budget too small for every line makes the run look at its requests again on each pass.
    Fault: once the earlier job was collected, the next pass found t0-t2 free and not accepted
    under the new keys, and submitted them again before their answers were re-judged."""
    with LoopbackServer() as probe:  # one line's worst case, as a job reserves it
        s = session(probe, tmp_path / "probe.sqlite", budget=Budget(cost=1.0),
                    extra_body={"max_completion_tokens": 200})
        s.run_batch("labels", tasks(1), SCHEMA, transport="batch", validator=lenient)
        s.close()
    [(worst,)] = ledger_rows(tmp_path / "probe.sqlite", "SELECT reserved FROM job_lines")
    target = tmp_path / "l.sqlite"
    with LoopbackServer() as server:
        server.batches.delay = 0.15
        s = session(server, target, budget=Budget(cost=5.5 * worst),
                    extra_body={"max_completion_tokens": 200})
        assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                           validator=lenient).status == "pending"
        time.sleep(0.1)
        server.batches.delay = 1.0  # the run's own jobs outlast the earlier one
        within(30, lambda: s.run_batch("labels", tasks(6), SCHEMA, transport="batch",
                                       validator=labelled, wait=True, on_exhausted="return"))
        s.close()
    asked = [ids for (ids,) in ledger_rows(target, "SELECT a.task_ids FROM job_lines l JOIN "
                                           "attempts a ON a.id = l.attempt_id")]
    assert len(asked) == len(set(asked)) == 6  # each task asked once: t0-t2 by the first job


def test_a_waiting_run_re_judges_the_earlier_jobs_answers_when_its_own_revision_collects_it(
        srv, tmp_path):  # noqa: F811
    """Fault: the earlier revision's run collected its job while this one waited on it; this run
    saw the job end but only re-judged a job it collected itself, so t0-t2 ended not_attempted
    though their answers were on record."""
    target = tmp_path / "l.sqlite"
    earlier = session(srv, target)
    assert earlier.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                             validator=lenient).status == "pending"
    edited = session(srv, target)
    edited.job_poll = 1.5  # the earlier revision's own run collects the job first
    waiting, out = in_background(lambda: edited.run_batch(
        "labels", tasks(6), SCHEMA, transport="batch", validator=labelled, wait=True,
        on_exhausted="return"))
    time.sleep(0.05)
    assert earlier.run_batch("labels", tasks(3), SCHEMA, transport="batch", validator=lenient,
                             wait=True).resolved
    waiting.join(30)
    earlier.close()
    edited.close()
    [done] = out
    assert done.resolved and len(done.values) == 6 and srv.batches.created == 2


def crashing(item: dict, task: dict) -> None:
    raise RuntimeError("a bug in the validator")


def test_a_validator_crash_on_the_earlier_jobs_answers_sends_nothing(srv):  # noqa: F811
    """As at planning, a validator that crashes on a stored answer stops the run before a call.
    Fault: the crash while re-judging the earlier job's answers went unheard, and a job of the
    same three prompts was paid for before the run stopped."""
    s = session(srv)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    done = within(20, lambda: s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                                          validator=crashing, wait=True, on_exhausted="return"))
    s.close()
    assert srv.batches.created == 1 and not done.values
    assert any("the validator failed while re-judging" in note for note in done.notes)


def test_under_accept_items_a_pack_answered_in_part_is_re_judged_once(srv, tmp_path):  # noqa: F811
    """Two earlier jobs ending apart: each made the run re-judge its requests. Fault: a pack the
    first had answered in part (t1 kept, t0 owed) was re-judged again when the second ended,
    writing a second 'partial' recheck and counting it resolved twice."""
    target = tmp_path / "l.sqlite"
    s = session(srv, target)
    srv.batches.delay = 0.6
    s.run_batch("labels", tasks(2), SCHEMA, transport="batch", pack=2, validator=lenient)
    time.sleep(0.25)
    srv.batches.delay = 3.0
    s.run_batch("labels", tasks(4), SCHEMA, transport="batch", pack=2, validator=labelled)
    done = within(30, lambda: s.run_batch(
        "labels", tasks(4), SCHEMA, transport="batch", pack=2, validator=strict_on_t0,
        accept="items", wait=True, repairs=0, replays=0, on_exhausted="return"))
    s.close()
    assert set(done.values) == {"t1", "t2", "t3"}
    rows = ledger_rows(target, "SELECT kind, status FROM attempts")
    assert rows.count(("recheck", "partial")) == 1


def test_a_live_run_after_a_validator_edit_leaves_the_jobs_prompts_to_it(srv):  # noqa: F811
    s = session(srv)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    calls = srv.requests
    live = s.run_batch("labels", tasks(3), SCHEMA, validator=labelled)
    s.close()
    assert live.status == "pending" and srv.requests == calls  # nothing sent live
    assert {e["type"] for e in live.errors} == {"pending"}


ANOTHER_KERNEL = textwrap.dedent("""
    import sys
    from batchjson import Session
    from batchjson._providers.openai import OpenAIProvider
    from tests.test_batch_jobs import SCHEMA, tasks
    def kernel_only(item, task):  # this process's validator: no other kernel registers it
        if task["case_id"] == "none":
            raise ValueError("no case")
    provider = OpenAIProvider("gpt-4o-mini", base_url=sys.argv[1], api_key="sk-test")
    s = Session(provider, ledger=sys.argv[2])
    print(s.run_batch("labels", tasks(), SCHEMA, transport="batch",
                      validator=kernel_only).status, flush=True)
    s.close()
""")


def test_a_job_whose_validator_this_kernel_lacks_keeps_its_prompts_and_says_how_to_free_them(
        tmp_path):
    target = tmp_path / "l.sqlite"
    with LoopbackServer() as server:
        server.batches.delay = 0.1
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run([sys.executable, "-c", ANOTHER_KERNEL, server.base_url,
                              str(target)], env=env, capture_output=True, text=True,
                             timeout=60, cwd=os.getcwd())
        assert out.stdout.strip() == "pending", out.stderr
        time.sleep(0.3)  # the job has ended
        s = session(server, target)
        result = within(20, lambda: s.run_batch("labels", tasks(), SCHEMA, transport="batch",
                                                validator=lenient, wait=True,
                                                on_exhausted="return"))
        s.close()
        assert result.status == "pending" and server.batches.created == 1  # never re-asked
        [note] = [n for n in result.notes if "under another revision's rules" in n]
        assert "not registered in this kernel" in note and "batchjson cancel 1" in note


def test_a_person_cancelling_the_earlier_revisions_job_stops_its_requests_for_this_run(
        tmp_path):
    """As for a job of the run's own revision, a person's cancel is not undone by the run.
    Fault: the run noted the cancel, then submitted the job's three prompts in a new job."""
    from batchjson._cli import main

    target = tmp_path / "l.sqlite"
    with LoopbackServer() as server:
        server.batches.delay = 1.0
        s = session(server, target)
        assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                           validator=lenient).status == "pending"
        waiting, out = in_background(lambda: s.run_batch(
            "labels", tasks(3), SCHEMA, transport="batch", validator=labelled, wait=True,
            on_exhausted="return"))
        time.sleep(0.3)
        os.environ.setdefault("OPENAI_API_KEY", "sk-test")
        assert main(["cancel", "1", "--ledger", str(target)], io.StringIO()) == 0
        waiting.join(30)
        s.close()
    [done] = out
    assert server.batches.created == 1 and not done.values
    assert any("was cancelled while this run watched it" in note for note in done.notes)


def test_an_overrun_in_the_earlier_jobs_answers_is_said_by_the_run(srv, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    """Fault: the runner collecting the earlier job by its own rules found a line billed beyond
    its reservation (the budget stopped), but the run's result never said why."""
    from batchjson._replay.settle import Settle

    s = session(srv, tmp_path / "l.sqlite", budget=Budget(cost=1.0),
                extra_body={"max_completion_tokens": 50})
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                       validator=lenient).status == "pending"
    time.sleep(0.4)
    monkeypatch.setattr(Settle, "cost", lambda self, reply: 0.05)  # beyond the worst case
    done = within(20, lambda: s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                                          validator=strict_on_t0, wait=True,
                                          on_exhausted="return"))
    s.close()
    assert srv.batches.created == 1  # t0's repair is not sent: the budget stopped
    assert any(note.startswith("calls billed beyond") for note in done.notes)


async def slowly_lenient(item: dict, task: dict) -> None:
    await asyncio.sleep(0.3)  # two collections of one job interleave


@pytest.mark.parametrize("sessions", [1, 2])
def test_a_job_two_runs_collect_at_once_is_charged_once(srv, tmp_path, sessions):  # noqa: F811
    """The run that ends a job second records nothing. Fault: it charged every line all the
    same, so the session's (or the two sessions') spend counted the job twice."""
    target = tmp_path / "l.sqlite"
    runners = [session(srv, target) for _ in range(sessions)] * (3 - sessions)
    assert runners[0].run_batch("labels", tasks(3), SCHEMA, transport="batch",
                                validator=slowly_lenient).status == "pending"
    time.sleep(0.4)
    runs = [in_background(lambda s=s: s.run_batch(
        "labels", tasks(3), SCHEMA, transport="batch", validator=slowly_lenient, wait=True))
        for s in runners]
    for run, _ in runs:
        run.join(30)
    out = [result for _, results in runs for result in results]
    [(paid,)] = ledger_rows(target, "SELECT SUM(cost) FROM attempts")
    spent = {id(s): (s.spent_calls, s.spent_cost) for s in runners}
    for s in set(runners):
        s.close()
    assert len(out) == 2 and all(result.resolved for result in out)
    assert srv.batches.created == 1
    assert sum(calls for calls, _ in spent.values()) == 3
    assert sum(cost for _, cost in spent.values()) == pytest.approx(paid)


def test_a_job_another_session_collected_frees_this_sessions_reservations(srv, tmp_path):  # noqa: F811
    """Fault: the session that submitted a job kept its lines' worst cases reserved for ever
    once another session collected it: its cost budget shrank for good, and the two sessions
    counted six calls for three."""
    target = tmp_path / "l.sqlite"
    a = session(srv, target, budget=Budget(cost=1.0), extra_body={"max_completion_tokens": 50})
    assert a.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    assert a.tally.reserved > 0 and a.spent_calls == 3
    time.sleep(0.4)
    b = session(srv, target, extra_body={"max_completion_tokens": 50})
    assert b.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True).resolved
    assert a.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True).resolved
    counted = a.spent_calls + b.spent_calls
    a.close()
    b.close()
    assert a.tally.reserved == pytest.approx(0.0) and counted == 3


def test_a_run_that_lost_the_race_to_end_a_job_keeps_to_its_max_calls(srv, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """Another session ends the job between this run's look at it and its own end. Fault: this
    run released the lines' reservations through its own counts, which never held them, so
    its max_calls=1 allowed three new calls."""
    import dataclasses

    from batchjson._replay.budget import Tally
    from batchjson._replay.jobs import JobRunner
    from batchjson._session.batches import collector

    target = tmp_path / "l.sqlite"
    a = session(srv, target)
    assert a.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    time.sleep(0.4)
    other = dataclasses.replace(a.runtime(), job_reservations={}, tally=Tally())
    collect, raced = JobRunner._collect, []

    async def another_session_first(self, row, batch, detail):
        if not raced:
            raced.append(row["id"])
            await collect(collector(other, row), row, batch, dict(detail))
        await collect(self, row, batch, detail)

    monkeypatch.setattr(JobRunner, "_collect", another_session_first)
    a.run_batch("labels", tasks(6), SCHEMA, transport="batch", wait=True, max_calls=1,
                on_exhausted="return")
    a.close()
    [(sent,)] = ledger_rows(target, "SELECT COUNT(*) FROM job_lines WHERE job_id > 1")
    assert raced and sent <= 1


def test_a_job_cancelled_while_uncertain_stays_counted_in_the_session(srv, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """The provider created the job but its answer was lost (uncertain); a person cancelled it.
    The ledger keeps its lines as possibly billed. Fault: the session's next run freed their
    reservations as if another session had charged them, and its calls budget sent them
    again."""
    from batchjson._cli import main
    from batchjson._errors import ProviderError
    from batchjson._providers.openai import OpenAIBatches

    srv.batches.delay = 5.0
    create, find = OpenAIBatches.create, OpenAIBatches.find

    async def answer_lost(self: Any, file_id: str, metadata: Any) -> Any:
        await create(self, file_id, metadata)  # created at the provider, billed
        raise ProviderError("connection reset after the request was sent")

    async def not_listed(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(OpenAIBatches, "create", answer_lost)
    monkeypatch.setattr(OpenAIBatches, "find", not_listed)
    target = tmp_path / "l.sqlite"
    s = session(srv, target, budget=Budget(calls=3), extra_body={"max_completion_tokens": 50})
    first = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", on_exhausted="return")
    assert [job["status"] for job in first.jobs] == ["uncertain"]
    monkeypatch.setattr(OpenAIBatches, "create", create)
    monkeypatch.setattr(OpenAIBatches, "find", find)
    os.environ.setdefault("OPENAI_API_KEY", "sk-test")
    assert main(["cancel", "1", "--ledger", str(target)], io.StringIO()) == 0
    srv.batches.delay = 0.1
    with pytest.raises(Exception, match="budget"):  # its three calls are spent already
        s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    calls, reserved = s.spent_calls, s.tally.reserved
    s.close()
    assert srv.batches.created == 1 and calls == 3 and reserved == pytest.approx(0.0)


def test_an_estimate_sees_the_budget_a_job_another_session_collected_left(srv, tmp_path):  # noqa: F811
    """Fault: the estimate still counted the job's worst cases as held, and said the budget
    would not suffice for a run that then resolved."""
    probe = session(srv, tmp_path / "probe.sqlite", budget=Budget(cost=1.0),
                    extra_body={"max_completion_tokens": 50})
    probe.run_batch("labels", tasks(3), SCHEMA, transport="batch")  # three lines' worst case
    held = probe.tally.reserved
    probe.close()
    target = tmp_path / "l.sqlite"
    a = session(srv, target, budget=Budget(cost=held * 1.5),
                extra_body={"max_completion_tokens": 50})
    assert a.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    time.sleep(0.4)
    b = session(srv, target, extra_body={"max_completion_tokens": 50})
    assert b.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True).resolved
    b.close()
    other = [dict(t, task_id=f"u{t['task_id']}", prompt=t["prompt"] + " again")
             for t in tasks(3)]
    estimate = a.estimate("labels2", other, SCHEMA, transport="batch")
    done = a.run_batch("labels2", other, SCHEMA, transport="batch", wait=True)
    a.close()
    assert estimate.budget_suffices and done.resolved
