"""Hosts on one ledger share one account's rate limits: every live session on a ledger paces
to an equal share of them, so four hosts on one API key do not send four times its limit. A
host that ended or died gives its share back: at once on this machine, after its lease on
another."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from batchjson import Ledger, Session
from batchjson._replay.pacing import HEADROOM, Pacer, RateLimits
from batchjson.testing import Limits, LoopbackServer

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
RPM = 1200  # the account's: 20 calls a second, each second applied on its own
TASKS = 300

HOST = textwrap.dedent("""
    import os, sys, time
    from batchjson import Session
    from tests.helpers import LABEL_SCHEMA, review_tasks

    url, base, go, tasks = sys.argv[1:5]
    from batchjson import OpenAIProvider
    provider = OpenAIProvider("gpt-4o-mini", base_url=base, api_key="sk-test",
                              extra_body={"max_completion_tokens": 60})
    session = Session(provider, ledger=url, concurrency=16)
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:  # start together
        time.sleep(0.005)
    result = session.run_batch("shared", review_tasks(int(tasks)), LABEL_SCHEMA)
    print(result.status, len(result.values), session.pacer.hosts, flush=True)
""")

IDLE = textwrap.dedent("""
    import sys, time
    from batchjson import Ledger, Session
    session = Session(ledger=Ledger(sys.argv[1], lease=float(sys.argv[2])))
    print("joined", flush=True)
    time.sleep(600)
""")


def test_four_hosts_on_one_postgres_ledger_send_within_the_accounts_limits(postgres, tmp_path):
    """Each host learns the account's limits from the headers and paces to a quarter of them:
    the server refuses under 1% of what the four send together, and every request is paid
    once."""
    url = postgres.database("shared_limits")
    Session(ledger=url).close()  # the schema made once, before they start
    go = tmp_path / "go"
    with LoopbackServer(rate_limits=Limits.enforced(RPM, 10_000_000, 1.0)) as srv:
        procs = [subprocess.Popen([sys.executable, "-c", HOST, url, srv.base_url, str(go),
                                   str(TASKS)], env={**ENV, "BATCHJSON_HOST": f"host-{i}"},
                                  cwd=os.getcwd(),
                                  stdout=subprocess.PIPE, text=True) for i in range(4)]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        go.touch()
        outs = [p.communicate(timeout=240)[0].split() for p in procs]
        answered, refused, arrived = srv.responses[200], srv.responses[429], srv.requests
    assert all(p.returncode == 0 for p in procs)
    assert [out[:2] for out in outs] == [["resolved", str(TASKS)]] * 4
    assert answered == TASKS  # each request paid once, whichever host sent it
    assert refused / arrived < 0.01, f"{refused} of {arrived} calls refused"


def test_hosts_on_their_own_ledgers_each_send_at_the_whole_limit_and_are_refused(tmp_path):
    """The contrast: two such hosts on two ledgers know nothing of each other, each
    paces to the whole limit, and the account refuses what they send beyond it."""
    go = tmp_path / "go"
    with LoopbackServer(rate_limits=Limits.enforced(RPM, 10_000_000, 1.0)) as srv:
        procs = [subprocess.Popen([sys.executable, "-c", HOST, str(tmp_path / f"{i}.sqlite"),
                                   srv.base_url, str(go), "60"], env=ENV, cwd=os.getcwd(),
                                  stdout=subprocess.PIPE, text=True) for i in range(2)]
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        go.touch()
        for proc in procs:
            proc.communicate(timeout=240)
        refused, arrived = srv.responses[429], srv.requests
    assert all(p.returncode == 0 for p in procs)
    assert refused / arrived > 0.05, f"only {refused} of {arrived} calls refused"


def test_each_live_session_on_a_ledger_takes_an_equal_share_and_a_closed_one_gives_it_back(
        ledger_at):
    first = Session(ledger=ledger_at(), rate_limits={"rpm": 1200, "tpm": 400_000})
    second = Session(ledger=ledger_at())
    assert second.pacer.hosts == 2
    first.hosts.join()  # what a run does on every tick
    assert first.pacer.hosts == 2
    assert "share 1/2" in first.pacer.describe()
    second.close()
    first.hosts.join()
    assert first.pacer.hosts == 1 and "share" not in first.pacer.describe()
    first.close()


def test_the_pacer_paces_to_its_share_of_set_and_learnt_limits() -> None:
    pacer = Pacer(RateLimits(requests_per_minute=1200))
    pacer.observe({"x-ratelimit-limit-tokens": "400000", "x-ratelimit-remaining-tokens": "400000"})
    pacer.share(4)
    requests, tokens = pacer._requests, pacer._tokens
    assert requests.max_rate / requests.time_period == pytest.approx(1200 * HEADROOM / 60 / 4)
    assert tokens.max_rate / tokens.time_period == pytest.approx(400_000 * HEADROOM / 60 / 4)
    assert pacer.requests_per_minute == 1200  # the account's limits, as the user set them


def idle_host(url: str, lease: float, host: str | None = None) -> subprocess.Popen:
    env = ENV if host is None else {**ENV, "BATCHJSON_HOST": host}
    proc = subprocess.Popen([sys.executable, "-c", IDLE, str(url), str(lease)], env=env,
                            cwd=os.getcwd(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "joined"
    return proc


def test_a_dead_process_on_this_machine_gives_its_share_back_at_once(ledger_at) -> None:
    session = Session(ledger=Ledger(ledger_at(), lease=600))
    proc = idle_host(ledger_at(), 600)
    session.hosts.join()
    assert session.pacer.hosts == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    session.hosts.join()
    assert session.pacer.hosts == 1  # its lease has ten minutes to go
    session.close()


def test_a_host_that_died_on_another_machine_gives_its_share_back_after_its_lease(
        ledger_at) -> None:
    session = Session(ledger=ledger_at())
    proc = idle_host(ledger_at(), 5.0, host="elsewhere")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    session.hosts.join()
    assert session.pacer.hosts == 2  # its process cannot be seen from here: its lease holds
    deadline = time.monotonic() + 30
    while session.pacer.hosts != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        session.hosts.join()
    assert session.pacer.hosts == 1
    session.close()


def test_a_turn_whose_request_another_host_took_goes_to_the_next_call() -> None:
    """A paced call not sent (its request accepted or claimed by another host meanwhile) leaves
    its turn to the next call: hosts sharing a batch spend their share on calls they send."""
    async def paced() -> None:
        pacer = Pacer(RateLimits(requests_per_minute=6))  # a turn each 10 s, a burst of one
        turn = await pacer.acquire(1, 100)
        pacer.release(answered=False)
        pacer.unspent(100, turn)  # its request was done elsewhere: nothing was sent
        await asyncio.wait_for(pacer.acquire(1, 120), 2)  # that turn, not one 10 s later
        pacer.release()
        with pytest.raises(TimeoutError):  # no turn is left over: the limits' own pace
            await asyncio.wait_for(pacer.acquire(1, 100), 1)
        assert pacer.in_flight == 0

    asyncio.run(paced())


@pytest.mark.parametrize("lapse", ["a slice after it was taken", "new limits since"])
def test_an_unspent_turn_lapses_a_slice_after_it_was_taken_and_with_new_limits(lapse) -> None:
    """A turn passed on late (its call waited after taking it), or taken from buckets new
    limits or a new share replaced, is never spent: no later burst can exceed what the limits
    allowed when it was taken."""
    async def lapsed() -> None:
        pacer = Pacer(RateLimits(requests_per_minute=6), slice_seconds=0.2)
        turn = await pacer.acquire(1, 0)
        if lapse == "new limits since":  # a second host, while the call was in flight
            pacer.share(2)  # the new buckets count the turn the old ones had given
        else:
            await asyncio.sleep(0.3)  # the call waited (a budget, a probe) before it gave up
        pacer.release(answered=False)
        pacer.unspent(0, turn)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pacer.acquire(1, 0), 1)

    asyncio.run(lapsed())


def test_during_a_pause_one_worker_chooses_a_request_for_one_unspent_turn() -> None:
    """Workers take their turn before choosing a request, one at a time: a turn left unspent
    while a 429's pause is in force lets one of them choose, not every one."""
    async def paused() -> int:
        pacer, lock, chosen = Pacer(RateLimits(requests_per_minute=6)), asyncio.Lock(), []
        turn = await pacer.acquire(1, 0)
        pacer.release(answered=False)
        pacer.penalise(0.3)
        pacer.unspent(0, turn)

        async def worker() -> None:  # as Replayer._worker: the turn, then the request
            async with lock:
                await pacer.turn(0)
            chosen.append(1)
            await pacer.acquire(1, 0)

        workers = [asyncio.ensure_future(worker()) for _ in range(5)]
        await asyncio.sleep(1.5)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return len(chosen)

    assert asyncio.run(paused()) == 1
