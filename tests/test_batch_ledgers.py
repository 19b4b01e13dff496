"""Batch jobs and the ledger, on SQLite and PostgreSQL alike: a merge or an export never carries
away receipts a job may still answer (and bill) without the job row that collects them; a job
whose runner died recording it is uncertain by the rule for claims (its process on this host,
its lease elsewhere) and, on OpenAI, found again by its uid; a job refused at create is never
uncertain."""

from __future__ import annotations

import time

import pytest

from batchjson import Ledger
from batchjson._errors import InvalidBatch, LedgerError
from batchjson.testing import BatchFaults, LoopbackServer
from tests.helpers import ledger_rows
from tests.test_batch_jobs import SCHEMA, run_child, session, tasks


@pytest.fixture
def srv():
    with LoopbackServer() as server:
        server.batches.delay = 0.3
        yield server


def test_a_merge_refuses_a_ledger_whose_job_may_still_answer_and_takes_it_once_collected(
        srv, ledger_at):
    source, target = ledger_at("source"), ledger_at("target")
    s = session(srv, source)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    [job] = s.ledger.store.jobs()
    held = Ledger(target)
    with pytest.raises(LedgerError) as refused:
        held.merge(source)
    message = str(refused.value)
    assert f"job(s) 1 (batch 'labels', {job['provider_job_id']})" in message
    assert "batchjson cancel" in message and "then merge it" in message
    assert held.batch_names() == []  # nothing was written
    time.sleep(0.5)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").resolved
    s.close()
    report = held.merge(source)
    assert report["added"]["attempts"] == 3 and len(held.checkpoint("labels")) == 3
    assert not held.attempts("labels", failed=True)  # no receipt left in flight
    held.close()


def test_a_merge_refuses_a_ledger_whose_job_may_exist_without_its_id(ledger_at):
    """A kill between create and record: the job may be billed, so it is never merged away."""
    source, target = ledger_at("source"), ledger_at("target")
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        run_child(srv, source, "before-record")
    with pytest.raises(LedgerError, match=r"job\(s\) 1 \(batch 'labels', recording\)"):
        Ledger(target).merge(source)


def test_an_export_refuses_a_batch_whose_job_may_still_answer(srv):
    s = session(srv)
    s.run_batch("labels", tasks(2), SCHEMA, transport="batch")
    with pytest.raises(InvalidBatch, match=r"batch 'labels' has unfinished batch job\(s\) 1 "):
        s.ledger.export_receipts("labels")
    with pytest.raises(InvalidBatch, match="this ledger has unfinished"):
        s.ledger.export_receipts()
    time.sleep(0.5)
    assert s.run_batch("labels", tasks(2), SCHEMA, transport="batch").resolved
    assert len(s.ledger.export_receipts("labels")) == 2
    s.close()


# -- uncertain jobs, on this host and others ---------------------------------------------------

def others(tag: str) -> list[dict[str, str]]:
    return [{"task_id": f"{tag}{i}", "case_id": tag, "prompt": f"Another review {tag}{i}."}
            for i in range(2)]


def test_a_kill_between_create_and_record_is_found_by_its_uid_and_polled_not_resubmitted(
        ledger_at):
    """OpenAI keeps the job's uid as the batch's metadata: the batch list finds it (paged, a
    batch at a time here, past two batches of other runs), and the job is collected."""
    target = ledger_at()
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        s = session(srv, target)
        s.run_batch("other", others("a"), SCHEMA, transport="batch", wait=True)
        run_child(srv, target, "before-record")
        s.run_batch("later", others("b"), SCHEMA, transport="batch", wait=True)
        assert srv.batches.created == 3
        srv.batches.page_limit = 1
        listed = srv.batches.listed
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        assert result.resolved and len(result.values) == 6
        assert srv.batches.created == 3  # the child's job, polled: nothing submitted again
        assert srv.batches.listed - listed >= 2  # it took more than one page to find it
        assert any("found as batch_" in note and "by its uid" in note for note in result.notes)
        [job] = [j for j in s.ledger.store.jobs(every=True) if j["batch"] == "labels"]
        assert job["status"] == "ended"
        s.close()


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_runner_on_another_host_that_died_recording_is_gone_once_its_lease_ran_out(ledger_at,
                                                                                   protocol):
    """Then the job is uncertain: found by its uid and collected on OpenAI, shown and never
    resubmitted on Anthropic."""
    target = ledger_at()
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        run_child(srv, target, "before-record", protocol, BATCHJSON_HOST="elsewhere",
                  CHILD_LEASE="1.5")
        s = session(srv, target, protocol)
        [job] = s.ledger.store.jobs()
        assert job["host"] == "elsewhere"
        # its lease still runs: it may live, and is never taken for lost
        assert s.ledger.store.jobs(lost=True)[0]["status"] == "recording"
        time.sleep(1.6)
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        assert srv.batches.created == 1  # never resubmitted
        if protocol == "openai":
            assert result.resolved and len(result.values) == 6
        else:
            [job] = result.jobs
            assert result.status == "pending" and job["status"] == "uncertain"
            assert "runner stopped" in job["why"]
        s.close()


def test_an_anthropic_batch_refused_at_create_cancels_its_receipts_as_never_sent(ledger_at):
    """Anthropic validates a message batch when it is created: a 4xx there means no job exists,
    so nothing is uncertain or billed and the next run submits again."""
    target = ledger_at()
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        srv.batches.faults = [BatchFaults(whole="fail_validation")]
        s = session(srv, target, "anthropic")
        refused = s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                              on_exhausted="return")
        assert refused.status == "unresolved" and not refused.jobs
        assert any("was not submitted: the provider refused the job" in note
                   for note in refused.notes)
        [job] = s.ledger.store.jobs(every=True)
        assert job["status"] == "cancelled" and job["provider_job_id"] is None
        receipts = ledger_rows(target, "SELECT status, sent_at, errors FROM attempts")
        assert len(receipts) == 3 and all(
            status == "cancelled" and sent is None and "nothing was sent" in errors
            for status, sent, errors in receipts)
        assert s.ledger.spend("labels")["calls"] == 0  # never sent: no call in the account
        again = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
        assert again.resolved and len(again.values) == 3
        s.close()
