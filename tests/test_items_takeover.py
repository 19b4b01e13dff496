"""A late return after its runner's claim was taken over, under item-level acceptance: the first
of the two returns to be admitted, whole or in part, is the only one; the other is kept as paid,
admitting nothing, and no part of the pack is asked again. Both stores: a SQLite file and a
PostgreSQL database.

Runner A's loop is held inside a blocking model call past its claim's lease (a laptop lid
closed mid-run), so runner B takes the pack over; then the two returns arrive in either order."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from batchjson import CallableProvider, Ledger, Session
from tests.helpers import LABEL_SCHEMA, items_reply, ledger_rows, review_tasks

IDENTITY = ("task_id", "case_id", "candidate_id")
SOURCE = "test-model"  # one model answering for both runners: the same request keys
WAIT = 30.0


def _statuses(path) -> dict[str, int]:
    return dict(ledger_rows(path, "SELECT status, COUNT(*) FROM attempts GROUP BY status"))


def _wait_for(path, status: str) -> None:
    """Block until the ledger holds a receipt of ``status`` (read through its own connection)."""
    deadline = time.monotonic() + WAIT
    while _statuses(path).get(status, 0) == 0:
        assert time.monotonic() < deadline, f"no {status} receipt within {WAIT}s"
        time.sleep(0.05)


def _runners(path, model_a, model_b, tasks):
    """Run A, then B once A's call is in its model; both results, and the calls each sent."""
    a_sending = threading.Event()
    sessions = {"a": Session(CallableProvider(model_a(a_sending), source=SOURCE),
                             ledger=Ledger(path, lease=0.5), repairs=1, replays=0,
                             concurrency=1),
                "b": Session(CallableProvider(model_b, source=SOURCE), ledger=path, repairs=1,
                             replays=0, concurrency=1)}
    results: dict[str, object] = {}

    def run(name: str) -> None:
        results[name] = sessions[name].run_batch("review", tasks, LABEL_SCHEMA,
                                                 identity=IDENTITY, pack=4, accept="items",
                                                 on_exhausted="return")

    threads = {name: threading.Thread(target=run, args=(name,)) for name in sessions}
    threads["a"].start()
    assert a_sending.wait(WAIT)
    threads["b"].start()
    for thread in threads.values():
        thread.join(2 * WAIT)
    for session in sessions.values():
        session.close()
    return results


def _committed_once(path, tasks) -> None:
    rows = ledger_rows(path, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint")
    assert rows == [(len(tasks), len(tasks))]  # each item committed once


def test_a_late_partial_return_after_a_takeover_admits_nothing_and_asks_nothing_again(
        ledger_at):
    """B took the pack over and admitted it whole; A's return, judged in part, arrives after.
    Faults: A's accepted items committed a second time beside B's (under the part's key), or
    A asking again for the items its return got wrong."""
    path, tasks = ledger_at(), review_tasks(4)
    sent: dict[str, list[int]] = {"a": [], "b": []}

    def model_a(sending: threading.Event):
        def answer(call):  # blocking: A's loop renews nothing while it waits
            sent["a"].append(len(call.tasks))
            sending.set()
            _wait_for(path, "accepted")  # B's whole return admitted first
            return items_reply(call, **{call.tasks[1]["task_id"]: {"verdict": "maybe"}})
        return answer

    async def model_b(call):
        sent["b"].append(len(call.tasks))
        return items_reply(call)

    results = _runners(path, model_a, model_b, tasks)
    assert sent == {"a": [4], "b": [4]}  # no part asked again
    _committed_once(path, tasks)
    assert _statuses(path) == {"accepted": 1, "rejected": 1}  # A's kept as paid
    assert [results[n].status for n in "ab"] == ["resolved", "resolved"]


def test_a_late_whole_return_after_the_pack_was_accepted_in_part_admits_nothing(ledger_at):
    """A's return, judged in part, is admitted while B's call for the pack it took over is in
    flight; B's whole return arrives after. Fault: B's items committed again under the pack's
    key beside the parts' (two values for one task)."""
    path, tasks = ledger_at(), review_tasks(4)
    b_sending = threading.Event()

    def model_a(sending: threading.Event):
        def answer(call):
            sending.set()
            if len(call.tasks) == 4:
                assert b_sending.wait(WAIT)  # B has taken the pack over and sent it
                return items_reply(call, **{call.tasks[1]["task_id"]: {"verdict": "maybe"}})
            return items_reply(call)  # the rest, asked again alone
        return answer

    async def model_b(call):
        b_sending.set()
        await asyncio.to_thread(_wait_for, path, "partial")  # A's part admitted first
        return items_reply(call)

    results = _runners(path, model_a, model_b, tasks)
    _committed_once(path, tasks)
    statuses = _statuses(path)
    assert statuses["partial"] == 1 and statuses["rejected"] == 1  # B's kept as paid
    assert results["a"].status == "resolved"
    # B ends as soon as its return is refused: A may still be asking for the rest
    assert results["b"].status in ("resolved", "unresolved")
    assert set(results["b"].values) <= {t["task_id"] for t in tasks}


def test_importing_a_whole_return_of_a_pack_accepted_in_part_here_reports_a_duplicate(tmp_path):
    """Another ledger's export holds the pack accepted whole; here it was accepted in part
    (its rejected item still owed). The import admits nothing, as a late return would, and
    says so. Fault: the report counting it admitted though the ledger refused its items."""
    from batchjson import Ledger

    tasks = review_tasks(4)

    def model(bad: bool):
        def answer(call):
            wrong = {call.tasks[2]["task_id"]: {"verdict": "maybe"}} if bad else {}
            return items_reply(call, **wrong)
        return answer

    for name, bad, accept in (("here", True, "items"), ("there", False, "whole")):
        session = Session(CallableProvider(model(bad), source=SOURCE),
                          ledger=tmp_path / f"{name}.sqlite", repairs=0, replays=0)
        session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=4,
                          accept=accept, on_exhausted="return")
        session.close()
    export = tmp_path / "there.jsonl"
    there, here = Ledger(tmp_path / "there.sqlite"), Ledger(tmp_path / "here.sqlite")
    export.write_text("".join(f"{json.dumps(r)}\n" for r in there.export_receipts()))
    report = here.import_receipts(export)
    there.close()
    here.close()
    assert (report["admitted"], report["duplicate"], report["items_admitted"]) == (0, 1, 0)
    _committed_once(tmp_path / "here.sqlite", tasks[:2] + tasks[3:])  # the part, once


@pytest.mark.parametrize("b_returns", ["whole", "in part"])
def test_two_returns_of_a_taken_over_pack_written_at_once_on_postgresql_admit_it_once(
        postgres, monkeypatch, b_returns):
    """PostgreSQL runs calls' writes side by side: B's return of the pack it took over is
    written, and held uncommitted, while A's return, judged in part, is written too. Fault:
    each write reads the other as not yet admitted, so both commit the pack's items (under
    the pack's key and a part's, or two parts') and a part is asked for again, paid twice."""
    from batchjson._ledger import postgres as postgres_store
    from batchjson._ledger.postgres import PostgresStore

    path, tasks = postgres.database(f"race_{b_returns.replace(' ', '_')}"), review_tasks(4)
    b_written, a_writing = threading.Event(), threading.Event()
    b_loop: list[int] = []  # the thread B's writes run on
    sent: dict[str, list[int]] = {"a": [], "b": []}

    def raced(admit, sending=lambda writer: True):
        """B's admitting write sent and held open (uncommitted) while A's is written."""
        def write(self, *args, **kwargs):
            if threading.get_ident() not in b_loop:
                if admit is partial_write:  # A's return, judged in part, is written
                    a_writing.set()
                return admit(self, *args, **kwargs)
            sends = sending(self)
            out = admit(self, *args, **kwargs)
            if sends and not b_written.is_set():
                with args[0].pipeline() as pipeline:  # run by the server now, its lock held
                    pipeline.sync()
                b_written.set()
                assert a_writing.wait(WAIT)
                time.sleep(0.5)  # A's write reaches the server and reads what is admitted
            return out
        return write

    # an accepted return is sent with those next to it (``_Accepts``), a partial one at once
    partial_write, accepts_sent = PostgresStore._complete_partial, postgres_store._Accepts.send
    monkeypatch.setattr(PostgresStore, "_complete_partial", raced(partial_write))
    monkeypatch.setattr(postgres_store._Accepts, "send",
                        raced(accepts_sent, lambda accepts: bool(accepts._returns)))

    def model_a(sending: threading.Event):
        def answer(call):
            sent["a"].append(len(call.tasks))
            sending.set()
            if len(call.tasks) == 4:
                assert b_written.wait(WAIT)  # B took the pack over; its return is being written
                return items_reply(call, **{call.tasks[1]["task_id"]: {"verdict": "maybe"}})
            return items_reply(call)
        return answer

    async def model_b(call):
        b_loop[:] = [threading.get_ident()]
        sent["b"].append(len(call.tasks))
        if len(call.tasks) == 4 and b_returns == "in part":
            return items_reply(call, **{call.tasks[2]["task_id"]: {"verdict": "maybe"}})
        return items_reply(call)

    results = _runners(path, model_a, model_b, tasks)
    _committed_once(path, tasks)
    refused = ledger_rows(path, "SELECT errors FROM attempts WHERE status = 'rejected'")
    assert len(refused) == 1 and "admitted first" in refused[0][0]  # A's, kept as paid
    assert sent["a"] == [4]  # A asks nothing more for the pack
    assert sent["b"] == ([4, 1] if b_returns == "in part" else [4])  # B's rest, asked once
    assert results["b"].status == "resolved"
