"""The batch transport streams a run's requests too: a job's worth at a time, never all of them.

Each test shrinks the window, the spill size and the lines a job takes (the provider's own
ceiling, 50,000 OpenAI requests, is what a million tasks meet), so a couple of hundred tasks
exercise what a million would, and checks the same keys, values and receipts as one job holding
everything.
"""

from __future__ import annotations

from typing import Any

import pytest

from batchjson import Session
from batchjson._providers.batch_client import BatchClient
from batchjson._replay import jobs
from batchjson.testing import BatchFaults, LoopbackServer
from tests.helpers import ledger_rows, openai
from tests.test_batch_jobs import SCHEMA, tasks
from tests.test_window import live_requests, request_keys, small_windows  # noqa: F401

JOB = 5  # lines a job takes


@pytest.fixture
def small_jobs(monkeypatch, small_windows):  # noqa: F811
    """Jobs of 5 lines, ended jobs' lines judged 4 at a time."""
    for cls in BatchClient.__subclasses__():
        monkeypatch.setattr(cls, "max_requests", JOB)
    monkeypatch.setattr(jobs, "WINDOW", 4)


def batch_session(srv: LoopbackServer, path: Any) -> Session:
    s = Session(openai(srv), ledger=path)
    s.job_poll = 0.02
    return s


def test_a_batch_run_holds_about_a_jobs_requests_never_all_of_them(tmp_path, monkeypatch,
                                                                    small_jobs):
    n = 200
    with LoopbackServer() as srv:
        srv.batches.delay = 2.0  # every job still running when the first run returns
        held = live_requests(monkeypatch)
        first = batch_session(srv, tmp_path / "w.sqlite")
        pending = first.run_batch("labels", tasks(n), SCHEMA, transport="batch")
        assert pending.status == "pending" and srv.batches.created == n // JOB
        assert job_rows(tmp_path / "w.sqlite") == n // JOB
        assert len(pending.errors) == n and {e["type"] for e in pending.errors} == {"pending"}
        assert pending.errors[n - 1]["message"].startswith(f"submitted in job {n // JOB} ")
        first.close()
        again = batch_session(srv, tmp_path / "w.sqlite")  # another kernel collects
        done = again.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True)
        again.close()
        assert held["most"] <= 30, held  # n if every request were held at once
        assert done.status == "resolved" and srv.batches.created == n // JOB
        monkeypatch.undo()
        whole = batch_session(srv, tmp_path / "whole.sqlite")
        one = whole.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True)
        whole.close()
    assert srv.batches.created == n // JOB + 1  # everything in one job without the ceiling
    assert request_keys(tmp_path / "w.sqlite") == request_keys(tmp_path / "whole.sqlite")
    assert dict(done.values) == dict(one.values) and len(one.values) == n
    assert sorted(job_lines(tmp_path / "w.sqlite")) == [(JOB,)] * (n // JOB)


def test_follow_ups_of_ended_jobs_are_sent_a_job_at_a_time(tmp_path, monkeypatch, small_jobs):
    """Errored and expired lines of every job come back as follow-up jobs of at most a job's
    lines each, while no more than about a job's requests are held."""
    n = 60
    with LoopbackServer() as srv:
        srv.batches.delay = 0.05
        srv.batches.faults = [BatchFaults(lines={1: "errored", 3: "expired"})] * (n // JOB)
        held = live_requests(monkeypatch)
        s = batch_session(srv, tmp_path / "w.sqlite")
        result = s.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True)
        s.close()
    assert result.status == "resolved" and len(result.values) == n
    assert result.provider_errors == 2 * (n // JOB)
    assert held["most"] <= 30, held
    sizes = [size for (size,) in job_lines(tmp_path / "w.sqlite")]
    assert max(sizes) <= JOB and sum(sizes) == n + 2 * (n // JOB)
    assert ledger_rows(tmp_path / "w.sqlite", "SELECT COUNT(*) FROM attempts WHERE status = "
                       "'accepted'") == [(n,)]


def job_rows(path: Any) -> int:
    return ledger_rows(path, "SELECT COUNT(*) FROM jobs")[0][0]


def job_lines(path: Any) -> list[tuple[int]]:
    return ledger_rows(path, "SELECT COUNT(*) FROM job_lines GROUP BY job_id")


def test_requests_a_past_run_gave_up_on_start_a_new_chain_as_replays(tmp_path):
    """What an earlier run found on record decides the chain: its exhausted requests are sent
    again (as replays), once, and not again within the same run."""
    path = tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.05
        srv.batches.faults = [BatchFaults(whole="all_failed")] * 2
        s = batch_session(srv, path)
        gave_up = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True,
                              replays=0, on_exhausted="return")
        assert gave_up.status == "unresolved" and srv.batches.created == 1
        again = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True,
                            replays=0, on_exhausted="return")
        assert again.status == "unresolved" and srv.batches.created == 2  # one job, no more
        done = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True,
                           replays=0)
        s.close()
    assert done.resolved and srv.batches.created == 3
    kinds = ledger_rows(path, "SELECT kind, COUNT(*) FROM attempts GROUP BY kind ORDER BY kind")
    assert kinds == [("initial", 3), ("replay", 6)]
