"""Attacks on the streamed batch transport: requests spread over several windows and jobs,
with line faults, shrinking jobs, refused creations, resumption from other processes, repairs
and answers holding U+2028; no request is ever paid past its allowance or accepted twice."""

from __future__ import annotations

import json
from typing import Any

from batchjson import Session
from batchjson._errors import ProviderError
from batchjson._providers.batch_client import TEXT, BatchClient, OutputLines
from batchjson.testing import BatchFaults, LoopbackServer
from batchjson.testing.simulated import FaultPlan, SimulatedModel
from tests.helpers import ledger_rows, openai
from tests.test_batch_jobs import SCHEMA, tasks
from tests.test_batch_window import JOB, job_lines, small_jobs  # noqa: F401
from tests.test_window import small_windows  # noqa: F401


def batch_session(srv: LoopbackServer, path: Any) -> Session:
    s = Session(openai(srv), ledger=path)
    s.job_poll = 0.02
    return s


def attempts_per_key(path: Any) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for key, kind, status in ledger_rows(path, "SELECT request_key, kind, status FROM attempts "
                                         "ORDER BY id"):
        out.setdefault(key, []).append((kind, status))
    return out


def never_past_acceptance(path: Any) -> None:
    """Each request accepted once, and nothing sent for it after that."""
    for key, rows in attempts_per_key(path).items():
        statuses = [s for _, s in rows]
        assert statuses.count("accepted") == 1, (key, rows)
        assert statuses[-1] == "accepted", (key, rows)


def test_line_faults_across_many_jobs_never_pay_a_request_twice(tmp_path, small_jobs):  # noqa: F811
    n, path = 40, tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.03
        srv.batches.faults = [BatchFaults(lines={0: "duplicate", 1: "errored", 2: "expired",
                                                 3: "unknown"}, shuffle=True)] * 12
        s = batch_session(srv, path)
        result = s.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True,
                             replays=3)
        s.close()
        answered = srv.batches.lines_answered
    assert result.status == "resolved" and len(result.values) == n
    never_past_acceptance(path)
    for key, rows in attempts_per_key(path).items():
        assert len(rows) <= 4, (key, rows)  # one first call and at most three replays
    assert max(size for (size,) in job_lines(path)) <= JOB
    assert all(times <= 2 for times in answered.values())  # a duplicate line, never a resend


def test_a_duplicated_line_in_the_counting_pass_admits_neither_copy(tmp_path, small_jobs):  # noqa: F811
    path = tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.03
        srv.batches.faults = [BatchFaults(lines={4: "duplicate"}, shuffle=True)]
        s = batch_session(srv, path)
        result = s.run_batch("labels", tasks(10), SCHEMA, transport="batch", wait=True,
                             replays=0, on_exhausted="return")
        s.close()
    assert result.status == "unresolved" and len(result.values) == 9
    assert any("came back 2 times" in e["message"] for e in result.errors)


def test_token_limit_halves_the_jobs_still_to_come_mid_stream(tmp_path, small_jobs):  # noqa: F811
    n, path = 20, tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.03
        srv.batches.faults = [BatchFaults(), BatchFaults(whole="token_limit")]
        s = batch_session(srv, path)
        result = s.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True)
        s.close()
    assert result.status == "resolved" and len(result.values) == n
    never_past_acceptance(path)
    assert any("token_limit_exceeded" in note for note in result.notes)
    sizes = [size for (size,) in job_lines(path)]
    assert sum(sizes) == n + JOB and min(sizes) <= JOB // 2


def refuse_create(monkeypatch, refused: set[int]) -> list[int]:
    """The provider refuses the job creations numbered ``refused`` (from 1; HTTP 400)."""
    seen = [0]
    for cls in BatchClient.__subclasses__():
        real = cls.create

        async def create(self, *a, _real=real, **kw):
            seen[0] += 1
            if seen[0] in refused:
                raise ProviderError("loopback: refused", status=400, retryable=False)
            return await _real(self, *a, **kw)

        monkeypatch.setattr(cls, "create", create)
    return seen


def test_a_job_refused_at_create_is_sent_again_as_a_replay_while_others_run(tmp_path,
                                                                           monkeypatch,
                                                                           small_jobs):  # noqa: F811
    """Nothing of a refused job reached the provider: its requests are owed again by the same
    run, as replays (a refusal is likely to recur, so the allowance bounds it)."""
    n, path = 15, tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.2  # the other jobs still run when the refused one is looked at
        refuse_create(monkeypatch, {2})
        s = batch_session(srv, path)
        result = s.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True,
                             replays=1)
        s.close()
    assert any("refused" in note for note in result.notes)
    assert result.status == "resolved" and len(result.values) == n
    never_past_acceptance(path)
    chains = sorted(tuple(rows) for rows in attempts_per_key(path).values())
    assert chains == [(("initial", "accepted"),)] * 10 + [
        (("initial", "cancelled"), ("replay", "accepted"))] * 5


def test_a_job_refused_when_it_was_the_only_one_is_named_not_dropped(tmp_path, monkeypatch):
    path = tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.03
        refuse_create(monkeypatch, {1})
        s = batch_session(srv, path)
        first = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True,
                            on_exhausted="return")
        again = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
        s.close()
    assert first.status != "resolved" and any("refused" in n for n in first.notes)
    assert again.status == "resolved"


def test_a_resumed_chain_does_not_count_receipts_an_earlier_run_gave_up_on(tmp_path):
    """Run 1 gives up (its replay spent); run 2 starts a new chain and returns with it open;
    run 3 resumes run 2's chain: the receipts of run 1 are no part of it, so run 3 may still
    replay once."""
    path = tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.faults = [BatchFaults(whole="all_failed")] * 3
        srv.batches.delay = 0.03
        s = batch_session(srv, path)
        gave_up = s.run_batch("labels", tasks(1), SCHEMA, transport="batch", wait=True,
                              replays=1, on_exhausted="return")
        assert gave_up.status == "unresolved" and srv.batches.created == 2
        srv.batches.delay = 0.3
        pending = s.run_batch("labels", tasks(1), SCHEMA, transport="batch", wait=False,
                              replays=1)
        assert pending.status == "pending" and srv.batches.created == 3
        s.close()
        other = batch_session(srv, path)  # another process resumes run 2
        srv.batches.delay = 0.03
        done = other.run_batch("labels", tasks(1), SCHEMA, transport="batch", wait=True,
                               replays=1, on_exhausted="return")
        other.close()
    assert srv.batches.created == 4 and done.status == "resolved"


def test_repairs_resumed_by_other_processes_stay_within_the_allowance(tmp_path, small_jobs):  # noqa: F811
    n, path = 12, tmp_path / "w.sqlite"
    model = SimulatedModel(faults=FaultPlan(malformed_json=0.5, identity_swap=0.3,
                                            clean_after=1), seed=5)
    with LoopbackServer(model) as srv:
        srv.batches.delay = 0.3
        srv.batches.faults = [BatchFaults(lines={2: "errored"})] * 3
        results = []
        for wait in (False, False, True):
            s = batch_session(srv, path)
            results.append(s.run_batch("labels", tasks(n), SCHEMA, transport="batch",
                                       wait=wait, repairs=1, replays=1))
            s.close()
            srv.batches.delay = 0.03
    assert results[-1].status == "resolved" and len(results[-1].values) == n
    never_past_acceptance(path)
    for key, rows in attempts_per_key(path).items():
        kinds = [k for k, _ in rows]
        assert kinds.count("repair") <= 1 and kinds.count("replay") <= 1, (key, rows)


def test_a_u2028_inside_an_answer_never_cuts_its_line():
    lines = [{"custom_id": "a", "text": "one\u2028two\u2029three\x85four"},
             {"custom_id": "b", "text": "x"}]
    raw = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines).encode()
    got = OutputLines([raw, raw[:-1]])
    texts = [json.dumps(x, ensure_ascii=False) for x in lines]
    kept = [{**x, TEXT: text} for x, text in zip(lines, texts, strict=True)]
    assert list(got) == kept * 2 and list(got) == kept * 2  # read twice, the same


def test_requests_accepted_live_are_skipped_in_every_window_and_job(tmp_path, small_jobs):  # noqa: F811
    n, path = 30, tmp_path / "w.sqlite"
    with LoopbackServer() as srv:
        srv.batches.delay = 0.03
        s = batch_session(srv, path)
        live = s.run_batch("labels", tasks(n)[::3], SCHEMA)
        assert live.resolved
        result = s.run_batch("labels", tasks(n), SCHEMA, transport="batch", wait=True)
        s.close()
    assert result.status == "resolved" and len(result.values) == n
    never_past_acceptance(path)
    assert sum(size for (size,) in job_lines(path)) == n - len(tasks(n)[::3])


def test_garbage_output_lines_are_named_and_never_stop_the_collection(tmp_path, monkeypatch):
    """Lines a provider should never send (not JSON, not an object, a custom_id that is a
    list, an object or a number) are unknown lines: named, never admitted, never a crash."""
    junk = (b'not json at all\n[1, 2]\n"text"\n{"custom_id": ["x"]}\n{"custom_id": {"a": 1}}\n'
            b'{"custom_id": 7}\n{"custom_id": null}\n')
    for cls in BatchClient.__subclasses__():
        real = cls.results

        async def results(self, batch, _real=real):
            got = await _real(self, batch)
            return OutputLines([junk, *got.files])

        monkeypatch.setattr(cls, "results", results)
    with LoopbackServer() as srv:
        srv.batches.delay = 0.03
        s = batch_session(srv, tmp_path / "w.sqlite")
        result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
        s.close()
    assert result.status == "resolved" and len(result.values) == 3
    assert any("never sent" in note for note in result.notes)


def test_a_garbled_unknown_line_and_an_errored_copy_never_hide_what_the_other_copies_billed():
    """Lines read only for what they were billed: one the provider's reader cannot make sense
    of counts as unknown (it never stops the collection), and a copy that says no usage (an
    error line) adds nothing to the copies that do. Faults: the reader's exception escaping
    the collection (the job never ended), or an errored copy turning the sum unknown (the
    paid copy charged nothing)."""
    from types import SimpleNamespace

    from batchjson._providers.openai import OpenAIBatches, OpenAIProvider
    from batchjson._replay.jobs import JobRunner

    client = OpenAIBatches(OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1",
                                          api_key="sk-test"))
    runner = SimpleNamespace(client=client)
    paid = {"custom_id": "bj_1", "response": {"status_code": 200, "body": {
        "choices": [{"message": {"content": "{}"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}}}}
    failed = {"custom_id": "bj_1", "response": {"status_code": 500,
                                                "body": {"error": {"message": "x"}}}}
    garbled = {"custom_id": "not_ours", "response": {"status_code": 200, "body": {
        "choices": [{"message": "not an object"}]}}}
    billed = JobRunner._billed(runner, [paid, failed, garbled], {"bj_1": {"wrapped": 0}},
                               {"bj_1"}, None)
    assert (billed["bj_1"]["input_tokens"], billed["bj_1"]["output_tokens"]) == (10, 5)
    assert billed["bj_1"]["cost"] > 0
    assert billed[None]["input_tokens"] is None  # the garbled line's: unknown
