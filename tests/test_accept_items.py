"""Item-level acceptance (``accept="items"``): a return whole in JSON, coverage and identity
commits the items that pass, and asks again for the others alone; anything else rejects whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

import pytest

from batchjson import CallableProvider, RejectReturn, Session, SimulatedModel
from batchjson.testing import LoopbackServer
from tests.helpers import LABEL_SCHEMA, cell_ok, items_reply, ledger_rows, openai, review_tasks

IDENTITY = ("task_id", "case_id", "candidate_id")
BATCH_SCHEMA = {"type": "object", "properties": {"task_id": {"type": "string"},
                                                 "label": {"type": "string"}},
                "required": ["task_id", "label"]}


class Model:
    """Answers every call correctly, except the overrides ``bad(call)`` gives; records calls."""

    def __init__(self, bad=lambda call: {}) -> None:
        self.bad = bad
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, call):
        self.calls.append(tuple(t["task_id"] for t in call.tasks))
        return items_reply(call, **self.bad(call))


def third_is_wrong_the_first_time(call):
    """The first call's third item breaks the schema (a verdict out of its enum)."""
    return {call.tasks[2]["task_id"]: {"verdict": "maybe"}} if call.attempt == 0 and len(
        call.tasks) > 2 else {}


def run(session: Session, tasks, **options):
    return session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=len(tasks),
                             **options)


def test_a_schema_failing_item_commits_its_pack_mates_and_reasks_only_it(tmp_path):
    model = Model(third_is_wrong_the_first_time)
    session = Session(CallableProvider(model), ledger=tmp_path / "l.sqlite", repairs=1,
                      replays=0)
    tasks = review_tasks(5)
    result = run(session, tasks, accept="items")

    assert result.status == "resolved"
    assert model.calls == [tuple(t["task_id"] for t in tasks), (tasks[2]["task_id"],)]
    receipts = session.ledger.attempts("review")
    assert [(r.kind, r.status) for r in receipts] == [
        ("initial", "partial"), ("recheck", "accepted"), ("repair", "accepted")]
    partial = receipts[0]
    assert len(json.loads(partial.raw)["items"]) == 5  # the raw return kept whole
    assert [e["task_id"] for e in partial.errors] == [tasks[2]["task_id"]]
    assert list(result.values) == [t["task_id"] for t in tasks]  # in task order
    assert list(session.ledger.checkpoint("review")) == [t["task_id"] for t in tasks]
    assert result.calls == 2
    # the accepted part re-judges whole: its raw is its own items' return
    kept = json.loads(receipts[1].raw)["items"]
    assert [i["task_id"] for i in kept] == [t["task_id"] for t in tasks if t != tasks[2]]


def test_the_reask_of_a_partial_return_is_a_repair_within_repairs(tmp_path):
    always_bad = Model(lambda call: {call.tasks[-1]["task_id"]: {"verdict": "maybe"}}
                       if call.tasks[-1]["task_id"].endswith("129") else {})
    session = Session(CallableProvider(always_bad), repairs=1, replays=0)
    result = run(session, review_tasks(3), accept="items", on_exhausted="return")
    assert result.status == "unresolved"
    assert len(always_bad.calls) == 2 and always_bad.calls[1] == (review_tasks(3)[2]["task_id"],)
    assert sorted(result.values) == [t["task_id"] for t in review_tasks(2)]
    assert {e["task_id"] for e in result.errors} == {review_tasks(3)[2]["task_id"]}


def test_whole_return_acceptance_stays_the_default(tmp_path):
    model = Model(third_is_wrong_the_first_time)
    session = Session(CallableProvider(model), repairs=1, replays=0)
    result = run(session, review_tasks(5))
    assert result.status == "resolved" and [len(c) for c in model.calls] == [5, 5]
    assert [r.status for r in session.ledger.attempts("review")] == ["rejected", "accepted"]


def test_an_identity_swap_commits_nothing_under_item_acceptance(tmp_path):
    """The seed's regression: candidate 127's case_id says 079 where 078 was asked."""
    def swapped(call):
        return {call.tasks[0]["task_id"]: {"case_id": "gold-pair-079"}}

    session = Session(CallableProvider(Model(swapped)), repairs=0, replays=0)
    result = run(session, review_tasks(20), accept="items", on_exhausted="return")
    assert result.status == "unresolved" and result.values == {}
    assert [r.status for r in session.ledger.attempts("review")] == ["rejected"]
    assert session.ledger.checkpoint("review") == {}


@pytest.mark.parametrize("fault", ["missing", "duplicated"])
def test_a_missing_or_duplicated_item_rejects_the_return_whole(fault):
    def broken(call):
        payload = json.loads(items_reply(call, **{call.tasks[1]["task_id"]: {
            "verdict": "maybe"}}))
        if fault == "missing":
            payload["items"].pop(0)
        else:
            payload["items"].append(payload["items"][0])
        return json.dumps(payload)

    session = Session(CallableProvider(broken), repairs=0, replays=0)
    result = run(session, review_tasks(4), accept="items", on_exhausted="return")
    assert result.values == {}
    (receipt,) = session.ledger.attempts("review")
    assert receipt.status == "rejected"
    assert any(e["type"] == "coverage" for e in receipt.errors)


def test_a_validator_can_reject_the_whole_return(tmp_path):
    def shifted(item, task):
        if task["candidate_id"].endswith("128"):
            raise RejectReturn("every answer is one candidate off")

    model = Model()
    session = Session(CallableProvider(model), repairs=0, replays=0)
    result = run(session, review_tasks(4), accept="items", validator=shifted,
                 on_exhausted="return")
    assert result.values == {} and len(model.calls) == 1
    (receipt,) = session.ledger.attempts("review")
    assert receipt.status == "rejected" and receipt.errors[0]["task_id"] is None
    assert "one candidate off" in receipt.errors[0]["message"]


def test_a_validator_rejecting_one_item_commits_the_others(tmp_path):
    model = Model()
    seen: list[str] = []

    def picky(item, task):
        seen.append(task["task_id"])
        if task["candidate_id"].endswith("128") and seen.count(task["task_id"]) == 1:
            raise ValueError("not sure about this one")

    session = Session(CallableProvider(model), repairs=1, replays=0)
    tasks = review_tasks(4)
    result = run(session, tasks, accept="items", validator=picky)
    assert result.status == "resolved" and model.calls[1] == (tasks[1]["task_id"],)
    assert len(session.ledger.checkpoint("review")) == 4


def test_every_item_failing_is_a_plain_rejection():
    model = Model(lambda call: {t["task_id"]: {"verdict": "maybe"} for t in call.tasks})
    session = Session(CallableProvider(model), repairs=0, replays=0)
    result = run(session, review_tasks(3), accept="items", on_exhausted="return")
    assert result.values == {}
    assert [r.status for r in session.ledger.attempts("review")] == ["rejected"]


def test_item_acceptance_combines_with_split(tmp_path):
    """The rejected part goes on as its own request: repaired, replayed, then halved."""
    bad = {"gold-pair-078-candidate-128", "gold-pair-078-candidate-130"}

    def wrong_until_alone(call):
        if len(call.tasks) == 1:
            return {}
        return {t["task_id"]: {"verdict": "maybe"} for t in call.tasks
                if t["candidate_id"] in bad}

    model = Model(wrong_until_alone)
    session = Session(CallableProvider(model), repairs=0, replays=0)
    result = run(session, review_tasks(6), accept="items", split=True)
    assert result.status == "resolved"
    assert [len(c) for c in model.calls] == [6, 1, 1]
    assert len(session.ledger.checkpoint("review")) == 6


def test_a_partial_return_is_kept_as_such_and_resumes(tmp_path):
    model = Model(third_is_wrong_the_first_time)
    path = tmp_path / "l.sqlite"
    first = Session(CallableProvider(model, source="m"), ledger=path, repairs=0, replays=0)
    result = run(first, review_tasks(4), accept="items", on_exhausted="return")
    assert result.status == "unresolved" and len(result.values) == 3
    first.close()
    again = Session(CallableProvider(model, source="m"), ledger=path, repairs=0, replays=0)
    result = run(again, review_tasks(4), accept="items")
    assert result.status == "resolved" and model.calls[-1] == (review_tasks(4)[2]["task_id"],)
    assert ledger_rows(path, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (4, 4)]


def test_a_batch_job_line_accepted_in_part_commits_its_valid_items_and_reasks_the_rest(
        ledger_at):
    """The batch transport settles a line through the same step: its valid items are
    committed with the job, the rejected one goes alone in the follow-up job as a repair."""
    judged: Counter[str] = Counter()

    def picky(item, task):
        judged[task["task_id"]] += 1
        if task["task_id"] == "t2" and judged["t2"] == 1:
            raise ValueError("t2 is not sure yet")

    target = ledger_at()
    labels = [{"task_id": f"t{i}", "prompt": f"Label review {i}."} for i in range(6)]
    with LoopbackServer(SimulatedModel(answer=lambda task: {"label": "ok"})) as srv:
        srv.batches.delay = 0.1
        session = Session(openai(srv), ledger=target, repairs=1, replays=0)
        session.job_poll = 0.05
        result = session.run_batch("labels", labels, BATCH_SCHEMA, validator=picky, pack=6,
                                   transport="batch", wait=True, accept="items")
        session.close()
        assert srv.batches.created == 2
    assert result.status == "resolved" and list(result.values) == [t["task_id"] for t in labels]
    rows = ledger_rows(target, "SELECT kind, status, task_ids FROM attempts ORDER BY id")
    assert [(kind, status, json.loads(ids)) for kind, status, ids in rows] == [
        ("initial", "partial", [f"t{i}" for i in range(6)]),
        ("recheck", "accepted", ["t0", "t1", "t3", "t4", "t5"]),
        ("repair", "accepted", ["t2"])]
    assert ledger_rows(target, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (6, 6)]


KILL_AT = textwrap.dedent("""
    import os, signal, sys
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks
    from tests.test_accept_items import IDENTITY, third_item_out_of_enum

    point, calls = sys.argv[2], []

    def model(call):
        calls.append(call)
        if point == "reask" and len(calls) == 2:  # the partial return committed, R sent
            os.kill(os.getpid(), signal.SIGKILL)
        return items_reply(call, **third_item_out_of_enum(call))

    session = Session(CallableProvider(model, source="m"), ledger=sys.argv[1], repairs=1,
                      replays=0)
    store = type(session.ledger.store)
    complete = store.complete_call

    def completing(self, tx, attempt_id, status, *args, **kwargs):
        out = complete(self, tx, attempt_id, status, *args, **kwargs)
        if point == "commit" and status == "partial":  # written, not yet committed
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    store.complete_call = completing
    session.run_batch("review", review_tasks(5), LABEL_SCHEMA, identity=IDENTITY, pack=5,
                      accept="items")
""")


def third_item_out_of_enum(call):
    """Every pack of three or more: its third item breaks the schema."""
    return {call.tasks[2]["task_id"]: {"verdict": "maybe"}} if len(call.tasks) > 2 else {}


@pytest.mark.parametrize("point", ["commit", "reask"])
def test_a_kill_around_a_partial_commit_then_resume_commits_each_item_once(ledger_at, point):
    target = ledger_at()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", KILL_AT, str(target), point], env=env,
                          cwd=os.getcwd(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    committed = ledger_rows(target, "SELECT COUNT(*) FROM checkpoint")[0][0]
    assert committed == (4 if point == "reask" else 0)
    model = Model(third_item_out_of_enum)
    session = Session(CallableProvider(model, source="m"), ledger=target, repairs=1, replays=0)
    result = run(session, review_tasks(5), accept="items")
    assert result.status == "resolved" and list(result.values) == [
        t["task_id"] for t in review_tasks(5)]
    if point == "reask":  # A found accepted, R owed: only R is asked
        assert model.calls == [(review_tasks(5)[2]["task_id"],)]
    assert ledger_rows(target, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (5, 5)]


def test_two_runners_with_item_acceptance_commit_each_item_once(ledger_at):
    """Two sessions run the same batch side by side: claims keep one payer per request, and
    a partial return's items are committed once, whoever's return it was."""
    import asyncio
    import threading

    target = ledger_at()
    Session(ledger=target).close()  # the schema made once, before the runners race
    tasks = review_tasks(12)
    results = []

    async def slow(call):
        await asyncio.sleep(0.02)
        return items_reply(call, **third_item_out_of_enum(call))

    def runner():
        session = Session(CallableProvider(slow, source="m"), ledger=target, repairs=1,
                          replays=0, concurrency=2)
        results.append(session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY,
                                         pack=4, accept="items"))
        session.close()

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r.status for r in results] == ["resolved", "resolved"]
    assert list(results[0].values) == [t["task_id"] for t in tasks]
    assert ledger_rows(target, "SELECT COUNT(*), COUNT(DISTINCT task_id) FROM checkpoint") == [
        (12, 12)]


def test_receipts_and_status_show_a_partial_receipt_as_partial(tmp_path):
    path = tmp_path / "l.sqlite"
    session = Session(CallableProvider(Model(third_is_wrong_the_first_time)), ledger=path,
                      repairs=1, replays=0)
    result = run(session, review_tasks(4), accept="items")
    assert result.partial_returns == 1 and "1 accepted in part" in repr(result)
    assert "<b>1</b><br><span style='color:#666'>returns accepted in part" in (
        result._repr_html_())
    spend = session.ledger.spend()
    assert spend["partial"] == 1 and spend["accepted"] == 1
    assert spend["calls"] == 2  # the derived receipt is no call
    assert session.ledger.evidence("review")["partial_returns"] == 1
    session.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "batchjson", *args, "--ledger", str(path)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    receipts = cli("receipts", "review")
    assert [line.split()[2:4] for line in receipts.splitlines()[2:] if line[:4].strip()] == [
        ["initial", "partial"], ["recheck", "accepted"], ["repair", "accepted"]]
    status = cli("status").splitlines()
    header = next(line for line in status if line.split()[:1] == ["batch"])
    assert "partial" in header.split()


def test_the_magic_and_its_config_accept_items(ip):
    def cell(source):
        return cell_ok(ip, source)

    cell("%load_ext batchjson")
    cell("from batchjson import SimulatedModel\n"
         "model = SimulatedModel(answer=lambda task: {'verdict': 'match'})\n"
         "judged = []")
    cell("%config BatchJson.provider = model")
    body = ("tasks = [{'task_id': f't{i}', 'prompt': f'question {i}'} for i in range(4)]\n"
            "schema = {'type': 'object', 'properties': {'verdict': {'type': 'string'}}, "
            "'required': ['verdict']}\n"
            "def check(item, task):\n"
            "    judged.append(task['task_id'])\n"
            "    if task['task_id'] == 't1' and judged.count('t1') == 1:\n"
            "        raise ValueError('not yet')\n")
    cell("%%batch_json first --validator check --pack 4 --repairs 1 --accept items\n" + body)
    first = ip.user_ns["first"]
    assert first.status == "resolved" and first.calls == 2 and first.partial_returns == 1
    cell("%config BatchJson.accept = 'items'")
    cell("judged.clear()")
    cell("%%batch_json second --validator check --pack 4 --repairs 1 "  # other content
         "--instructions \"'Be brief.'\"\n" + body)
    second = ip.user_ns["second"]
    assert second.partial_returns == 1 and second.calls == 2
    kinds = [r["status"] for r in cell("%batch_receipts second").rows]
    assert kinds == ["partial", "accepted", "accepted"]


def partial_run(path, repairs=0):
    """A run that leaves one partial receipt: three items committed, the third task owed."""
    session = Session(CallableProvider(Model(third_item_out_of_enum), source="m"), ledger=path,
                      repairs=repairs, replays=0)
    result = run(session, review_tasks(4), accept="items", on_exhausted="return")
    session.close()
    assert result.partial_returns == 1 and len(result.values) == 3
    return result


def test_an_exported_partial_receipt_imports_as_partial_and_rechecks_the_same_way(tmp_path):
    from batchjson import Ledger

    partial_run(tmp_path / "a.sqlite")
    before = Ledger(tmp_path / "a.sqlite")
    exported = tmp_path / "a.jsonl"
    exported.write_text("".join(json.dumps(r) + "\n" for r in before.export_receipts()))
    assert [r["status"] for r in before.export_receipts()] == ["partial", "accepted"]
    report = Ledger(tmp_path / "b.sqlite").import_receipts(exported)
    # the partial receipt admits its accepted part; the derived receipt then holds nothing new
    assert (report["admitted"], report["duplicate"], report["items_admitted"]) == (1, 1, 3)
    after = Ledger(tmp_path / "b.sqlite")
    assert after.checkpoint("review") == before.checkpoint("review")
    assert "partial" in [r.status for r in after.attempts("review")]
    owed = [u["task_ids"] for u in after.store.unresolved("review")]
    assert owed == [json.dumps([review_tasks(4)[2]["task_id"]])]  # the rest stays owed
    # exported again, the partial receipt is still partial
    assert "partial" in [r["status"] for r in after.export_receipts()]
    # a run there asks only for the rest
    model = Model(third_item_out_of_enum)
    session = Session(CallableProvider(model, source="m"), ledger=tmp_path / "b.sqlite")
    assert run(session, review_tasks(4), accept="items").status == "resolved"
    assert model.calls == [(review_tasks(4)[2]["task_id"],)]


def test_a_merged_partial_receipt_stays_partial_and_its_rest_owed(tmp_path):
    from batchjson import Ledger

    partial_run(tmp_path / "a.sqlite")
    target = Ledger(tmp_path / "b.sqlite")
    target.merge(tmp_path / "a.sqlite")
    assert len(target.checkpoint("review")) == 3
    assert [r.status for r in target.attempts("review")][:1] == ["partial"]
    assert target.spend()["partial"] == 1 and target.spend()["calls"] == 1


def test_another_batch_of_the_same_content_asks_only_the_rest_of_a_partial_return(tmp_path):
    """Evidence is content: the accepted part serves every batch; the rest is owed once."""
    path = tmp_path / "l.sqlite"
    partial_run(path)
    model = Model(third_item_out_of_enum)
    session = Session(CallableProvider(model, source="m"), ledger=path)
    result = session.run_batch("again", review_tasks(4), LABEL_SCHEMA, identity=IDENTITY, pack=4,
                               accept="items")
    assert result.status == "resolved" and model.calls == [(review_tasks(4)[2]["task_id"],)]
    assert list(result.values) == [t["task_id"] for t in review_tasks(4)]
    assert session.run_batch("review", review_tasks(4), LABEL_SCHEMA, identity=IDENTITY,
                             pack=4, accept="items").calls == 0


def test_a_partial_return_is_judged_again_whole_when_the_judging_changes(tmp_path):
    """Re-judging treats a partial return as a rejected one: the validator relaxed, its raw
    passes whole and resolves the new revision without a call."""
    def strict(item, task):
        if task["candidate_id"].endswith("129"):
            raise ValueError("not this one")

    def relaxed(item, task):
        return True

    model = Model()
    session = Session(CallableProvider(model, source="m"), ledger=tmp_path / "l.sqlite",
                      repairs=0, replays=0)
    first = run(session, review_tasks(4), accept="items", validator=strict,
                on_exhausted="return")
    assert first.partial_returns == 1 and len(first.values) == 3 and len(model.calls) == 1
    again = run(session, review_tasks(4), accept="items", validator=relaxed)
    assert again.status == "resolved" and again.calls == 0 and len(model.calls) == 1
    assert again.rechecked == 1


def test_the_rest_of_a_partial_job_line_sent_in_a_job_is_reported_pending(tmp_path):
    judged: Counter[str] = Counter()

    def picky(item, task):
        judged[task["task_id"]] += 1
        if task["task_id"] == "t2" and judged["t2"] == 1:
            raise ValueError("t2 is not sure yet")

    labels = [{"task_id": f"t{i}", "prompt": f"Label review {i}."} for i in range(6)]
    with LoopbackServer(SimulatedModel(answer=lambda task: {"label": "ok"})) as srv:
        srv.batches.delay = 0.2
        session = Session(openai(srv), ledger=tmp_path / "l.sqlite", repairs=1, replays=0)

        def again():
            return session.run_batch("labels", labels, BATCH_SCHEMA, validator=picky, pack=6,
                                     transport="batch", accept="items", on_exhausted="return")

        assert again().status == "pending"
        time.sleep(0.5)
        second = again()  # collects the first job, sends the rest in a second one
        assert second.status == "pending" and srv.batches.created == 2
        assert len(second.values) == 5 and [e["task_id"] for e in second.errors] == ["t2"]
        assert second.errors[0]["type"] == "pending"
        time.sleep(0.5)
        assert again().status == "resolved"
        session.close()


def test_a_job_run_reports_the_rest_of_a_partial_line_by_its_own_last_receipt(tmp_path):
    def never_t2(item, task):
        if task["task_id"] == "t2":
            raise ValueError("t2 never passes")

    labels = [{"task_id": f"t{i}", "prompt": f"Label review {i}."} for i in range(6)]
    with LoopbackServer(SimulatedModel(answer=lambda task: {"label": "ok"})) as srv:
        srv.batches.delay = 0.05
        session = Session(openai(srv), ledger=tmp_path / "l.sqlite", repairs=1, replays=0)
        session.job_poll = 0.05
        result = session.run_batch("labels", labels, BATCH_SCHEMA, validator=never_t2, pack=6,
                                   transport="batch", wait=True, accept="items",
                                   on_exhausted="return")
        session.close()
    assert result.status == "unresolved" and len(result.values) == 5
    assert [(e["task_id"], e["type"]) for e in result.errors] == [("t2", "validation")]
    receipts = Session(ledger=tmp_path / "l.sqlite").ledger.attempts("labels")
    assert [r.kind for r in receipts] == ["initial", "recheck", "repair"]
    assert result.errors[0]["request"] == receipts[2].request_key  # the rest's, not the pack's


def test_values_read_a_page_at_a_time_keep_task_order_across_partial_parts(monkeypatch):
    from batchjson._session import result as result_module

    model = Model(lambda call: {call.tasks[1]["task_id"]: {"verdict": "maybe"}}
                  if call.attempt == 0 and len(call.tasks) > 1 else {})
    session = Session(CallableProvider(model), repairs=1, replays=0)
    tasks = review_tasks(9)
    result = session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=3,
                               accept="items")
    assert result.partial_returns == 3 and sorted(map(len, model.calls)) == [1, 1, 1, 3, 3, 3]
    monkeypatch.setattr(result_module, "PAGE_REQUESTS", 1)  # a part of a request a page
    assert list(result.values) == [t["task_id"] for t in tasks]
