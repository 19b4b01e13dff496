"""An interrupt or a failed write never leaves a receipt in flight."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading

import pytest

from batchjson import CallableProvider, Reply, Session
from batchjson._errors import LedgerError
from batchjson._ledger.store_calls import CallStore
from tests.helpers import LABEL_SCHEMA, ctrl_c_in_a_live_loop, items_reply, review_tasks


def test_a_write_failure_in_a_notebook_loop_leaves_no_receipt_in_flight(monkeypatch):
    begin = CallStore.begin_call_later

    def begin_call(store, tx, batch_id, revision_id, request, *args, **kwargs):
        if request.position == 1:
            raise sqlite3.OperationalError("disk I/O error")
        return begin(store, tx, batch_id, revision_id, request, *args, **kwargs)

    monkeypatch.setattr(CallStore, "begin_call_later", begin_call)

    async def model(call):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # a provider that tidies up its connection when cancelled
            raise
        return items_reply(call)

    session = Session(CallableProvider(model), concurrency=2)

    async def cell():  # a running loop, as in Jupyter: the run happens on a worker thread
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)

    with pytest.raises(LedgerError, match="disk I/O error") as raised:
        asyncio.run(cell())
    assert ":memory:" in str(raised.value)  # names the ledger
    assert [a.status for a in session.ledger.attempts("r")] == ["cancelled"]


def test_an_answer_interrupted_while_being_judged_is_kept_and_judged_on_resume_not_bought_again():
    """Ctrl-C lands while an async validator is still judging a paid answer: the receipt keeps
    the answer's text and usage, and the re-run judges that text before asking the model."""
    import _thread

    sent = []

    def model(call):
        sent.append(call)
        return Reply(items_reply(call), input_tokens=40, output_tokens=12)

    interrupted = []  # state the validator itself writes: not part of its fingerprint

    async def slow_check(item, task):
        if not interrupted:
            interrupted.append(True)
            _thread.interrupt_main()  # the user presses Ctrl-C while the answer is judged
            await asyncio.sleep(30)

    session = Session(CallableProvider(model), repairs=0, replays=0)

    async def cell():
        return session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=slow_check)

    ctrl_c_in_a_live_loop(cell)
    (kept,) = session.ledger.attempts("r")
    assert kept.status == "cancelled" and kept.raw == items_reply(sent[0])
    assert kept.input_tokens == 40  # the paid call's usage stays in the account
    assert len(sent) == 1

    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA, validator=slow_check)
    assert result.resolved and result.calls == 0 and len(sent) == 1  # judged, not bought again
    assert [r.kind for r in session.ledger.attempts("r")] == ["initial", "recheck"]
    assert result.revision == 1  # the same validator, the same request: judged, not re-keyed


def test_a_call_that_cannot_be_built_leaves_no_receipt_and_is_no_call(
        monkeypatch, tmp_path, ledger_at):
    """Whatever fails while the request is turned into a call fails before its receipt is
    written: nothing is left in flight as a possible paid call."""
    from batchjson._replay import plan as _plan

    def broken(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(_plan, "wire_schema", broken)
    sent = []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call),
                                       source="test-model"), ledger=ledger_at("l"))
    with pytest.raises(RecursionError):
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert sent == [] and session.ledger.attempts("r") == []
    assert session.ledger.spend("r")["calls"] == 0
    session.close()


def _hold_the_hand_off(until: threading.Event | None):
    """A trace for the caller's thread at the moment it queues the run on the session's loop
    (``call_soon_threadsafe``, called from the loop's ``run``): with ``until``, the thread is
    held on its way back until ``until`` is set (the Ctrl-C lands there); without, Ctrl-C lands
    as the hand-off begins, before anything is queued."""
    def on_return(frame, event, arg):
        if event == "return":
            sys.settrace(None)
            assert until is not None and until.wait(10), "the run never sent its calls"
        return on_return

    def on_call(frame, event, arg):
        if (event == "call" and frame.f_code.co_name == "call_soon_threadsafe"
                and frame.f_back is not None and frame.f_back.f_code.co_name == "run"):
            if until is None:
                sys.settrace(None)
                raise KeyboardInterrupt
            return on_return
        return None

    return on_call


@pytest.mark.parametrize("moment", ["as the calls go out", "before the run is queued"])
def test_a_ctrl_c_while_the_run_is_handed_to_its_loop_leaves_no_receipt_in_flight(moment):
    """The session's loop thread may start the run and send its calls before the caller's
    thread is back from handing the run over; a Ctrl-C landing then cancels the calls and
    closes their receipts like any other. One landing before the run was queued sends none."""
    import _thread

    sent = []
    both_out = threading.Event()

    async def hang(call):
        sent.append(call)
        if len(sent) == 2:  # both calls are out: now the user presses Ctrl-C
            _thread.interrupt_main()
            both_out.set()
        await asyncio.sleep(30)

    session = Session(CallableProvider(hang))

    async def cell():
        before = sys.gettrace()
        sys.settrace(_hold_the_hand_off(both_out if moment == "as the calls go out" else None))
        try:
            return session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
        finally:
            sys.settrace(before)

    assert ctrl_c_in_a_live_loop(cell) < 10  # did not wait out the 30 s calls
    statuses = [r.status for r in session.ledger.attempts("r")]
    if moment == "as the calls go out":
        assert len(sent) == 2 and statuses == ["cancelled", "cancelled"]
    else:
        assert sent == [] and statuses == []
    assert session.ledger.checkpoint("r") == {}


def test_ctrl_c_while_a_partial_return_is_committed_keeps_it_partial_and_asks_only_the_rest(
        tmp_path, monkeypatch):
    """A return judged in part is committed before its rest is asked; an interrupt landing while
    the run waits for that commit still records it as judged (its accepted items admitted),
    and the re-run asks only for the rest. Fault: the commit dropped with its waiter, the paid
    return kept as 'cancelled ... before the return was judged'."""
    from batchjson._replay import replay

    identity = ("task_id", "case_id", "candidate_id")
    split = replay.Replayer._split

    async def interrupted(self, verdict, write):
        asyncio.current_task().cancel()  # Ctrl-C between the write queued and its commit
        return await split(self, verdict, write)

    sent = []

    def model(call):
        sent.append(len(call.tasks))
        wrong = {call.tasks[2]["task_id"]: {"verdict": "maybe"}} if len(call.tasks) == 4 else {}
        return items_reply(call, **wrong)

    path, tasks = tmp_path / "l.sqlite", review_tasks(4)

    def run():
        session = Session(CallableProvider(model, source="m"), ledger=path, repairs=1,
                          replays=0)
        try:
            return session.run_batch("review", tasks, LABEL_SCHEMA, identity=identity, pack=4,
                                     accept="items")
        finally:
            session.close()

    monkeypatch.setattr(replay.Replayer, "_split", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT status FROM attempts WHERE kind = 'initial'").fetchall() == [
            ("partial",)]
    monkeypatch.setattr(replay.Replayer, "_split", split)
    assert run().status == "resolved" and sent == [4, 1]
