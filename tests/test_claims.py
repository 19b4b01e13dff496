"""One payer per request: runners of the same content (threads, Sessions, processes) on one
ledger never send a claimed request, take each other's accepted results from the ledger, and
take over at once the claims of a runner that is gone. Every test runs on both stores: a SQLite
file and a PostgreSQL database."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from batchjson import CallableProvider, Ledger, Session
from batchjson._content.tasks import stored_request
from batchjson._ledger.store_base import LEASE_SECONDS
from batchjson._session.rejudge import commit_rechecks
from tests.helpers import (
    LABEL_SCHEMA,
    ConcurrentModel,
    items_reply,
    kill_runner_mid_call,
    ledger_rows,
    ledger_write,
    review_tasks,
)

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

SOURCE = "test-model"  # one model answering across the runners of a test
_LOCKS = iter(range(1_000_000))  # a database name of its own for each PostgreSQL-only test


def checkpoint_problems(path) -> list[str]:
    """Accepted receipts without their checkpoint rows (and, in a file, a damaged file)."""
    missing = ledger_rows(
        path, "SELECT a.id FROM attempts a WHERE a.status = 'accepted' AND NOT EXISTS "
        "(SELECT 1 FROM checkpoint c WHERE c.attempt_id = a.id)")
    if isinstance(path, Path):
        assert ledger_rows(path, "PRAGMA integrity_check") == [("ok",)]
    return [f"accepted attempt {r[0]} has no checkpoint rows" for r in missing]


def accepted_per_key(path) -> dict[str, int]:
    return dict(ledger_rows(path, "SELECT request_key, COUNT(*) FROM attempts WHERE status = "
                            "'accepted' GROUP BY request_key"))


def run_together(*runs):
    """Start every run at once (a barrier), each in its own thread; return their results."""
    barrier = threading.Barrier(len(runs))
    results: list = [None] * len(runs)

    def go(i, run):
        barrier.wait()
        results[i] = run()

    threads = [threading.Thread(target=go, args=(i, run)) for i, run in enumerate(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_two_threads_on_one_session_pay_each_request_once(ledger_at):
    path = ledger_at()
    model = ConcurrentModel(delay=0.005)
    session = Session(CallableProvider(model), ledger=path, concurrency=8)
    tasks = review_tasks(60)
    one, two = run_together(*[lambda: session.run_batch("r", tasks, LABEL_SCHEMA)] * 2)
    assert len(model.sent) == 60 and len(set(model.sent)) == 60  # each request paid once
    assert one.status == two.status == "resolved"
    assert len(one.values) == len(two.values) == 60 and one.values == two.values
    assert one.calls + two.calls == 60
    assert set(accepted_per_key(path).values()) == {1}
    assert checkpoint_problems(path) == []
    session.close()


def test_two_sessions_on_one_ledger_pay_each_request_once(ledger_at):
    path = ledger_at()
    model = ConcurrentModel(delay=0.005)
    sessions = [Session(CallableProvider(model), ledger=path, concurrency=8) for _ in range(2)]
    tasks = review_tasks(60)
    results = run_together(*[lambda s=s: s.run_batch("r", tasks, LABEL_SCHEMA)
                             for s in sessions])
    assert len(model.sent) == 60 and len(set(model.sent)) == 60
    assert all(r.status == "resolved" and len(r.values) == 60 for r in results)
    assert checkpoint_problems(path) == [] and set(accepted_per_key(path).values()) == {1}
    for s in sessions:
        s.close()


RUNNER = textwrap.dedent("""
    import asyncio, os, sys, time
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    ledger, go, log = sys.argv[1], sys.argv[2], sys.argv[3]
    sent = []

    async def model(call):
        sent.append(call.tasks[0]["task_id"])
        await asyncio.sleep(0.005)
        return items_reply(call)

    session = Session(CallableProvider(model), ledger=ledger, concurrency=8)
    deadline = time.monotonic() + 30
    while not os.path.exists(go) and time.monotonic() < deadline:  # start together
        time.sleep(0.005)
    result = session.run_batch("r", review_tasks(80), LABEL_SCHEMA)
    with open(log, "w") as out:
        out.write("\\n".join(sent))
    print(result.status, len(result.values), flush=True)
""")


def test_two_processes_pay_each_request_once(ledger_at, tmp_path):
    path, go = ledger_at(), tmp_path / "go"
    Session(ledger=path).close()  # created once, before both start
    procs = [subprocess.Popen([sys.executable, "-c", RUNNER, str(path), str(go),
                               str(tmp_path / f"sent{i}")], env=ENV, cwd=os.getcwd(),
                              stdout=subprocess.PIPE, text=True) for i in range(2)]
    go.touch()
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert outs == ["resolved 80", "resolved 80"]  # both return the complete result
    sent = [line for i in range(2) for line in (tmp_path / f"sent{i}").read_text().split()]
    assert len(sent) == 80 and len(set(sent)) == 80  # every request paid once
    assert checkpoint_problems(path) == [] and set(accepted_per_key(path).values()) == {1}


def test_two_revisions_at_once_each_get_their_own_values():
    second_schema = {"type": "object", "properties": {"verdict": {"enum": ["second"]}},
                     "required": ["verdict"]}
    started: dict[str, asyncio.Event] = {}

    async def model(call):
        which = "second" if "second" in json.dumps(call.schema) else "first"
        for name in ("first", "second"):
            started.setdefault(name, asyncio.Event())
        started[which].set()
        await started["second" if which == "first" else "first"].wait()  # both revisions open
        if which == "second":
            return json.dumps({"items": [{"task_id": t["task_id"], "case_id": t["case_id"],
                                          "candidate_id": t["candidate_id"],
                                          "verdict": "second"} for t in call.tasks]})
        return items_reply(call)

    session = Session(CallableProvider(model), concurrency=4)
    tasks = review_tasks(4)
    first, second = run_together(lambda: session.run_batch("r", tasks, LABEL_SCHEMA),
                                 lambda: session.run_batch("r", tasks, second_schema))
    assert {v["verdict"] for v in first.values.values()} <= {"match", "no_match"}
    assert {v["verdict"] for v in second.values.values()} == {"second"}
    assert len(first.values) == len(second.values) == 4
    assert first.revision != second.revision


def _foreign_claim(path, request_key, *, lease_in: float) -> str:
    """A claim and in-flight receipt written by a runner on another host."""
    owner = "elsewhere/4242/s0/r0"
    (batch_id, revision_id), = ledger_rows(path, "SELECT id, current_revision FROM batches")
    (task_ids,), = ledger_rows(path, "SELECT task_ids FROM requests WHERE key = ?", request_key)
    attempt, = ledger_write(path, (
        "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, status, "
        "started_at, uid, owner, estimated_input_tokens, cost_floor) VALUES "
        "(?,?,?,?, 'initial', 'in_flight', 'then', 'u-foreign', ?, 100, 0.001)",
        (batch_id, revision_id, request_key, task_ids, owner)))
    ledger_write(path, ("INSERT INTO claims VALUES (?,?,?,?,?,?,?,?)",
                        (request_key, owner, "elsewhere", 4242, "s0", attempt,
                         time.time() + lease_in, "then")))
    return owner


def _prepare(path, n: int):
    """A ledger holding batch 'r' with n requests, nothing attempted yet (a budget of 0)."""
    from batchjson._session.spec import RunSpec

    session = Session(CallableProvider(items_reply, source=SOURCE), ledger=path, budget=0)
    session.run(RunSpec("r", review_tasks(n), LABEL_SCHEMA, refuse_short_budget=False,
                        on_exhausted="return"))
    session.close()
    return [r[0] for r in ledger_rows(path, "SELECT key FROM requests ORDER BY position")]


def test_an_expired_lease_on_another_host_is_taken_over_and_its_call_abandoned(ledger_at):
    path = ledger_at()
    keys = _prepare(path, 3)
    _foreign_claim(path, keys[0], lease_in=-1.0)
    model = ConcurrentModel()
    session = Session(CallableProvider(model, source=SOURCE), ledger=path)
    result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    assert result.status == "resolved" and len(model.sent) == 3
    statuses = sorted(a.status for a in session.ledger.attempts("r"))
    assert statuses == ["abandoned", "accepted", "accepted", "accepted"]
    spend = session.ledger.spend("r")
    assert spend["abandoned_calls"] == 1 and spend["cost_lower_bound_unknown"] == 0.001


def test_a_lease_that_expires_mid_run_is_taken_over_by_the_runs_own_claim(ledger_at):
    """A host gone while this run goes on (its claim written after the run began, its lease
    already past): the call's claim takes it over (on PostgreSQL, in a transaction of its
    own after the group's one-statement claim found it held), abandons its receipt and pays
    the request once. Fault: such a request looked at again and again, never sent."""
    path = ledger_at()
    keys = _prepare(path, 2)
    sent = []

    def model(call):
        if not sent:
            _foreign_claim(path, next(k for k in keys if k != call.request_key), lease_in=-1.0)
        sent.append(call.request_key)
        return items_reply(call)

    session = Session(CallableProvider(model, source=SOURCE), ledger=path, concurrency=1)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
    assert result.status == "resolved" and sorted(sent) == sorted(keys)
    statuses = sorted(a.status for a in session.ledger.attempts("r"))
    assert statuses == ["abandoned", "accepted", "accepted"]


def test_a_late_answer_of_a_host_taken_over_is_kept_paid_and_admits_nothing(ledger_at):
    """A host presumed gone (its lease expired) comes back with its answer after another
    runner's was admitted: its receipt is completed as a paid return that admits nothing,
    naming the attempt that was admitted, and the checkpoint rows are not re-pointed."""
    path = ledger_at()
    keys = _prepare(path, 3)
    _foreign_claim(path, keys[0], lease_in=-1.0)
    session = Session(CallableProvider(items_reply, source=SOURCE), ledger=path)
    result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    task = review_tasks(3)[0]["task_id"]
    (late, batch_id), = ledger_rows(path, "SELECT id, batch_id FROM attempts WHERE "
                                    "uid = 'u-foreign'")
    (admitted,), = ledger_rows(path, "SELECT id FROM attempts WHERE request_key = ? AND "
                               "status = 'accepted'", keys[0])
    held = Ledger(path)
    with held.store.transaction(calls=True) as tx:
        held.store.complete_call(tx, late, "accepted", '{"items": ["late"]}',
                                 {"input_tokens": 7, "output_tokens": 3},
                                 accepted=(batch_id, keys[0], {task: '{"verdict": "late"}'}))
    held.close()
    (status, errors, raw, tokens), = ledger_rows(
        path, "SELECT status, errors, raw, output_tokens FROM attempts WHERE id = ?", late)
    assert (status, raw, tokens) == ("rejected", '{"items": ["late"]}', 3)
    assert [(e["type"], e["message"].split(" of ")[0]) for e in json.loads(errors)] == [
        ("already_accepted", f"attempt {admitted}")]
    assert ledger_rows(path, "SELECT attempt_id FROM checkpoint WHERE request_key = ?",
                       keys[0]) == [(admitted,)]
    assert session.run_batch("r", review_tasks(3), LABEL_SCHEMA).values == result.values


def test_a_live_lease_on_another_host_is_waited_for_and_never_sent(ledger_at):
    path = ledger_at()
    keys = _prepare(path, 3)
    _foreign_claim(path, keys[0], lease_in=600.0)
    held = review_tasks(3)[0]["task_id"]
    model = ConcurrentModel()
    session = Session(CallableProvider(model, source=SOURCE), ledger=path)

    def finish_elsewhere():
        """The other host's runner: once ours has sent everything else, it lands its answer."""
        deadline = time.monotonic() + 30
        while len(model.sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        (attempt, batch_id), = ledger_rows(path, "SELECT id, batch_id FROM attempts WHERE "
                                           "uid = 'u-foreign'")
        ledger_write(
            path, ("UPDATE attempts SET status = 'accepted', sent_at = 'then' WHERE id = ?",
                   (attempt,)),
            ("INSERT INTO checkpoint VALUES (?,?,?,?,?, 'then')",
             (batch_id, keys[0], held, attempt, json.dumps({"verdict": "match"}))),
            ("DELETE FROM claims WHERE request_key = ?", (keys[0],)))

    helper = threading.Thread(target=finish_elsewhere)
    helper.start()
    result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA)
    helper.join(30)
    assert result.status == "resolved" and len(result.values) == 3
    assert held not in [t for call in model.sent for t in call]  # never sent by us
    assert len(model.sent) == 2
    assert any("another runner" in note for note in result.notes)
    # each look at the held claim left no receipt behind
    assert ledger_rows(path, "SELECT uid FROM attempts WHERE request_key = ?",
                       keys[0]) == [("u-foreign",)]


KILLED = textwrap.dedent("""
    import asyncio, sys
    from batchjson import CallableProvider, Ledger, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    async def model(call):
        print("sent", flush=True)
        await asyncio.sleep(600)

    session = Session(CallableProvider(model, price={"input": 2.0, "output": 8.0}),
                      ledger=Ledger(sys.argv[1], lease=3600), concurrency=4)  # only "its
    # process is gone" can free these claims
    session.run_batch("r", review_tasks(8), LABEL_SCHEMA)
""")


def test_a_killed_runners_claims_are_taken_over_at_once_and_its_calls_abandoned(ledger_at):
    path = ledger_at()
    kill_runner_mid_call(KILLED, path, 4)
    assert ledger_rows(path, "SELECT COUNT(*) FROM claims") == [(4,)]

    session = Session(CallableProvider(items_reply), ledger=path, concurrency=4)
    result = session.run_batch("r", review_tasks(8), LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 8
    receipts = session.ledger.attempts("r")
    abandoned = [r for r in receipts if r.status == "abandoned"]
    assert len(abandoned) == 4 and all(r.cost is None for r in abandoned)
    # taken over before our first call went out: nobody waited for a lease
    first_sent = min(r.sent_at for r in receipts if r.status == "accepted")
    assert all(r.finished_at <= first_sent for r in abandoned)
    spend = session.evidence.summary("r")
    assert spend["abandoned_calls"] == 4 and spend["calls"] == 12
    assert spend["cost_lower_bound_unknown"] > 0  # never zero, never left out
    assert checkpoint_problems(path) == []
    assert ledger_rows(path, "SELECT COUNT(*) FROM claims") == [(0,)]
    assert LEASE_SECONDS == 30.0  # the subprocess's setting stayed there


SLOW_HOST = textwrap.dedent("""
    import asyncio, sys
    from batchjson import CallableProvider, Ledger, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    async def model(call):
        print("sent", flush=True)
        await asyncio.sleep(3.0)  # three leases long
        return items_reply(call)

    session = Session(CallableProvider(model, source="test-model"),
                      ledger=Ledger(sys.argv[1], lease=1.0))
    print(session.run_batch("r", review_tasks(1), LABEL_SCHEMA).status, flush=True)
""")


def test_a_call_longer_than_the_lease_keeps_its_claim_while_it_runs(ledger_at):
    """Another host sees only the lease: renewed while the call runs, the claim is never taken
    over, and the request is paid once, by the host that holds it."""
    path = ledger_at()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_HOST, str(path)],
                            env={**ENV, "BATCHJSON_HOST": "another-machine"},
                            stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert proc.stdout.readline().strip() == "sent"
        model = ConcurrentModel()
        session = Session(CallableProvider(model, source=SOURCE),
                          ledger=Ledger(path, lease=1.0))
        result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
        assert proc.stdout.readline().strip() == "resolved"
    finally:
        proc.kill()
        proc.wait()
    assert result.status == "resolved" and model.sent == []  # waited, never sent by us
    assert ledger_rows(path, "SELECT status FROM attempts") == [("accepted",)]
    assert checkpoint_problems(path) == []


def test_one_transaction_claiming_and_admitting_a_request_twice_keeps_the_order_written(
        ledger_at):
    """A group commit's writes take effect in the order they were made, however the store
    sends them (PostgreSQL sends a transaction's claims, and accepted returns next to each
    other, as arrays): of two runners' claims of one request the first wins and the second
    is held; of two returns of it the first is admitted and the second kept as paid, naming
    the first. Fault: one statement claiming a row twice (refused by the server, failing the
    group), two returns in one statement each read as the first, or a group's numbers sent as
    one array refused for mixing whole and fractional ones."""
    from batchjson._ledger.store_calls import HELD, MINE, Owner

    path = ledger_at()
    keys, ledger, store, (batch_id, revision_id), requests = _store_and_requests(path, 2)
    owners = [Owner.start("first"), Owner.start("second")]
    try:
        claimed = _group(store, *(
            lambda tx, key=key, owner=owner: store.begin_call_later(
                tx, batch_id, revision_id, requests[key], "initial", "callable", None, SOURCE,
                owner=owner) for key in keys for owner in owners))
        assert [state for state, _ in claimed] == [MINE, HELD, MINE, HELD]
        first, other = claimed[0][1], claimed[2][1]
        task = requests[keys[0]].task_ids[0]
        late, = ledger_write(path, (
            "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, status, "
            "started_at, uid, owner) SELECT batch_id, revision_id, request_key, task_ids, "
            "kind, status, started_at, 'u-late', owner FROM attempts WHERE id = ?", (first,)))
        with store.transaction(calls=True) as tx:  # numbers as any caller may give them
            for attempt, key, verdict, usage in (
                    (first, keys[0], "first", {"input_tokens": 7, "cost": 0}),
                    (late, keys[0], "late", {"input_tokens": 7.0, "cost": 0.5}),
                    (other, keys[1], "other", {"input_tokens": 8, "cost": 1})):
                store.complete_call(tx, attempt, "accepted", "{}", usage, accepted=(
                    batch_id, key, {requests[key].task_ids[0]: json.dumps(verdict)}))
    finally:
        for owner in owners:
            owner.stop()
        ledger.close()
    rows = {r[0]: r[1:] for r in ledger_rows(path, "SELECT id, status, input_tokens, cost "
                                             "FROM attempts")}
    assert (rows[first], rows[late], rows[other]) == (
        ("accepted", 7, 0), ("rejected", 7, 0.5), ("accepted", 8, 1))
    (errors,), = ledger_rows(path, "SELECT errors FROM attempts WHERE id = ?", late)
    assert f"attempt {first} of another runner" in errors
    assert ledger_rows(path, "SELECT item FROM checkpoint WHERE task_id = ?", task) == [
        ('"first"',)]


def _store_and_requests(path, n):
    """A prepared ledger's store, its batch and revision ids, and its requests by key."""
    keys = _prepare(path, n)
    ledger = Ledger(path)
    store = ledger.store
    (revision_id, batch_id), = store._read("SELECT current_revision, id FROM batches")
    requests = {r.key: r for r in (stored_request(row) for row in store._read(
        "SELECT key, tasks, task_ids, position, parent_key FROM requests"))}
    return keys, ledger, store, (batch_id, revision_id), requests


def _group(store, *writes):
    """``writes`` in one transaction as the group commit runs them (every write made, then
    each outcome read, then those read once committed)."""
    from batchjson._ledger.store_base import Later

    with store.transaction(calls=True) as tx:
        made = [write(tx) for write in writes]
        sent = [out() if isinstance(out, Later) else out for out in made]
    return [out() if isinstance(out, Later) else out for out in sent]


def test_a_claim_and_a_later_write_on_its_request_in_one_transaction_keep_their_order(
        ledger_at):
    """A store may send a transaction's claims together, but a write made after a claim
    still reads it: the owner's release of the request leaves no claim, and a
    claim made before a return of the same request is decided before that return admits it.
    Fault: claims sent at COMMIT, after every other write of the transaction."""
    from batchjson._ledger.store_calls import ACCEPTED, MINE, Owner

    path = ledger_at()
    keys, ledger, store, (batch_id, revision_id), requests = _store_and_requests(path, 3)
    owner = Owner.start("a")

    def claim(key):
        return lambda tx: store.begin_call_later(tx, batch_id, revision_id, requests[key],
                                                 "initial", "callable", None, SOURCE,
                                                 owner=owner)

    def accept(attempt, key):
        return lambda tx: store.complete_call(tx, attempt, "accepted", "{}", {}, accepted=(
            batch_id, key, {requests[key].task_ids[0]: json.dumps("x")}))

    try:
        (state, released), _ = _group(store, claim(keys[0]),
                                      lambda tx: store.claims(tx, owner, "release", keys[0]))
        assert state == MINE
        assert ledger_rows(path, "SELECT request_key FROM claims") == []
        (state, earlier), = _group(store, claim(keys[1]))
        (state, _), _ = _group(store, claim(keys[1]), accept(earlier, keys[1]))
        assert state == MINE  # its own claim, renewed before the return was admitted
        _, (state, _) = _group(store, accept(released, keys[0]), claim(keys[0]))
        assert state == ACCEPTED  # the return made first is read by the claim after it
        (state, first), = _group(store, claim(keys[2]))
        late, = ledger_write(path, (
            "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, status, "
            "started_at, uid, owner) SELECT batch_id, revision_id, request_key, task_ids, "
            "kind, status, started_at, 'u-late', owner FROM attempts WHERE id = ?", (first,)))
        _, (state, _), _ = _group(store, accept(first, keys[2]), claim(keys[2]),
                                  accept(late, keys[2]))
        assert state == ACCEPTED  # between two returns of its request: after the first
    finally:
        owner.stop()
        ledger.close()


def test_a_recheck_of_a_request_admitted_since_it_was_planned_admits_nothing(ledger_at):
    """An earlier answer rechecked at a run's start is committed after the run planned it; a
    request another runner admitted meanwhile is done, and the recheck writes nothing for it
    (on PostgreSQL it takes the request's admission lock first, as a live return does). Fault:
    a second accepted receipt for the request, without checkpoint rows of its own."""
    path = ledger_at()
    session = Session(CallableProvider(items_reply, source=SOURCE), ledger=path)
    assert session.run_batch("r", review_tasks(2), LABEL_SCHEMA).status == "resolved"
    session.close()
    ledger = Ledger(path)
    try:
        request = _recheck_again(ledger.store)
    finally:
        ledger.close()
    assert ledger_rows(path, "SELECT COUNT(*) FROM attempts WHERE request_key = ? AND status "
                       "= 'accepted'", request.key) == [(1,)]
    assert checkpoint_problems(path) == []


def _recheck_again(store, ready=None):
    """Commit a recheck of an accepted request's own answer, as if planned before it was."""
    (revision_id, batch_id), = store._read("SELECT current_revision, id FROM batches")
    origin, = store._read("SELECT * FROM attempts WHERE status = 'accepted' ORDER BY id LIMIT 1")
    request = next(r for r in (stored_request(row) for row in store._read(
        "SELECT key, tasks, task_ids, position, parent_key FROM requests"))
        if r.key == origin["request_key"])
    if ready is not None:
        ready(request.key)
    commit_rechecks(store, batch_id, revision_id, [(request, origin, {
        t: '"x"' for t in request.task_ids})], SOURCE)
    return request


def test_a_recheck_on_postgresql_waits_for_a_return_of_its_request_being_written(postgres):
    """A live return's transaction holds its request's admission lock until it commits; a
    recheck of that request waits for it, then reads what it admitted. Fault: the recheck's
    transaction reading the request as not admitted while the return is being written."""
    import psycopg

    from batchjson._ledger.postgres import ADMIT_ALL

    path = postgres.database(f"recheck_{next(_LOCKS)}")
    session = Session(CallableProvider(items_reply, source=SOURCE), ledger=path)
    session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    session.close()
    ledger, locked, done = Ledger(path), threading.Event(), threading.Event()
    with psycopg.connect(path) as writing:  # a return of the request, not yet committed
        def lock(key):
            writing.execute(ADMIT_ALL, ([key],))
            locked.set()

        thread = threading.Thread(target=lambda: (_recheck_again(ledger.store, lock),
                                                  done.set()))
        try:
            thread.start()
            assert locked.wait(10)
            assert not done.wait(0.5)  # waiting for the return's transaction
            writing.commit()
            assert done.wait(10)
        finally:
            thread.join(10)
            ledger.close()

