"""The same script on many machines: four processes, each its own host (``BATCHJSON_HOST``), run
one 2,000-task batch on one PostgreSQL ledger. They divide the work, each request is paid once,
every checkpoint row is there, and every runner returns the whole result. A host killed
mid-run keeps its claims until their lease expires (another host cannot see its process); then
they are taken over, and its calls in flight stay in the account as abandoned, with a cost
lower bound."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime

from batchjson import Session
from tests.helpers import ledger_rows

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
TASKS = 2000
LEASE = 3.0  # seconds: short, so a dead host's claims come free within the test

RUNNER = textwrap.dedent("""
    import asyncio, hashlib, json, os, sys, time
    from batchjson import CallableProvider, Ledger, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    url, go, log, role, lease = sys.argv[1:6]
    sent, answered = [], 0

    async def model(call):
        global answered
        sent.append(call.tasks[0]["task_id"])
        if role == "victim" and answered >= 40:  # mid-run: every later call never returns
            print("hanging", flush=True)
            await asyncio.sleep(600)
        await asyncio.sleep(0.02)
        answered += 1
        return items_reply(call)

    provider = CallableProvider(model, source="one-model", price={"input": 2.0, "output": 8.0})
    session = Session(provider, ledger=Ledger(url, lease=float(lease)), concurrency=16)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:  # start together
        time.sleep(0.005)
    result = session.run_batch("many", review_tasks(TASKS), LABEL_SCHEMA)
    with open(log, "w") as out:
        out.write("\\n".join(sent))
    digest = hashlib.sha256(json.dumps(dict(result.values), sort_keys=True).encode()).hexdigest()
    print(result.status, len(result.values), digest, flush=True)
""").replace("TASKS", str(TASKS))


def start_hosts(url: str, tmp_path, roles: list[str]) -> list[subprocess.Popen]:
    Session(ledger=url).close()  # the schema made once, before they start
    go = tmp_path / "go"
    procs = [subprocess.Popen(
        [sys.executable, "-c", RUNNER, url, str(go), str(tmp_path / f"sent{i}"), role,
         str(LEASE)], env={**ENV, "BATCHJSON_HOST": f"host-{i}"}, cwd=os.getcwd(),
        stdout=subprocess.PIPE, text=True) for i, role in enumerate(roles)]
    for proc in procs:  # each has imported batchjson and connected: start them together
        assert proc.stdout.readline().strip() == "ready"
    go.touch()
    return procs


def expected_digest() -> str:
    from tests.helpers import answer, review_tasks

    values = {t["task_id"]: answer(t) for t in review_tasks(TASKS)}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def ledger_is_whole(url: str) -> None:
    """Each request accepted once, each accepted receipt with its checkpoint rows, every task
    with one value, no claim left behind."""
    per_key = ledger_rows(url, "SELECT request_key, COUNT(*) FROM attempts WHERE status = "
                          "'accepted' GROUP BY request_key")
    assert len(per_key) == TASKS and {n for _, n in per_key} == {1}
    assert ledger_rows(url, "SELECT COUNT(*) FROM attempts a WHERE status = 'accepted' AND NOT "
                       "EXISTS (SELECT 1 FROM checkpoint c WHERE c.attempt_id = a.id)") == [(0,)]
    assert ledger_rows(url, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint"
                       ) == [(TASKS, TASKS)]
    assert ledger_rows(url, "SELECT COUNT(*) FROM claims") == [(0,)]


def test_four_hosts_divide_one_batch_pay_each_request_once_and_all_return_it_whole(
        postgres, tmp_path):
    url = postgres.database("four_hosts")
    procs = start_hosts(url, tmp_path, ["worker"] * 4)
    outs = [p.communicate(timeout=240)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs == [["resolved", str(TASKS), expected_digest()]] * 4  # every runner: all of it
    sent = [(tmp_path / f"sent{i}").read_text().split() for i in range(4)]
    assert all(sent), "every host took part of the work"
    every = [task for host in sent for task in host]
    assert len(every) == len(set(every)) == TASKS  # each request paid once, by one host
    ledger_is_whole(url)
    # each host takes its own share of the requests first: they rarely ask for the same one, so
    # few receipts are written only to be refused their claim (and deleted). Walking the
    # requests in one order, every host asked for each in turn: about 1,500 for 2,000 requests
    # (45-75 on a quiet machine now, about 200 beside a loaded test run)
    [(refused,)] = ledger_rows(url, "SELECT MAX(id) - COUNT(*) FROM attempts")
    assert refused < TASKS // 4, refused


def test_a_host_killed_mid_run_has_its_claims_taken_over_after_the_lease_and_its_calls_counted(
        postgres, tmp_path):
    url = postgres.database("killed_host")
    procs = start_hosts(url, tmp_path, ["victim", "worker", "worker", "worker"])
    victim = procs[0]
    for _ in range(16):  # all of its workers are waiting on calls that will never return
        assert victim.stdout.readline().strip() == "hanging"
    victim.send_signal(signal.SIGKILL)
    killed_at = time.time()
    victim.wait()
    outs = [p.communicate(timeout=240)[0].split() for p in procs[1:]]
    assert outs == [["resolved", str(TASKS), expected_digest()]] * 3
    ledger_is_whole(url)

    abandoned = ledger_rows(url, "SELECT owner, cost, cost_floor, finished_at FROM attempts "
                            "WHERE status = 'abandoned'")
    assert len(abandoned) == 16 and {owner.split("/")[0] for owner, *_ in abandoned} == {
        "host-0"}
    assert all(cost is None and floor > 0 for _, cost, floor, _ in abandoned)
    # Its lease was last renewed at most a third of a lease before it died: nobody took its
    # claims before the rest of the lease had run out (another host cannot see its process).
    taken = min(datetime.fromisoformat(at).timestamp() for *_, at in abandoned)
    assert taken >= killed_at + LEASE * 2 / 3 - 0.1
    survivors = [task for i in (1, 2, 3) for task in (tmp_path / f"sent{i}").read_text().split()]
    assert len(survivors) == len(set(survivors))  # none of them paid a request twice
    spend = Session(ledger=url).evidence.summary()
    assert spend["abandoned_calls"] == 16 and spend["cost_lower_bound_unknown"] > 0
    assert spend["calls"] == len(survivors) + ledger_rows(
        url, "SELECT COUNT(*) FROM attempts WHERE owner LIKE 'host-0/%' AND status != "
        "'abandoned'")[0][0] + 16
