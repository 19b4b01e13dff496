"""Item-level acceptance among runners of one ledger: a pack whose return was accepted in part is
never sent again whole, by this runner or another; only its rejected items are asked again,
each item committed once. Every test runs on both stores: a SQLite file and a PostgreSQL
database."""

from __future__ import annotations

import asyncio
import json
import threading

from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, ledger_rows, review_tasks

IDENTITY = ("task_id", "case_id", "candidate_id")
SOURCE = "test-model"  # one model answering for both runners: the same request keys
WAIT = 30.0  # seconds a runner waits for the other before the test gives up on it


def run(session: Session, tasks, **options):
    return session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=4,
                             accept="items", **options)


async def _until(event: threading.Event) -> None:
    for _ in range(int(WAIT / 0.01)):
        if event.is_set():
            return
        await asyncio.sleep(0.01)


def test_a_second_runner_never_resends_a_pack_accepted_in_part_nor_commits_its_items_twice(
        ledger_at):
    """Runner A's first pack is in flight when runner B starts: B finds it held and does the
    other pack meanwhile. A's return is accepted but for one item, which A asks again alone.
    B, seeing the pack free again, must take its accepted items from the ledger and never pay
    for the pack whole."""
    path, tasks = ledger_at(), review_tasks(8)
    first_pack = tuple(t["task_id"] for t in tasks[:4])
    a_sending, b_sending = threading.Event(), threading.Event()
    sent: dict[str, list[tuple[str, ...]]] = {"a": [], "b": []}

    async def model_a(call):
        ids = tuple(t["task_id"] for t in call.tasks)
        sent["a"].append(ids)
        if ids == first_pack and sent["a"].count(ids) == 1:
            a_sending.set()
            await _until(b_sending)  # B has found this pack held and gone on to the other
            return items_reply(call, **{ids[2]: {"verdict": "maybe"}})  # one item invalid
        return items_reply(call)

    async def model_b(call):
        sent["b"].append(tuple(t["task_id"] for t in call.tasks))
        b_sending.set()
        return items_reply(call)

    sessions = [Session(CallableProvider(fn, source=SOURCE), ledger=path, repairs=1, replays=0,
                        concurrency=1)
                for fn in (model_a, model_b)]
    results: dict[str, object] = {}
    runners = [threading.Thread(target=lambda s=s, n=n: results.update({n: run(s, tasks)}))
               for n, s in zip("ab", sessions, strict=True)]
    runners[0].start()
    assert a_sending.wait(WAIT)
    runners[1].start()
    for runner in runners:
        runner.join(2 * WAIT)
    for session in sessions:
        session.close()

    assert first_pack not in sent["b"]  # never sent whole again by the other runner
    assert sent["a"] == [first_pack, (first_pack[2],)]  # the rejected item asked again alone
    assert sent["b"] == [tuple(t["task_id"] for t in tasks[4:])]
    assert ledger_rows(path, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (8, 8)]  # each item committed once
    statuses = dict(ledger_rows(path, "SELECT status, COUNT(*) FROM attempts GROUP BY status"))
    assert statuses == {"partial": 1, "accepted": 3}  # (its accepted part's derived receipt)
    for name in ("a", "b"):
        result = results[name]
        assert result.status == "resolved", (name, result.errors)
        assert list(result.values) == [t["task_id"] for t in tasks]


def test_a_claim_on_a_pack_accepted_in_part_is_refused_to_every_runner(ledger_at):
    """The claim itself: after a partial return, no runner may claim the pack it split."""
    from batchjson._content.tasks import stored_request
    from batchjson._ledger import Ledger
    from batchjson._ledger.store_base import Later
    from batchjson._ledger.store_calls import MINE, Owner

    path, tasks = ledger_at(), review_tasks(4)
    bad = tasks[1]["task_id"]
    session = Session(CallableProvider(lambda call: items_reply(call, **{bad: {
        "verdict": "maybe"}}), source=SOURCE), ledger=path, repairs=0, replays=0, concurrency=1)
    result = run(session, tasks, on_exhausted="return")
    assert len(result.values) == 3
    session.close()
    ((key, task_ids),) = ledger_rows(path, "SELECT request_key, task_ids FROM attempts WHERE "
                                     "status = 'partial'")
    assert len(json.loads(task_ids)) == 4

    ledger = Ledger(path)
    store = ledger.store
    (revision_id, batch_id), = store._read(
        "SELECT current_revision, id FROM batches WHERE name = 'review'")
    (request,) = [stored_request(row) for row in store._read(
        "SELECT key, tasks, task_ids, position, parent_key FROM requests WHERE "
        "revision_id = ? AND key = ?", (revision_id, key))]
    owner = Owner.start("another")
    try:
        for at_commit in (True, False):
            with store.transaction(calls=True) as tx:
                later = store.begin_call_later(tx, batch_id, revision_id, request, "initial",
                                               "callable", None, SOURCE, owner=owner,
                                               at_commit=at_commit)
                state = later()  # decided in the transaction, or read once it commits
            state = state() if isinstance(state, Later) else state
            assert state[0] != MINE, at_commit
    finally:
        owner.stop()
        ledger.close()
    assert ledger_rows(path, "SELECT COUNT(*) FROM claims") == [(0,)]
