"""Forgetting a batch: its evidence stops owing, its account stays, the forgetting is on record,
a later run owes again, and no RLM namespace offers it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from batchjson import CallableProvider, FaultPlan, InvalidBatch, Ledger, Session, SimulatedModel
from batchjson._session.accounts import Evidence
from tests.helpers import LABEL_SCHEMA, answer, review_tasks


def broken_session(path: Path | None = None, *, strict: bool = True) -> Session:
    """Every return is cut in half: nothing resolves, everything stays owed."""
    model = SimulatedModel(answer=answer, faults=FaultPlan(malformed_json=1.0))
    return Session(model, ledger=path, strict=strict, repairs=0, replays=0)


def owe_two_revisions(session: Session) -> None:
    session.run_batch("review", review_tasks(6), LABEL_SCHEMA, pack=2, on_exhausted="return")
    session.run_batch("review", review_tasks(4), LABEL_SCHEMA, pack=2, on_exhausted="return")


def test_forgetting_stops_every_revision_owing_and_keeps_the_whole_account():
    session = broken_session()
    owe_two_revisions(session)  # strict: the first revision keeps owing beside the second
    assert session.evidence.unresolved_batches == 2
    before = session.ledger.spend("review")
    receipts = session.ledger.attempts("review")
    record = session.ledger.forget("review", via="test", by="ana@lab")
    assert record is not None
    assert (record["revisions"], record["requests"], record["items"]) == ([1, 2], 5, 6)
    assert session.evidence.minimum_exact_retry_calls == 0
    assert session.evidence.summary()["unresolved_requests"] == 0
    assert session.ledger.spend("review") == before  # calls and costs stay in the account
    assert session.ledger.attempts("review") == receipts
    (on_record,) = session.ledger.store.forgotten()
    assert on_record["by"] == "ana@lab" and on_record["via"] == "test"
    assert on_record["at"] == record["at"] and on_record["in_effect"] == 2
    assert session.evidence.summary("review")["forgotten"] == [on_record]
    session.close()


def test_a_later_run_of_the_same_batch_owes_again():
    session = broken_session()
    session.run_batch("review", review_tasks(4), LABEL_SCHEMA, pack=2, on_exhausted="return")
    session.ledger.forget("review", via="test")
    assert session.evidence.unresolved_batches == 0
    session.run_batch("review", review_tasks(4), LABEL_SCHEMA, pack=2, on_exhausted="return")
    assert session.evidence.minimum_exact_retry_calls == 2
    assert session.ledger.store.forgotten()[0]["in_effect"] == 0  # the record stays, reopened
    session.close()


def test_a_forgotten_strict_batch_frees_its_validator_to_change():
    session = broken_session()

    def check(item, task):
        return item["verdict"] in ("match", "no_match")

    first = session.validators.define(check, name="check")
    session.run_batch("review", review_tasks(2), LABEL_SCHEMA, validator=first,
                      on_exhausted="return")

    def check(item, task):  # noqa: F811 - the same name, new logic
        return item["verdict"] == "match"

    with pytest.raises(Exception, match="unresolved"):
        session.validators.define(check, name="check")
    session.ledger.forget("review", via="test")
    assert session.validators.define(check, name="check") is check
    session.close()


def test_forgetting_what_owes_nothing_records_nothing_and_an_unknown_name_is_refused():
    session = Session(CallableProvider(lambda call: _items(call)))
    session.run_batch("done", review_tasks(2), LABEL_SCHEMA)
    assert session.ledger.forget("done", via="test") is None
    assert session.ledger.store.forgotten() == []
    with pytest.raises(InvalidBatch, match="no batch named 'nope'.*batches: done"):
        session.ledger.forget("nope", via="test")
    session.close()


def _items(call) -> str:
    return json.dumps({"items": [{"task_id": t["task_id"], **answer(t)} for t in call.tasks]})


def test_rlm_namespaces_never_offer_forgetting():
    from batchjson import rlm

    session = broken_session()
    bound: dict = {}
    rlm.bind(bound, session=session)
    hooks = rlm.rlm_hooks()
    tools = {name: entry["tool"] for name, entry in hooks.custom_tools.items()}
    for names in (bound, tools):
        for key, value in names.items():
            assert "forget" not in key.lower()
            assert not [a for a in dir(value) if "forget" in a.lower()], key
    assert "forget" not in hooks.setup_code.lower()
    session.close()


def bj(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_batchjson_forget_then_status_shows_who_forgot_and_owes_nothing(tmp_path: Path):
    path = tmp_path / "l.sqlite"
    session = broken_session(path)
    owe_two_revisions(session)
    session.close()
    done = bj("forget", "review", "--ledger", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("forgot batch 'review': revision(s) 1, 2 no longer owe 5 "
                                  "request(s) (6 item(s)); recorded as forgotten by ")
    assert "stay in the account, and later work on 'review' (a run, a merge) owes again" in (
        done.stdout)
    status = bj("status", "--ledger", str(path), cwd=tmp_path)
    assert "still owed" not in status.stdout
    assert "forgotten: review revision(s) 1, 2: 5 request(s), 6 item(s) no longer owed" in (
        " ".join(status.stdout.split()))
    data = json.loads(bj("status", "--json", "--ledger", str(path), cwd=tmp_path).stdout)
    assert data["minimum_exact_retry_calls"] == 0 and data["forgotten"][0]["via"] == (
        "batchjson forget")
    assert data["total"]["calls"] == 5  # every call (3, then 2) stays in the account
    again = bj("forget", "review", "--ledger", str(path), cwd=tmp_path)
    assert again.returncode == 0 and "owes nothing, so nothing was forgotten" in again.stdout
    unknown = bj("forget", "nope", "--ledger", str(path), cwd=tmp_path)
    assert unknown.returncode == 2 and "no batch named 'nope'" in unknown.stderr


def test_status_after_forget_no_longer_suggests_rerunning_the_forgotten_batch(
        tmp_path: Path):
    path = tmp_path / "l.sqlite"
    session = broken_session(path)
    owe_two_revisions(session)
    session.close()
    before = bj("status", "--ledger", str(path), cwd=tmp_path).stdout
    assert "re-run batch 'review'" in before
    assert bj("forget", "review", "--ledger", str(path), cwd=tmp_path).returncode == 0
    status = bj("status", "--ledger", str(path), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    hints = status.stdout.split("next:")[1]
    assert "re-run" not in hints and "receipts review --failed" in hints, status.stdout
    data = json.loads(bj("status", "--json", "--ledger", str(path), cwd=tmp_path).stdout)
    assert data["owing_batches"] == []


def test_a_merged_ledger_keeps_what_its_owner_forgot(tmp_path: Path, ledger_at):
    theirs = broken_session(ledger_at("theirs"))
    owe_two_revisions(theirs)
    theirs.ledger.forget("review", via="test", by="ana@lab")
    theirs.close()
    ours = Ledger(ledger_at("ours"))
    ours.merge(ledger_at("theirs"))
    assert ours.store.unresolved() == []
    (record,) = ours.store.forgotten()
    assert (record["by"], record["revisions"], record["in_effect"]) == ("ana@lab", [1, 2], 2)
    ours.close()


def test_a_run_going_on_when_its_batch_is_forgotten_is_owed_again_for_what_it_leaves(
        tmp_path: Path):
    """Forgetting is a decision about what is owed, not a cancel: a run in another thread (or
    process) goes on, and its calls after the forgetting reopen its revision, so the run that
    ends "unresolved" is owed by the evidence; the CLI says calls are in flight."""
    path = tmp_path / "l.sqlite"
    in_flight, forgotten_now = threading.Event(), threading.Event()

    def slow_and_wrong(call) -> str:
        if not in_flight.is_set():
            in_flight.set()
            assert forgotten_now.wait(30)
        return '{"items": []}'

    slow_and_wrong.blocking = True
    session = Session(CallableProvider(slow_and_wrong, source="s"), ledger=path, repairs=1,
                      replays=0)
    results = []
    run = threading.Thread(target=lambda: results.append(session.run_batch(
        "review", review_tasks(2), LABEL_SCHEMA, pack=2, on_exhausted="return")))
    run.start()
    assert in_flight.wait(30)
    done = bj("forget", "review", "--ledger", str(path), cwd=tmp_path)
    assert "1 of its call(s) are in flight (a run going on" in " ".join(done.stdout.split())
    forgotten_now.set()
    run.join(60)
    (result,) = results
    assert result.status == "unresolved" and result.calls == 2
    assert session.evidence.minimum_exact_retry_calls == 1  # the run's leftovers are owed
    assert session.ledger.store.forgotten()[0]["in_effect"] == 0
    session.close()
    status = bj("status", "--ledger", str(path), cwd=tmp_path).stdout
    assert "owed again since later work on it reopened it" in " ".join(status.split())


def test_a_merge_of_later_work_reopens_a_forgotten_batch_but_earlier_work_does_not(
        tmp_path: Path):
    """A forgetting covers the requests owed when it was made: the same content's work from
    another ledger done before it stays forgotten here; work done after it owes again."""
    earlier, here, later = (tmp_path / f"{n}.sqlite" for n in ("earlier", "here", "later"))
    for path in (earlier, here):
        broken_session(path).run_batch("review", review_tasks(2), LABEL_SCHEMA, pack=2,
                                       on_exhausted="return")
    ledger = Ledger(here)
    assert ledger.forget("review", via="test") is not None
    ledger.merge(earlier)
    assert Evidence(ledger).minimum_exact_retry_calls == 0
    broken_session(later).run_batch("review", review_tasks(2), LABEL_SCHEMA, pack=2,
                                    on_exhausted="return")
    ledger.merge(later)
    assert Evidence(ledger).minimum_exact_retry_calls == 1
    assert ledger.store.forgotten()[0]["in_effect"] == 0
    ledger.close()
