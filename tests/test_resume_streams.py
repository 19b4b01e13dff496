"""Running a finished batch again from a list or a generator: its tasks are read and checked
(their content decides the revision), but no request is built and no key read when every
request of that revision is accepted; anything short of that takes the full path."""

from __future__ import annotations

import pytest

from batchjson import CallableProvider, Session
from batchjson._session import run as run_module
from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

pytestmark = pytest.mark.parametrize("ledger_at", ["sqlite", "postgres"], indirect=True)


def counting(calls: list):
    return CallableProvider(lambda call: calls.append(call) or items_reply(call))


def no_requests_built(monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("requests were built")

    monkeypatch.setattr(run_module, "find_requests", built)


def test_a_finished_generator_run_resumes_without_building_a_request(ledger_at, monkeypatch):
    tasks = review_tasks(40)
    calls: list = []
    first = Session(counting(calls), ledger=ledger_at()).run_batch(
        "b", (dict(t) for t in tasks), LABEL_SCHEMA, pack=4)
    no_requests_built(monkeypatch)
    again = Session(counting(calls), ledger=ledger_at()).run_batch(
        "b", (dict(t) for t in tasks), LABEL_SCHEMA, pack=4)
    listed = Session(counting(calls), ledger=ledger_at()).run_batch(
        "b", tasks, LABEL_SCHEMA, pack=4)
    assert len(calls) == 10 and (again.calls, again.status, again.resumed) == (0, "resolved", 10)
    assert again.revision == listed.revision == first.revision and again.total_tasks == 40
    assert dict(again.values) == dict(listed.values) == {t["task_id"]: answer(t) for t in tasks}
    assert again.compared_if_echoed == first.compared_if_echoed == ("candidate_id", "case_id")
    assert list(again.errors) == [] and again.unresolved == []


def test_a_changed_task_or_work_still_owed_takes_the_full_path(ledger_at, monkeypatch):
    tasks = review_tasks(12)
    calls: list = []
    refusing = CallableProvider(lambda call: "not json")
    owed = Session(refusing, ledger=ledger_at(), repairs=0, replays=0).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=4, on_exhausted="return")
    assert owed.status == "unresolved"
    done = Session(counting(calls), ledger=ledger_at()).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=4)
    assert done.calls == 3 and done.status == "resolved"  # the owed requests were asked
    changed = [dict(t) for t in tasks]
    changed[-1]["case_id"] = "gold-pair-079"
    redone = Session(counting(calls), ledger=ledger_at()).run_batch(
        "b", iter(changed), LABEL_SCHEMA, pack=4)
    assert redone.revision == done.revision + 1 and redone.calls == 1
    no_requests_built(monkeypatch)
    with pytest.raises(AssertionError, match="requests were built"):  # other rules
        Session(counting(calls), ledger=ledger_at()).run_batch(
            "b", iter(changed), LABEL_SCHEMA, pack=3)


def test_a_validator_no_fingerprint_fully_sees_is_rejudged_on_every_resume(ledger_at):
    tasks = review_tasks(8)
    allowed = {"match", "no_match"}

    def check(item, task):
        if item["verdict"] not in allowed:
            raise ValueError("unknown verdict")

    calls: list = []
    first = Session(counting(calls), ledger=ledger_at()).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=4, validator=check)
    assert first.status == "resolved"
    allowed.discard("no_match")  # what the validator reads changed: stored answers re-judged
    again = Session(counting(calls), ledger=ledger_at(), repairs=0, replays=0).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=4, validator=check, on_exhausted="return")
    assert again.status == "unresolved" and again.calls == 2
