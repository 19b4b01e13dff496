"""Re-judging a stored return before re-asking, under ``accept="items"``: judged as a live return
is, its valid items committed at cost 0 (a recheck) and only its rejected tasks asked again."""

from __future__ import annotations

import asyncio
from collections import Counter

from batchjson import CallableProvider, Session, SimulatedModel
from batchjson.testing import LoopbackServer
from tests.helpers import (
    LABEL_SCHEMA,
    ctrl_c_in_a_live_loop,
    items_reply,
    ledger_rows,
    openai,
    review_tasks,
)
from tests.test_accept_items import BATCH_SCHEMA

IDENTITY = ("task_id", "case_id", "candidate_id")
TASKS = review_tasks(4)
ODD = TASKS[2]["task_id"]  # the item the first answer gets wrong


class Model:
    """Its first call answers ``ODD`` "no_match", every other item and call "match"."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, call):
        self.calls.append(tuple(t["task_id"] for t in call.tasks))
        first = len(self.calls) == 1
        return items_reply(call, **{t["task_id"]: {"verdict": "no_match" if first and t[
            "task_id"] == ODD else "match"} for t in call.tasks})


def run(session: Session, validator, accept: str, **options):
    return session.run_batch("review", TASKS, LABEL_SCHEMA, identity=IDENTITY, pack=len(TASKS),
                             validator=validator, accept=accept, **options)


def rejected_first(path, model: Model, accept: str) -> None:
    """A run whose validator rejects every item: one call, nothing committed."""
    def check(item, task):
        raise ValueError("not trusted yet")

    session = Session(CallableProvider(model, source="m"), ledger=path, repairs=0, replays=0)
    result = run(session, check, accept, on_exhausted="return")
    session.close()
    assert result.values == {} and model.calls == [tuple(t["task_id"] for t in TASKS)]


def match_only(item, task):
    """The edited validator: only a wrong verdict fails."""
    if item["verdict"] != "match":
        raise ValueError("expected a match")


def edited_after_rejecting(path, model: Model, accept: str):
    """A first run's validator rejected every item; the edited one runs on the same ledger."""
    rejected_first(path, model, accept)
    session = Session(CallableProvider(model, source="m"), ledger=path, repairs=0, replays=0)
    return session, run(session, match_only, accept)


def test_after_a_validator_change_under_items_a_stored_returns_valid_items_are_kept_and_only_the_rest_asked_again(  # noqa: E501
        tmp_path):
    path, model = tmp_path / "l.sqlite", Model()
    session, result = edited_after_rejecting(path, model, "items")
    assert result.status == "resolved" and list(result.values) == [t["task_id"] for t in TASKS]
    assert model.calls[1:] == [(ODD,)]  # the three valid items are not bought again
    assert result.calls == 1 and result.rechecked == 1 and result.resumed == 0
    assert {v["verdict"] for v in result.values.values()} == {"match"}
    receipts = session.ledger.attempts("review")
    now = [(r.kind, r.status, len(r.task_ids)) for r in receipts if r.revision == result.revision]
    assert now == [("recheck", "partial", 4), ("recheck", "accepted", 3),
                   ("initial", "accepted", 1)]
    assert session.ledger.spend("review")["calls"] == 2  # a recheck is no call
    session.close()
    assert ledger_rows(path, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (4, 4)]
    again = Session(CallableProvider(model, source="m"), ledger=path, repairs=0, replays=0)
    assert run(again, match_only, "items").calls == 0 and len(model.calls) == 2  # found done


def test_after_a_validator_change_under_whole_acceptance_the_pack_is_asked_again_whole(
        tmp_path):
    session, result = edited_after_rejecting(tmp_path / "l.sqlite", model := Model(), "whole")
    assert result.status == "resolved" and result.rechecked == 0
    assert model.calls[1:] == [tuple(t["task_id"] for t in TASKS)]


def test_an_answer_interrupted_under_items_commits_its_valid_items_on_resume_and_asks_only_the_rest():  # noqa: E501
    """Ctrl-C lands while the validator judges a paid answer: the re-run judges the kept text
    item by item, as the live return would have been."""
    import _thread

    model, interrupted = Model(), []

    async def check(item, task):
        if not interrupted:
            interrupted.append(True)
            _thread.interrupt_main()  # the user presses Ctrl-C while the answer is judged
            await asyncio.sleep(30)
        if item["verdict"] != "match":
            raise ValueError("expected a match")

    session = Session(CallableProvider(model, source="m"), repairs=0, replays=0)

    async def cell():
        return run(session, check, "items")

    ctrl_c_in_a_live_loop(cell)
    (kept,) = session.ledger.attempts("review")
    assert kept.status == "cancelled" and kept.raw is not None
    result = run(session, check, "items")
    assert result.status == "resolved" and result.revision == 1
    assert model.calls[1:] == [(ODD,)]
    assert result.calls == 1
    assert [(r.kind, r.status) for r in session.ledger.attempts("review")] == [
        ("initial", "cancelled"), ("recheck", "partial"), ("recheck", "accepted"),
        ("initial", "accepted")]


def test_a_batch_job_after_a_validator_change_under_items_asks_only_the_rejected_task(ledger_at):
    """The batch transport takes the same re-judged parts: its job holds the rest alone."""
    answered: Counter[str] = Counter()

    def answer(task):
        answered[task["task_id"]] += 1
        return {"label": "no" if task["task_id"] == "t2" and answered["t2"] == 1 else "ok"}

    def check(item, task):
        raise ValueError("not trusted yet")

    labels = [{"task_id": f"t{i}", "prompt": f"Label review {i}."} for i in range(4)]
    target = ledger_at()
    with LoopbackServer(SimulatedModel(answer=answer)) as srv:
        srv.batches.delay = 0.05

        def run_job(validator):
            session = Session(openai(srv), ledger=target, repairs=0, replays=0)
            session.job_poll = 0.05
            try:
                return session.run_batch("labels", labels, BATCH_SCHEMA, validator=validator,
                                         pack=4, transport="batch", wait=True, accept="items",
                                         on_exhausted="return")
            finally:
                session.close()

        assert run_job(check).values == {} and sum(answered.values()) == 4

        def check(item, task):  # noqa: F811 - the edited validator: only "no" fails
            if item["label"] != "ok":
                raise ValueError("expected ok")

        result = run_job(check)
        assert srv.batches.created == 2
    assert result.status == "resolved" and list(result.values) == [t["task_id"] for t in labels]
    assert sum(answered.values()) == 5 and answered["t2"] == 2  # only t2 asked again
    assert ledger_rows(target, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (4, 4)]
