"""The batch transport against the loopback server's OpenAI Batch endpoints: recorded before
upload, collected by custom_id only through the same acceptance, follow-up jobs within the
run's repairs and replays, batch prices, pending results and resumption from another process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from batchjson import BatchUnresolved, Budget, Session
from batchjson._errors import ConfigError, LedgerError
from batchjson._providers.pricing import cost_of
from batchjson.testing import BatchFaults, LoopbackServer
from batchjson.testing.simulated import FaultPlan, SimulatedModel
from tests.helpers import anthropic, ledger_rows, openai

SCHEMA = {"type": "object", "properties": {"task_id": {"type": "string"},
                                           "label": {"type": "string"}},
          "required": ["task_id", "label"]}


def tasks(n: int = 6) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", "case_id": f"{i:03d}", "prompt": f"Label review {i}."}
            for i in range(n)]


PROTOCOLS = {"openai": ("gpt-4o-mini", openai), "anthropic": ("claude-haiku-4-5", anthropic)}


def session(srv: LoopbackServer, ledger: Any = None, protocol: str = "openai",
            **kw: Any) -> Session:
    provider = PROTOCOLS[protocol][1](srv, extra_body=kw.pop("extra_body", None))
    out = Session(provider, ledger=ledger, **kw)
    out.job_poll = 0.05
    return out


@pytest.fixture
def srv():
    with LoopbackServer() as server:
        server.batches.delay = 0.15
        yield server


def within(seconds: float, work: Any) -> Any:
    """``work()``'s value, or a failure (not a hung test) when it has not returned in time."""
    import threading

    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(work()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"still running after {seconds} s"
    return out[0]


def accepted_per_key(target: Any) -> dict[str, int]:
    rows = ledger_rows(target, "SELECT request_key, COUNT(*) FROM attempts WHERE status = "
                       "'accepted' GROUP BY request_key")
    return dict(rows)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_faults_and_lost_lines_resolve_through_follow_up_jobs_at_batch_prices(ledger_at,
                                                                              protocol):
    """Identity swaps and broken JSON (first answers), an errored and an expired line: all
    resolve in follow-up jobs; no accepted request is ever sent again; every receipt's cost is
    half the live price."""
    model = SimulatedModel(faults=FaultPlan(identity_swap=0.4, malformed_json=0.3,
                                            clean_after=1), seed=3)
    target = ledger_at()
    with LoopbackServer(model) as srv:
        srv.batches.delay = 0.15
        srv.batches.faults = [BatchFaults(lines={1: "errored", 2: "expired"}, shuffle=True)]
        s = session(srv, target, protocol)
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        s.close()
        assert result.status == "resolved" and len(result.values) == 6
        assert srv.batches.created >= 2  # the first job and at least one follow-up
    assert result.rejected_returns >= 1 and result.provider_errors == 2
    assert set(accepted_per_key(target).values()) == {1}
    # nothing was sent for a request after its accepted receipt
    after = ledger_rows(target, "SELECT COUNT(*) FROM attempts a WHERE EXISTS (SELECT 1 FROM "
                        "attempts b WHERE b.request_key = a.request_key AND b.status = "
                        "'accepted' AND b.id < a.id)")
    assert after == [(0,)]
    for inp, out, cost in ledger_rows(target, "SELECT input_tokens, output_tokens, cost FROM "
                                      "attempts WHERE input_tokens IS NOT NULL"):
        assert cost == pytest.approx(cost_of(PROTOCOLS[protocol][0], inp, out) / 2)
    kinds = {k for (k,) in ledger_rows(target, "SELECT DISTINCT kind FROM attempts")}
    assert {"initial", "replay"} <= kinds


def test_a_pending_result_names_its_job_and_a_rerun_collects_it_without_submitting(srv):
    s = session(srv)
    first = s.run_batch("labels", tasks(), SCHEMA, transport="batch")  # on_exhausted="raise"
    assert first.status == "pending" and not first.values
    [job] = first.jobs
    assert job["status"] == "open" and job["provider_job_id"].startswith("batch_")
    assert job["requests"] == 6
    assert all(e["type"] == "pending" for e in first.errors)
    assert any("re-run" in note for note in first.notes)
    again = s.run_batch("labels", tasks(), SCHEMA, transport="batch")  # still running
    assert again.status == "pending" and srv.batches.created == 1
    time.sleep(0.4)
    done = s.run_batch("labels", tasks(), SCHEMA, transport="batch")
    assert done.status == "resolved" and len(done.values) == 6 and not done.jobs
    assert srv.batches.created == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_out_of_order_duplicated_unknown_and_4xx_lines_are_named_and_never_admitted(srv,
                                                                                    protocol):
    srv.batches.faults = [BatchFaults(lines={0: "duplicate", 1: "unknown", 2: "http_400"},
                                      shuffle=True)]
    s = session(srv, protocol=protocol)
    result = s.run_batch("labels", tasks(4), SCHEMA, transport="batch", wait=True, repairs=0,
                         replays=0, on_exhausted="return")
    assert result.status == "unresolved"
    assert set(result.values) == {"t1", "t3"}  # out of order, joined by custom_id
    by_task = {e["task_id"]: e for e in result.errors}
    assert "came back 2 times" in by_task["t0"]["message"]
    assert "HTTP 400" in by_task["t2"]["message"]
    assert any("custom_id it was never sent" in note and "bj_000" in note
               for note in result.notes)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_copy_of_a_duplicated_line_and_an_unknown_lines_tokens_stay_in_the_account(
        srv, protocol, tmp_path):
    srv.batches.faults = [BatchFaults(lines={0: "duplicate", 1: "unknown"})]
    s = session(srv, ledger=tmp_path / "l.sqlite", protocol=protocol)
    result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True, repairs=0,
                         replays=0, on_exhausted="return")
    receipts = ledger_rows(tmp_path / "l.sqlite", "SELECT task_ids, status, input_tokens, "
                           "output_tokens, cost FROM attempts")
    rows = {json.loads(ids)[0]: (status, inp, out) for ids, status, inp, out, _ in receipts}
    # the run's totals are the receipts' (every copy billed), as the ledger's account is
    assert result.tokens == sum(inp + out for _, _, inp, out, _ in receipts)
    assert result.cost == pytest.approx(sum(cost for *_, cost in receipts))
    _, inp, out = rows["t1"]  # answered once, admitted: what one copy of its line bills
    status, dup_in, dup_out = rows["t0"]  # two copies of an answer as long
    assert status == "provider_error" and dup_in == 2 * inp and dup_out % 2 == 0 < dup_out
    assert "came back 2 times" in result.errors[0]["message"]
    assert (f"billed {dup_in} input and {dup_out} output tokens"
            in result.errors[0]["message"])
    [job] = s.ledger.store.jobs(every=True)
    usage = json.loads(job["detail"])["unknown_usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (inp, out)  # t1's extra copy
    assert any("never sent" in note and f"billed {inp} input" in note for note in result.notes)


def test_two_runners_collecting_one_job_count_its_lines_once_between_their_results(
        srv, tmp_path, monkeypatch):
    """Both runners read the ended job and judge its lines; the ledger keeps the first one's
    collection. The other's result must not claim those calls, tokens and returns as well (its
    own session spent nothing on them): results summed over hosts are the ledger's account."""
    import threading

    from batchjson._replay import jobs

    ledger = tmp_path / "l.sqlite"
    first = session(srv, ledger)
    first.run_batch("labels", tasks(4), SCHEMA, transport="batch", wait=False)
    first.close()
    both_read = threading.Barrier(2, timeout=20)
    collect = jobs.JobRunner._collect

    async def together(self, *args):  # each has read the job as ended before either records it
        both_read.wait()
        return await collect(self, *args)

    monkeypatch.setattr(jobs.JobRunner, "_collect", together)
    runners = [session(srv, ledger), session(srv, ledger)]
    results: list[Any] = [None, None]

    def run(n: int) -> None:
        results[n] = runners[n].run_batch("labels", tasks(4), SCHEMA, transport="batch",
                                          wait=True)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    account = runners[0].ledger.spend()
    assert all(r is not None and r.resolved for r in results)
    assert sorted(r.calls for r in results) == [0, account["calls"]] == [0, 4]
    assert sorted(r.accepted_returns for r in results) == [0, 4]
    assert sum(r.tokens for r in results) == account["input_tokens"] + account["output_tokens"]
    assert sum(r.cost for r in results) == pytest.approx(account["cost"])
    assert sorted(s.spent_cost for s in runners) == pytest.approx([0, account["cost"]])
    for runner in runners:
        runner.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_completed_job_whose_every_line_failed_admits_nothing(srv, protocol):
    srv.batches.faults = [BatchFaults(whole="all_failed")]
    s = session(srv, protocol=protocol)
    result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True, repairs=0,
                         replays=0, on_exhausted="return")
    assert result.status == "unresolved" and not result.values
    assert result.provider_errors == 3 and result.accepted_returns == 0
    assert all(e["type"] == "provider_error" and "HTTP 500" in e["message"]
               for e in result.errors)
    assert {j["status"] for j in s.ledger.store.jobs(every=True)} == {"ended"}


def test_a_job_failing_validation_or_token_limit_is_answered_with_smaller_jobs(srv):
    srv.batches.faults = [BatchFaults(whole="token_limit")]
    s = session(srv)
    result = s.run_batch("labels", tasks(4), SCHEMA, transport="batch", wait=True)
    assert result.resolved
    assert srv.batches.created == 3  # the failed job of 4, then two of 2
    assert any("token_limit_exceeded" in note for note in result.notes)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_cost_budget_holds_across_a_job_and_its_follow_ups(srv, protocol):
    budget = 0.0004 if protocol == "openai" else 0.004  # a few lines' worst cases, not all
    s = session(srv, protocol=protocol, budget=Budget(cost=budget),
                extra_body={"max_completion_tokens": 200} if protocol == "openai" else None)
    if protocol == "anthropic":
        s.provider.max_tokens = 200
    srv.model.faults = FaultPlan(identity_swap=1.0, clean_after=1)
    result = s.run_batch("labels", tasks(8), SCHEMA, transport="batch", wait=True,
                         on_exhausted="return")
    assert any("were not submitted" in note for note in result.notes)
    assert 0 < s.spent_cost <= budget
    assert s.tally.reserved == pytest.approx(0.0, abs=1e-12)
    first = s.ledger.store.jobs(every=True)[-1]
    assert 0 < first["requests"] < 8 and first["reserved"] <= budget  # the part that fits


def test_a_provider_without_batch_endpoints_is_refused_before_anything_is_recorded(tmp_path):
    from aiohttp import web

    app = web.Application()  # no Files or Batches endpoints: every path is a 404
    with _Plain(app) as url:
        s = Session(openai_at(url), ledger=tmp_path / "l.sqlite")
        with pytest.raises(ConfigError, match="has no Batch API"):
            s.run_batch("labels", tasks(2), SCHEMA, transport="batch")
        assert s.ledger.store.jobs(every=True) == []
        assert ledger_rows(tmp_path / "l.sqlite", "SELECT COUNT(*) FROM batches") == [(0,)]
        s.close()


def test_the_simulated_provider_has_no_batch_transport():
    s = Session("simulated")
    with pytest.raises(ConfigError, match="needs a provider with a batch API"):
        s.run_batch("labels", tasks(2), SCHEMA, transport="batch")


# -- killed processes --------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, signal, sys
    from batchjson import Session
    from batchjson._providers.anthropic import AnthropicProvider
    from batchjson._providers.openai import OpenAIProvider
    from tests.test_batch_jobs import SCHEMA, tasks
    url, target, where, protocol = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    provider = (OpenAIProvider("gpt-4o-mini", base_url=url, api_key="sk-test")
                if protocol == "openai" else
                AnthropicProvider("claude-haiku-4-5", base_url=url, api_key="sk-test"))
    from batchjson import Ledger
    s = Session(provider, ledger=Ledger(target, lease=float(os.environ.get("CHILD_LEASE", 30))))
    if where == "before-record":
        def die(*a, **k):
            os.kill(os.getpid(), signal.SIGKILL)
        s.ledger.store.job_submitted = die
    result = s.run_batch("labels", tasks(), SCHEMA, transport="batch")
    print(result.status, flush=True)
    import time; time.sleep(60)
""")


def run_child(srv: LoopbackServer, target: Any, where: str, protocol: str = "openai",
              **env_vars: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env_vars}
    url = srv.base_url if protocol == "openai" else srv.anthropic_base_url
    proc = subprocess.Popen([sys.executable, "-c", CHILD, url, str(target), where, protocol],
                            env=env, stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        if where == "after-submit":
            return proc.stdout.readline().strip()
        proc.wait(timeout=60)
        return ""
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_process_killed_after_submitting_is_resumed_by_polling_its_job(ledger_at, protocol):
    target = ledger_at()
    with LoopbackServer() as srv:
        srv.batches.delay = 1.0
        assert run_child(srv, target, "after-submit", protocol) == "pending"
        assert srv.batches.created == 1
        s = session(srv, target, protocol)
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        s.close()
        assert result.resolved and len(result.values) == 6
        assert srv.batches.created == 1  # the same job, polled: nothing submitted again
    assert ledger_rows(target, "SELECT COUNT(*) FROM attempts") == [(6,)]


def test_a_kill_between_create_and_record_leaves_an_uncertain_job_never_resubmitted(ledger_at):
    """Anthropic's batches keep no metadata: the job cannot be found again by its uid."""
    target, protocol = ledger_at(), "anthropic"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        run_child(srv, target, "before-record", protocol)
        assert srv.batches.created == 1
        s = session(srv, target, protocol)
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        assert result.status == "pending"
        [job] = result.jobs
        assert job["status"] == "uncertain" and job["provider_job_id"] is None
        assert any("uncertain" in note and "batchjson cancel" in note for note in result.notes)
        again = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        assert again.status == "pending" and srv.batches.created == 1  # never resubmitted
        s.close()


# -- helpers -----------------------------------------------------------------------------------

def openai_at(url: str) -> Any:
    from batchjson._providers.openai import OpenAIProvider

    return OpenAIProvider("gpt-4o-mini", base_url=url, api_key="sk-test")


class _Plain:
    """An aiohttp app on loopback in a thread: a server without the batch endpoints."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __enter__(self) -> str:
        import asyncio
        import threading

        from aiohttp import web

        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        async def start() -> None:
            self.runner = web.AppRunner(self.app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.port = self.runner.addresses[0][1]
            ready.set()

        def serve() -> None:
            self.loop.run_until_complete(start())
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        ready.wait(10)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: Any) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


# -- jobs, cancel, forget ----------------------------------------------------------------------

def test_jobs_lists_open_jobs_and_cancel_releases_an_uncertain_one(tmp_path):
    from batchjson._cli import main

    target = tmp_path / "l.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        run_child(srv, target, "before-record")
        out = io.StringIO()
        assert main(["jobs", "--ledger", str(target)], out) == 0
        assert "uncertain" in out.getvalue() and "batchjson cancel JOB" in out.getvalue()
        out = io.StringIO()
        assert main(["cancel", "1", "--ledger", str(target)], out) == 0
        assert "released: its 6 request(s) are owed again" in out.getvalue()
        out = io.StringIO()
        assert main(["jobs", "--ledger", str(target)], out) == 0
        assert out.getvalue().strip() == "no open batch jobs"
        s = session(srv, target)
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        assert result.resolved and srv.batches.created == 2  # resubmitted only after cancel
        s.close()
    receipts = ledger_rows(target, "SELECT status, errors FROM attempts WHERE status = "
                           "'cancelled'")
    assert len(receipts) == 6 and all("may have run and been billed" in e for _, e in receipts)


def test_cancel_stops_an_open_job_and_the_next_run_owes_what_it_did_not_answer(tmp_path):
    from batchjson._cli import main

    target = tmp_path / "l.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 1.0
        s = session(srv, target)
        assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
        out = io.StringIO()
        assert main(["jobs", "--ledger", str(target), "--json"], out) == 0
        [job] = json.loads(out.getvalue())["jobs"]
        assert job["requests"] == 3 and job["provider_job_id"].startswith("batch_")
        out = io.StringIO()
        os.environ.setdefault("OPENAI_API_KEY", "sk-test")
        assert main(["cancel", job["provider_job_id"], "--ledger", str(target)], out) == 0
        assert "cancelling at the provider" in out.getvalue()
        time.sleep(1.2)
        result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", replays=0,
                             on_exhausted="return")
        assert not result.values and result.status == "unresolved"
        assert all("batch_cancelled" in e["message"]
                   for e in result.errors)
        s.close()


def test_cancelling_an_open_job_from_a_notebook_cell_while_its_loop_runs(tmp_path):
    """Jupyter runs a cell while its own event loop runs: cancelling a job there asks the
    provider on batchjson's one background loop, where a nested asyncio.run would refuse."""
    import asyncio

    from batchjson import Ledger
    from batchjson.core import cancel_job

    target = tmp_path / "l.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 1.0
        s = session(srv, target)
        assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
        os.environ.setdefault("OPENAI_API_KEY", "sk-test")

        async def cell() -> dict[str, Any]:
            return cancel_job(Ledger(target), "1")

        assert asyncio.run(cell())["provider_status"] in ("cancelling", "cancelled")
        s.close()


def test_forget_refuses_a_batch_with_an_open_job(srv, tmp_path):
    from batchjson._cli import main

    target = tmp_path / "l.sqlite"
    s = session(srv, target)
    s.run_batch("labels", tasks(2), SCHEMA, transport="batch")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["forget", "labels", "--ledger", str(target)], io.StringIO()) == 2
    assert "unfinished batch job(s) 1" in err.getvalue()
    s.close()


def test_a_live_run_never_sends_what_an_unfinished_job_claims(srv):
    s = session(srv)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    calls = srv.requests
    live = s.run_batch("labels", tasks(4), SCHEMA)  # one more task: only it is sent live
    assert live.status == "pending" and set(live.values) == {"t3"}
    assert srv.requests == calls + 1 and live.jobs[0]["requests"] == 3
    assert {e["type"] for e in live.errors} == {"pending"}


def test_a_live_run_whose_every_request_an_unfinished_job_claims_returns_pending(srv):
    s = session(srv)
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    calls = srv.requests
    live = s.run_batch("labels", tasks(3), SCHEMA)  # nothing left to send live
    assert live.status == "pending" and srv.requests == calls
    assert {e["type"] for e in live.errors} == {"pending"} and live.jobs[0]["requests"] == 3


def test_an_expired_job_keeps_what_it_answered_and_the_rest_follows_up(srv):
    srv.batches.faults = [BatchFaults(whole="expire")]
    s = session(srv)
    result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    assert result.resolved and srv.batches.created == 2
    assert result.provider_errors == 3  # every line of the expired job, none admitted


def test_an_interrupt_while_waiting_leaves_the_job_recorded_and_running(srv):
    import _thread
    import threading

    srv.batches.delay = 1.0
    s = session(srv)
    created: list[float] = []  # when the server had the job: the interrupt is timed from it

    def interrupt_once_submitted() -> None:
        while not srv.batches.created:
            time.sleep(0.01)
        created.append(time.monotonic())
        time.sleep(0.2)  # the client records the provider's id, then waits
        _thread.interrupt_main()

    threading.Thread(target=interrupt_once_submitted, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    [job] = s.ledger.store.jobs()
    assert job["status"] == "open" and job["provider_job_id"]
    deadline = created[0] + 30
    while time.monotonic() < deadline and any(
            b["status"] != "completed" for b in srv.batches.batches.values()):
        time.sleep(0.05)  # the job ran on at the provider meanwhile
    result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch")
    assert result.resolved and srv.batches.created == 1


def test_the_ledgers_own_cost_budget_holds_across_jobs_and_is_settled_on_collection(ledger_at):
    from batchjson import Ledger

    target = ledger_at()
    held = Ledger(target)
    held.set_budget(0.0004)
    held.close()
    with LoopbackServer(SimulatedModel(faults=FaultPlan(identity_swap=1.0, clean_after=1))
                        ) as srv:
        srv.batches.delay = 0.1
        s = session(srv, target, extra_body={"max_completion_tokens": 200})
        result = s.run_batch("labels", tasks(8), SCHEMA, transport="batch", wait=True,
                             on_exhausted="return")
        budget = s.ledger.budget()
        s.close()
    assert any("past the ledger's own cost budget" in note for note in result.notes)
    assert 0 < budget["spent"] <= 0.0004 and budget["reserved"] == pytest.approx(0, abs=1e-12)
    [(spent,)] = ledger_rows(target, "SELECT SUM(cost) FROM attempts")
    assert budget["spent"] == pytest.approx(spent)


def test_two_sessions_submitting_the_same_content_send_each_request_once(srv, tmp_path):
    import threading

    target = tmp_path / "l.sqlite"
    sessions = [session(srv, target) for _ in range(2)]
    results: list[Any] = []
    threads = [threading.Thread(target=lambda s=s: results.append(s.run_batch(
        "labels", tasks(), SCHEMA, transport="batch", wait=True))) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 2 and all(r.resolved for r in results)
    assert ledger_rows(target, "SELECT COUNT(*) FROM job_lines") == [(6,)]
    assert ledger_rows(target, "SELECT COUNT(*) FROM jobs WHERE requests = 0") == [(0,)]
    assert sum(srv.batches.lines_answered.values()) == 6
    for s in sessions:
        s.close()


def test_a_job_the_provider_cannot_be_asked_about_stays_open_and_is_named(srv):
    s = session(srv)
    first = s.run_batch("labels", tasks(2), SCHEMA, transport="batch")
    srv.batches.batches.clear()  # the provider lost it: every poll answers 404
    again = s.run_batch("labels", tasks(2), SCHEMA, transport="batch")
    assert again.status == "pending" and again.jobs[0]["id"] == first.jobs[0]["id"]
    assert any("could not be read this time" in note and "404" in note for note in again.notes)


def test_a_models_own_batch_share_prices_its_lines(srv):
    """Half of live unless the price table says otherwise: a price's ``batch`` share."""
    s = Session(openai(srv, prices={"gpt-4o-mini": {"input": 0.15, "output": 0.60,
                                                    "batch": 0.4}}))
    s.job_poll = 0.05
    result = s.run_batch("labels", tasks(2), SCHEMA, transport="batch", wait=True)
    receipts = s.ledger.attempts("labels")
    live = sum(cost_of("gpt-4o-mini", r.input_tokens, r.output_tokens) for r in receipts)
    assert result.resolved and result.cost == pytest.approx(live * 0.4)
    with pytest.raises(ConfigError, match="batch must be the share"):
        openai(srv, prices={"gpt-4o-mini": {"input": 0.15, "output": 0.60, "batch": -1}})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_requests_past_one_jobs_upload_ceiling_go_in_further_jobs(srv, protocol, monkeypatch,
                                                                   tmp_path):
    """A run larger than the provider's upload ceiling (200 MB OpenAI, 256 MB Anthropic) is
    sent as several jobs that each fit, rather than one refused upload."""
    from batchjson._providers.batch_client import BatchClient

    sizes: list[int] = []
    fit = BatchClient.lines_that_fit

    def measured(self: BatchClient, calls: list[Any]) -> int:
        sizes.extend(len(json.dumps(self.line("bj_" + "0" * 48, c)[0]).encode())
                     for c in calls)
        return fit(self, calls)

    monkeypatch.setattr(BatchClient, "lines_that_fit", measured)
    for cls in BatchClient.__subclasses__():
        monkeypatch.setattr(cls, "max_bytes", 3500)  # two lines of this batch, never three
    s = session(srv, ledger=tmp_path / "l.sqlite", protocol=protocol)
    result = s.run_batch("labels", tasks(6), SCHEMA, transport="batch", wait=True)
    assert 1100 < min(sizes) and max(sizes) < 1650, sizes
    assert result.resolved and len(result.values) == 6
    assert srv.batches.created == 3
    assert set(accepted_per_key(tmp_path / "l.sqlite").values()) == {1}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_too_big_for_any_job_says_so_and_how_to_send_it(srv, protocol, monkeypatch):
    from batchjson._providers.batch_client import BatchClient

    for cls in BatchClient.__subclasses__():
        monkeypatch.setattr(cls, "max_bytes", 500)  # under one line of this batch
    s = session(srv, protocol=protocol)
    with pytest.raises(BatchUnresolved) as raised:
        s.run_batch("labels", tasks(2), SCHEMA, transport="batch", wait=True)
    said = str(raised.value)
    assert "over the provider's ceiling of 500" in said and "nothing was sent" in said
    assert "smaller pack" in said and "transport='live'" in said
    assert srv.batches.created == 0


def test_a_misspelled_batch_fault_is_refused_rather_than_injecting_nothing():
    with pytest.raises(ValueError, match="unknown batch fault.*'expird'.*lines="):
        BatchFaults(lines={0: "expird"})
    with pytest.raises(ValueError, match="unknown batch fault.*'all_fail'"):
        BatchFaults(whole="all_fail")
    assert BatchFaults(whole="expire", lines={3: "duplicate"}).lines == {3: "duplicate"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_wait_ends_when_a_jobs_output_answers_403_and_a_later_run_collects_it(srv, protocol):
    """A final 4xx while collecting ended no wait (the loop polled for ever): the wait ends
    with the error named, the job stays open, and a later run collects it once it reads."""
    s = session(srv, protocol=protocol)
    srv.batches.refuse_results = 403
    result = within(20, lambda: s.run_batch("labels", tasks(3), SCHEMA, transport="batch",
                                            wait=True))
    assert result.status == "pending" and [j["status"] for j in result.jobs] == ["open"]
    assert any("could not be read" in note and "403" in note and "wait for it ends" in note
               for note in result.notes), result.notes
    srv.batches.refuse_results = None
    again = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    assert again.resolved and len(again.values) == 3 and srv.batches.created == 1
    s.close()


def ended_output(srv: LoopbackServer, protocol: str) -> tuple[dict[str, bytes], str]:
    """The one job's output as the server keeps it (to craft it), once the job has ended."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if protocol == "anthropic" and srv.batches.messages.results:
            [batch_id] = srv.batches.messages.results
            return srv.batches.messages.results, batch_id
        done = [b for b in srv.batches.batches.values() if b["status"] == "completed"]
        if done:
            return srv.batches.contents, done[0]["output_file_id"]
        time.sleep(0.02)
    raise AssertionError("the job never ended")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_output_line_that_is_not_utf8_is_refused_and_named_never_admitted(srv, protocol,
                                                                             tmp_path):
    """A byte that is not UTF-8 inside an answer was read as U+FFFD and admitted in silence:
    the line is refused as a provider error named in the notes and its receipt, and asked
    again, as a live body that is not UTF-8 is refused."""
    import re

    target = tmp_path / "l.sqlite"
    s = session(srv, target, protocol=protocol)
    assert s.run_batch("labels", tasks(2), SCHEMA, transport="batch").status == "pending"
    files, name = ended_output(srv, protocol)
    first, rest = files[name].split(b"\n", 1)
    files[name] = re.sub(rb'(label\\?"\s*:\s*\\?")', lambda m: m[1] + b"\xff", first,
                                count=1) + b"\n" + rest
    assert b"\xff" in files[name]
    result = s.run_batch("labels", tasks(2), SCHEMA, transport="batch", wait=True)
    assert result.resolved and srv.batches.created == 2  # the refused line asked again
    assert "\ufffd" not in json.dumps(dict(result.values), ensure_ascii=False)
    assert any("1 line(s) that are not valid UTF-8" in note for note in result.notes)
    [(errors,)] = ledger_rows(target, "SELECT errors FROM attempts WHERE status = "
                              "'provider_error'")
    assert "not valid UTF-8 (byte" in errors and "refused" in errors
    s.close()


CANCEL_CHILD = textwrap.dedent("""
    import json, sys
    from batchjson import Session
    from batchjson._providers.anthropic import AnthropicProvider
    from batchjson._providers.openai import OpenAIProvider
    from tests.test_batch_jobs import SCHEMA, tasks
    url, target, protocol = sys.argv[1], sys.argv[2], sys.argv[3]
    provider = (OpenAIProvider("gpt-4o-mini", base_url=url, api_key="sk-test")
                if protocol == "openai" else
                AnthropicProvider("claude-haiku-4-5", base_url=url, api_key="sk-test"))
    s = Session(provider, ledger=target)
    s.job_poll = 0.05
    result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True,
                         on_exhausted="return")
    print(json.dumps({"status": result.status, "notes": result.notes}), flush=True)
    s.close()
""")


@pytest.mark.parametrize(("protocol", "after"), [
    ("openai", 0.3), ("openai", 1.3), ("anthropic", 0.3), ("anthropic", 0.7)])
def test_cancel_during_upload_never_pays_twice(ledger_at, protocol, after):
    """``batchjson cancel`` from another process while the runner uploads (OpenAI: during the
    file's upload, then during the batch's creation; Anthropic: during the creation, which
    carries the requests): the job is never released under its writer, a batch created after
    the cancel is cancelled at the provider and known to the ledger, the waiting run sends
    nothing again, and the next run answers each request once in all."""
    from batchjson._cli import main

    target = ledger_at()
    with LoopbackServer() as srv:
        srv.batches.delay, srv.batches.upload_delay = 0.3, 1.0
        url = srv.base_url if protocol == "openai" else srv.anthropic_base_url
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        child = subprocess.Popen([sys.executable, "-c", CANCEL_CHILD, url, str(target),
                                  protocol], env=env, stdout=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while not (isinstance(target, str) or target.exists()) or not ledger_rows(
                    target, "SELECT id FROM jobs WHERE status = 'recording'"):
                assert time.monotonic() < deadline and child.poll() is None
                time.sleep(0.02)
            time.sleep(after)
            out = io.StringIO()
            assert main(["cancel", "1", "--ledger", str(target)], out) == 0
            assert "still being created by its runner" in out.getvalue(), out.getvalue()
            ran = json.loads(child.communicate(timeout=60)[0])
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert srv.batches.created <= 1  # the waiting run sent nothing again
        assert any("cancel" in note for note in ran["notes"]), ran
        made = set(srv.batches.batches) | set(srv.batches.messages.batches)
        known = {r[0] for r in ledger_rows(target, "SELECT provider_job_id FROM jobs")}
        assert made <= known  # every batch the provider billed is on record
        s = session(srv, target, protocol)
        again = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        s.close()
        assert again.resolved and len(again.values) == 6
        owner = dict(ledger_rows(target, "SELECT custom_id, request_key FROM job_lines"))
        billed: dict[str, int] = {}
        for custom_id, times in srv.batches.lines_answered.items():
            billed[owner[custom_id]] = billed.get(owner[custom_id], 0) + times
        assert sorted(billed.values()) == [1] * 6, billed


def test_a_batch_created_after_its_job_was_released_is_known_and_cancelled_there(tmp_path):
    """The job's writer was only slow (its lease ran out, so it was taken for uncertain) and a
    person released it while the writer was creating it: the batch the provider created keeps
    its id on the job and is cancelled at the provider; the run sends nothing again."""
    from batchjson._session.batches import cancel_job

    target = tmp_path / "l.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay, srv.batches.upload_delay = 0.3, 1.0
        s = session(srv, target, "anthropic")
        ran = []
        import threading

        writer = threading.Thread(target=lambda: ran.append(s.run_batch(
            "labels", tasks(3), SCHEMA, transport="batch", wait=True, on_exhausted="return")))
        writer.start()
        deadline = time.monotonic() + 20
        while not (target.exists() and ledger_rows(
                target, "SELECT id FROM jobs WHERE status = 'recording'")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # inside the creation, which carries the requests
        from batchjson import Ledger

        held = Ledger(target)
        held.store.note_job(1, {"why": "its writer's lease ran out"}, uncertain=True)
        assert cancel_job(held, "1")["released"] == 3
        held.close()
        writer.join(30)
        [result] = ran
        [(provider_id, detail)] = ledger_rows(target, "SELECT provider_job_id, detail FROM jobs")
        assert provider_id in srv.batches.messages.batches  # known to the ledger
        assert "created_after_cancel" in detail and "cancel_sent_at" in detail
        assert srv.batches.messages.batches[provider_id]["cancel_initiated_at"]
        assert srv.batches.created == 1 and not result.values
        s.close()


def test_a_request_cut_off_live_is_not_resubmitted_as_a_job_under_the_same_ceiling(tmp_path):
    """The one next-attempt policy holds for jobs too: a return cut off at the output ceiling
    would be cut off again, so a batch run at the same ceiling submits nothing for it (the
    batch transport used to re-ask it as a replay, paying for another cut-off answer)."""
    from batchjson.testing import HttpFaults

    path = tmp_path / "cut.sqlite"
    faults = HttpFaults(script={1: "length_parses"})
    with LoopbackServer(SimulatedModel(), faults=faults) as srv:
        srv.batches.delay = 0.05
        live = session(srv, path, repairs=1, replays=1)
        first = live.run_batch("labels", tasks(2), SCHEMA, pack=2, on_exhausted="return")
        live.close()
        assert srv.requests == 1 and first.failures  # cut off: no repair, no replay
        again = session(srv, path, repairs=1, replays=1)
        rerun = again.run_batch("labels", tasks(2), SCHEMA, pack=2, transport="batch",
                                wait=True, on_exhausted="return")
        again.close()
        assert srv.batches.created == 0 and rerun.calls == 0
        assert not rerun.values and "earlier return" in rerun.failure_report()


def test_a_4xx_is_recorded_in_one_shape_whether_sent_live_or_in_a_job(tmp_path):
    """One settle step for both transports: a provider's 400 on a live call and on a job's
    line leave receipts with the same error (its status, that it is final, and the message),
    and the run reports it as the receipt says."""
    from batchjson.testing import HttpFaults

    shapes = []
    for transport in ("live", "batch"):
        faults = HttpFaults(script={1: "400"}) if transport == "live" else None
        with LoopbackServer(SimulatedModel(), faults=faults) as srv:
            srv.batches.delay = 0.05
            srv.batches.faults = [BatchFaults(lines={0: "http_400"})]
            s = session(srv, tmp_path / f"{transport}.sqlite")
            result = s.run_batch("labels", tasks(1), SCHEMA, transport=transport, wait=True,
                                 on_exhausted="return")
            (receipt,) = s.ledger.attempts("labels")
            s.close()
        (error,) = receipt.errors
        assert {k: error[k] for k in ("type", "status", "retryable")} == {
            "type": "provider_error", "status": 400, "retryable": False}
        assert error["message"].startswith("provider failed (HTTP 400): ")
        (reported,) = result.errors
        assert reported["message"] == error["message"]
        shapes.append(sorted(error))
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize(("case", "protocol"), [
    ("live 400", "openai"), ("a job's 400 line", "openai"), ("an expired job", "openai"),
    ("an expired job", "anthropic")])
def test_a_request_the_model_never_ran_costs_nothing_in_every_view_of_the_account(
        tmp_path, case, protocol):
    """A refused call, or a job's line that never ran, is not billed: its receipt says $0 (not
    unknown, with a positive floor), as the run's result and the ledger's budget already do."""
    from batchjson.testing import HttpFaults

    transport = "live" if case == "live 400" else "batch"
    faults = HttpFaults(script={1: "400"}) if transport == "live" else None
    with LoopbackServer(SimulatedModel(), faults=faults) as srv:
        srv.batches.delay = 0.05
        srv.batches.faults = [BatchFaults(whole="expire") if case == "an expired job"
                              else BatchFaults(lines={0: "http_400"})]
        s = session(srv, tmp_path / "l.sqlite", budget=Budget(cost=1.0), protocol=protocol,
                    extra_body={"max_completion_tokens": 200} if protocol == "openai" else None)
        result = s.run_batch("labels", tasks(1), SCHEMA, transport=transport, wait=True,
                             on_exhausted="return", replays=0)
        account, spent = s.ledger.spend(), s.spent_cost
        receipts = ledger_rows(tmp_path / "l.sqlite", "SELECT status, cost FROM attempts")
        s.close()
    assert receipts == [("provider_error", 0.0)]
    assert result.cost == 0.0 and result.provider_errors == 1 and spent == 0.0
    assert (account["cost"], account["unknown_cost_calls"], account["cost_lower_bound"]) == (
        0.0, 0, 0.0)


def test_a_job_line_that_failed_after_its_model_may_have_run_keeps_an_unknown_cost(tmp_path):
    """An error line (a 5xx) says nothing of whether the model ran: its receipt's cost stays
    unknown, counted at its floor, never a known $0."""
    with LoopbackServer(SimulatedModel()) as srv:
        srv.batches.delay = 0.05
        srv.batches.faults = [BatchFaults(lines={0: "errored"})]
        s = session(srv, tmp_path / "l.sqlite")
        s.run_batch("labels", tasks(1), SCHEMA, transport="batch", wait=True,
                    on_exhausted="return", replays=0)
        account = s.ledger.spend()
        s.close()
    assert ledger_rows(tmp_path / "l.sqlite", "SELECT status, cost FROM attempts") == [
        ("provider_error", None)]
    assert account["unknown_cost_calls"] == 1 and account["cost_lower_bound"] > 0


def long_label(task: dict[str, Any]) -> dict[str, Any]:
    return {"label": "long " * 100}


def each_transport(tmp_path, model=None, **options):
    """A session sending live, then one sending batch jobs, each on its own server and ledger."""
    for transport in ("live", "batch"):
        with LoopbackServer(model) as srv:
            srv.batches.delay = 0.05
            s = session(srv, tmp_path / f"{transport}.sqlite", **options)
            yield transport, srv, s
            s.close()


# Every request of a small batch sent at once, live too (no lone first call to learn limits).
BOTH_IN_FLIGHT = {"concurrency": 2, "rate_limits": (10_000, 10_000_000)}


def crashing_on(crash: str, reject: str, why: str):
    """A validator that crashes (a KeyError: a bug) on task ``crash`` and rejects ``reject``."""
    def validator(item, task):
        if task["task_id"] == crash:
            return item["no_such_field"]
        if task["task_id"] == reject:
            raise ValueError(why)
    return validator


def without_request(errors) -> list[dict[str, Any]]:
    """Errors as both transports must give them: a request's key is its own ledger's."""
    return [{k: v for k, v in e.items() if k != "request"} for e in errors]


def test_a_cut_off_answer_is_given_up_with_one_error_whether_sent_live_or_in_a_job(tmp_path):
    """One settle step owns the give-up: an answer cut off at the output ceiling and not asked
    again is reported with the same error (type, message, fields) and raw text on either
    transport (the batch transport used to report the receipt's own error instead)."""
    reported = []
    for transport, _, s in each_transport(tmp_path, SimulatedModel(answer=long_label), repairs=1,
                                          replays=1, extra_body={"max_completion_tokens": 60}):
        result = s.run_batch("labels", tasks(2), SCHEMA, pack=2, transport=transport,
                             wait=True, on_exhausted="return")  # every answer is cut off
        (receipt,) = s.ledger.attempts("labels")
        assert receipt.errors[0]["type"] == "truncated"
        (failure,) = result.failures
        said = failure["errors"][0]["message"]
        assert "not re-asked" in said
        # the fix offered is one the transport has: a batch job never splits a request
        assert ("pass split=True" in said) == (transport == "live")
        assert ("never splits" in said) == (transport == "batch")
        reported.append(without_request([*result.errors, *result.failures]))
    live, batch = (re.sub(r"raise max_tokens[^\"]*", "", json.dumps(r)) for r in reported)
    assert live == batch  # the same errors up to the fix offered


def test_the_rest_of_a_partial_return_keeps_its_errors_when_a_stop_cuts_its_repair(tmp_path):
    """accept="items": t0's item passes and t1's fails; then the validator crashes on t2, so
    t1's repair is never sent. On either transport t1 shows its own rejection (its return was
    judged), not "no call was made"; the batch transport reads it from the partial receipt
    its request was split from."""
    reported = []
    for transport, _, s in each_transport(tmp_path, repairs=2, replays=2, **BOTH_IN_FLIGHT):
        result = s.run_batch("labels", tasks(4), SCHEMA, pack=2, transport=transport,
                             wait=True, validator=crashing_on("t2", "t1", "t1 is wrong"),
                             accept="items", on_exhausted="return")
        assert list(result.values) == ["t0"] and result.partial_returns == 1
        reported.append(without_request(result.errors))
    assert reported[0] == reported[1]
    (t1,) = [e for e in reported[0] if e["task_id"] == "t1"]
    assert t1["type"] == "validation" and "t1 is wrong" in t1["message"]


def test_budget_running_out_is_one_error_whether_sent_live_or_in_a_job(tmp_path):
    """A request the budget cannot ask again is reported ``budget_exhausted``, saying why, on
    either transport (the batch transport used to add only a note, the request showing its last
    receipt's errors)."""
    def picky(item, task):
        if task["task_id"] == "t0":
            raise ValueError("not this one")

    reported = []
    for transport, _, s in each_transport(tmp_path, repairs=3, replays=0):
        result = s.run_batch("labels", tasks(2), SCHEMA, pack=1, transport=transport,
                             wait=True, max_calls=3, validator=picky, on_exhausted="return")
        assert result.calls == 3 and list(result.values) == ["t1"]
        assert result.repairs_made == 1  # t0's, sent live or in a follow-up job alike
        reported.append(without_request(result.errors))
    assert reported[0] == reported[1] == [{
        "type": "budget_exhausted", "task_id": "t0",
        "message": "the budget ran out before this request was resolved (no calls left)"}]


def test_a_validator_crash_stops_the_run_whether_sent_live_or_in_a_job(tmp_path):
    """A validator that raises (not a ValueError) stops the run opening calls on either
    transport: what was in flight (live: both calls; a job: its every line) is judged, nothing
    more is sent, and a request whose return was rejected shows that return's own errors, not
    "no call was made" (docs/design.md)."""
    reported = []
    for transport, srv, s in each_transport(tmp_path, repairs=2, replays=2, **BOTH_IN_FLIGHT):
        result = s.run_batch("labels", tasks(4), SCHEMA, pack=2, transport=transport,
                             wait=True, validator=crashing_on("t0", "t2", "a repair would follow"),
                             on_exhausted="return")
        assert srv.batches.created == (transport == "batch")  # no follow-up job
        assert result.calls == 2 and not result.values
        assert result.repairs_made == 0  # the repair owed to t2 was never sent
        reported.append((without_request(result.errors),
                         [n for n in result.notes if "validator crashed" in n]))
    assert reported[0] == reported[1]
    errors, (note,) = reported[0]
    assert [(e["type"], e["task_id"]) for e in errors] == [
        ("validator_error", "t0"), ("batch_rejected", "t1"), ("validation", "t2"),
        ("batch_rejected", "t3")]
    assert "a repair would follow" in errors[2]["message"]
    assert not any("no call was made" in e["message"] for e in errors)


def test_cancelling_an_uncertain_job_keeps_its_calls_in_the_account_and_cancels_it_at_the_provider(
        tmp_path):
    """A job whose batch the provider created but whose id was never recorded (its runner was
    killed) may run and be billed: cancelling it finds the batch by the uid it was created with
    (OpenAI keeps it in the batch's metadata), cancels it there and records its id; its requests
    stay in the account as possibly billed calls, so what was spent never shrinks, and the rerun
    that owes them again is the only other time they are answered."""
    from batchjson import Ledger
    from batchjson._session.batches import cancel_job

    target = tmp_path / "l.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 4.0  # still running when it is cancelled
        run_child(srv, target, "before-record")
        [made] = srv.batches.batches  # created at the provider; its id never recorded
        held = Ledger(target)
        assert held.spend()["calls"] == 6
        job = cancel_job(held, "1")
        assert job["status"] == "cancelled" and job["released"] == 6
        assert job["provider_job_id"] == made
        assert srv.batches.batches[made]["status"] in ("cancelling", "cancelled")
        spent = held.spend()
        assert spent["calls"] == 6 and spent["unsent"] == 0  # possibly billed: still calls
        assert spent["cancelled_calls"] == 6 and spent["unknown_cost_calls"] == 6
        [(provider_id, detail)] = ledger_rows(target, "SELECT provider_job_id, detail FROM jobs")
        assert provider_id == made and "cancel_sent_at" in detail
        unsent = ledger_rows(target, "SELECT COUNT(*) FROM attempts WHERE sent_at IS NULL")
        assert unsent == [(0,)]
        held.close()
        srv.batches.delay = 0.1
        s = session(srv, target)
        result = s.run_batch("labels", tasks(), SCHEMA, transport="batch", wait=True)
        s.close()
        assert result.resolved and srv.batches.created == 2
        deadline = time.monotonic() + 10
        while srv.batches.batches[made]["status"] != "cancelled":  # it ends, answering none
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert sorted(srv.batches.lines_answered.values()) == [1] * 6  # none answered twice
    final = Ledger(target)
    assert final.spend()["calls"] == 12  # every call made is in the account
    final.close()


def test_cancelling_an_uncertain_job_the_provider_cannot_be_asked_about_releases_nothing(tmp_path):
    """Releasing an uncertain OpenAI job without looking for its batch is what pays twice: when
    the provider cannot be asked, the cancel says so and the job stays uncertain, claiming its
    requests; an Anthropic job (its batches keep no uid) is released, its requests kept as
    possibly billed calls."""
    from batchjson import Ledger
    from batchjson._errors import ProviderError
    from batchjson._session.batches import cancel_job

    openai_target, anthropic_target = tmp_path / "o.sqlite", tmp_path / "a.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        run_child(srv, openai_target, "before-record")
        run_child(srv, anthropic_target, "before-record", "anthropic")
    held = Ledger(openai_target)  # its server is gone
    with pytest.raises(ProviderError, match="nothing was released"):
        cancel_job(held, "1")
    [job] = held.store.jobs()
    assert job["status"] == "uncertain" and held.spend()["pending_calls"] == 6
    held.close()
    held = Ledger(anthropic_target)
    assert cancel_job(held, "1")["released"] == 6
    spent = held.spend()
    assert spent["calls"] == spent["cancelled_calls"] == 6 and spent["unsent"] == 0
    held.close()


@pytest.mark.parametrize("collected_by", ["rerun", "status"])
def test_a_job_whose_requests_were_answered_another_way_is_still_collected_and_its_usage_kept(
        srv, tmp_path, collected_by):
    """A job's requests accepted meanwhile by an import: its lines are still collected, billed
    and judged (a rerun or a status collects it), each a call admitting nothing, and the job
    leaves the open ones; what the import accepted keeps its value."""
    from batchjson.core import collect_ended

    s = session(srv, tmp_path / "held.sqlite")
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch").status == "pending"
    other = session(srv, tmp_path / "other.sqlite")
    assert other.run_batch("labels", tasks(3), SCHEMA).resolved  # live, in another ledger
    exported = tmp_path / "other.jsonl"
    exported.write_text("".join(json.dumps(r) + "\n" for r in other.ledger.export_receipts()))
    other.close()
    assert s.ledger.import_receipts(exported)["admitted"] == 3
    kept = s.ledger.checkpoint("labels")
    assert len(kept) == 3
    time.sleep(0.4)  # the job has ended at the provider
    if collected_by == "rerun":
        again = s.run_batch("labels", tasks(3), SCHEMA, transport="batch")
        assert again.resolved and not again.jobs
    else:
        [said] = collect_ended(s.runtime(), "labels")
        assert "ended: collected 3 line(s)" in said
    assert s.ledger.store.jobs() == [] and srv.batches.created == 1  # collected, none sent
    [job] = s.ledger.store.jobs(every=True)
    assert job["status"] == "ended"
    spent = s.ledger.spend("labels")
    assert spent["calls"] == 6 and spent["in_flight_calls"] == 0  # 3 imported, 3 job lines
    assert spent["input_tokens"] > 0
    assert s.ledger.checkpoint("labels") == kept  # nothing committed twice
    assert accepted_per_key(tmp_path / "held.sqlite") == {k: 1 for k in accepted_per_key(
        tmp_path / "held.sqlite")}
    s.close()


def test_a_job_answered_another_way_is_collected_by_a_run_that_sends_the_rest(srv, tmp_path):
    """A run that still owes other requests collects, beside its own job, the earlier job whose
    every request an import accepted meanwhile: its usage kept, nothing admitted twice."""
    held = tmp_path / "held.sqlite"
    s = session(srv, held)
    first = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", max_calls=2,
                        on_exhausted="return")
    [job] = first.jobs
    assert first.status == "pending" and job["requests"] == 2
    sent = {t for line in s.ledger.store.job_lines(job["id"]) for t in json.loads(
        ledger_rows(held, "SELECT task_ids FROM attempts WHERE id = ?",
                    line["attempt_id"])[0][0])}
    other = session(srv, tmp_path / "other.sqlite")
    assert other.run_batch("labels", tasks(3), SCHEMA).resolved  # live, in another ledger
    exported = tmp_path / "other.jsonl"
    exported.write_text("".join(json.dumps(r) + "\n" for r in other.ledger.export_receipts()
                                if {t["task_id"] for t in r["tasks"]} <= sent))
    other.close()
    assert s.ledger.import_receipts(exported)["admitted"] == 2
    kept = s.ledger.checkpoint("labels")
    time.sleep(0.4)  # the first job has ended at the provider
    again = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    assert again.resolved and not again.jobs and srv.batches.created == 2
    assert s.ledger.store.jobs() == []  # both collected
    spent = s.ledger.spend("labels")
    assert spent["calls"] == 5 and spent["in_flight_calls"] == 0  # 2 imported, 3 job lines
    assert {k: v for k, v in s.ledger.checkpoint("labels").items() if k in sent} == {
        k: v for k, v in kept.items() if k in sent}
    s.close()


def deadlocking_collections(s: Session, monkeypatch: Any, *, times: int) -> list[int]:
    """The session's store ending a job as a deadlock's victim the first ``times`` times (as
    PostgreSQL can pick it, against another host's write): how often it did, as it happens."""
    store = s.ledger.store

    class Conflict(Exception):
        pass

    monkeypatch.setattr(type(store), "conflicts", (Conflict,))
    end_job, met = store.end_job, []

    def deadlocked(tx: Any, *args: Any, **kwargs: Any) -> bool:
        ended = end_job(tx, *args, **kwargs)
        if len(met) < times:
            met.append(1)
            raise Conflict("deadlock detected")
        return ended

    monkeypatch.setattr(store, "end_job", deadlocked)
    return met


def test_a_collection_that_meets_another_hosts_write_is_recorded_once_when_run_again(
        srv, monkeypatch, tmp_path):
    """Collecting a job completes its receipts and ends it in one transaction; on PostgreSQL
    another host's write can pick it as a deadlock's victim. Fault: psycopg's own error left the
    run, the job's paid answers unrecorded, though running the transaction again commits it."""
    target = tmp_path / "l.sqlite"
    s = session(srv, target)
    met = deadlocking_collections(s, monkeypatch, times=1)
    result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    s.close()
    assert met and result.resolved and len(result.values) == 3
    assert srv.batches.created == 1  # collected, not asked again
    assert sorted(accepted_per_key(target).values()) == [1, 1, 1]
    assert ledger_rows(target, "SELECT status, COUNT(*) FROM jobs GROUP BY status") == [
        ("ended", 1)]


def test_a_collection_that_is_never_recorded_charges_the_session_nothing(srv, monkeypatch,
                                                                         tmp_path):
    """A job's lines are charged to the session's budget once their transaction commits. Fault:
    they were charged as they were judged, so a collection that deadlocked every time (nothing
    recorded, the run stopped) and its re-run charged every line twice."""
    target = tmp_path / "l.sqlite"
    s = session(srv, target)
    deadlocking_collections(s, monkeypatch, times=3)
    with pytest.raises(LedgerError):
        s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    assert s.spent_cost == 0  # nothing recorded, nothing charged
    assert s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True).resolved
    [(paid,)] = ledger_rows(target, "SELECT SUM(cost) FROM attempts")
    s.close()
    assert paid > 0 and s.spent_cost == pytest.approx(paid)
