"""Batch jobs and the ledger's other ways in and out: a merge, an export or a forgetting never
carries away receipts a job may still answer (and bill) without the job row that collects them,
on SQLite and PostgreSQL alike."""

from __future__ import annotations

import time

import pytest

from batchjson import Ledger
from batchjson._errors import InvalidBatch, LedgerError
from batchjson.testing import LoopbackServer
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
    assert held.store.batch_names() == []  # nothing was written
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
