"""Every attempt stays in the account: across runs, ledgers (merge) and killed processes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from batchjson import CallableProvider, Ledger, Reply, Session
from batchjson._errors import LedgerError
from batchjson._providers.pricing import price_for
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def priced(text: str, cost: float | None = 0.001) -> Reply:
    return Reply(text=text, input_tokens=100, output_tokens=40, cached_tokens=10, cost=cost,
                 model="gpt-4o-mini")


def test_two_runs_in_two_ledgers_merged_status_counts_the_attempts_of_both(
        tmp_path: Path) -> None:
    calls = {"n": 0}

    def first_bad(call: Any) -> Reply:
        calls["n"] += 1
        return priced("{cut" if calls["n"] == 1 else items_reply(call))

    a = Session(CallableProvider(first_bad), ledger=tmp_path / "a.sqlite")
    a.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2)  # 3 calls: 1 rejected
    a.close()
    b = Session(CallableProvider(lambda call: priced(items_reply(call), cost=0.002)),
                ledger=tmp_path / "b.sqlite")
    b.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2)  # 2 calls, other run dir
    b.run_batch("other", review_tasks(1, case="gold-pair-090"), LABEL_SCHEMA)  # 1 call
    b.close()

    merged = cli("merge", str(tmp_path / "b.sqlite"), "--ledger", str(tmp_path / "a.sqlite"),
                 "--json", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    assert json.loads(merged.stdout)["added"]["attempts"] == 3
    again = cli("merge", str(tmp_path / "b.sqlite"), "--ledger", str(tmp_path / "a.sqlite"),
                "--json", cwd=tmp_path)
    assert json.loads(again.stdout)["added"]["attempts"] == 0  # idempotent by uid

    status = json.loads(cli("status", "--json", "--ledger", str(tmp_path / "a.sqlite"),
                            cwd=tmp_path).stdout)
    by_name = {e["batch"]: e for e in status["batches"]}
    labels, other, total = by_name["labels"], by_name["other"], status["total"]
    assert (labels["calls"], labels["accepted_returns"], labels["rejected_returns"]) == (5, 4, 1)
    assert labels["usable_results"] == 4 and labels["tasks"] == 4
    assert labels["cost"] == pytest.approx(3 * 0.001 + 2 * 0.002)
    assert labels["cost_per_usable_result"] == pytest.approx(0.007 / 4)
    assert (labels["input_tokens"], labels["output_tokens"], labels["cached_tokens"]) == (
        500, 200, 50)
    assert (other["calls"], other["usable_results"], other["cost"]) == (1, 1, 0.002)
    assert (total["calls"], total["usable_results"]) == (6, 5)
    assert total["cost"] == pytest.approx(0.009)
    assert total["cost_per_usable_result"] == pytest.approx(0.009 / 5)
    assert total["unknown_cost_calls"] == 0 and not total["cost_is_lower_bound"]

    held = Ledger(tmp_path / "a.sqlite")
    assert len(held.checkpoint("other")) == 1  # accepted values came over too
    held.close()
    human = cli("status", "--ledger", str(tmp_path / "a.sqlite"), cwd=tmp_path).stdout
    assert "$0.009000" in human and "e-0" not in human


def test_abandoned_and_in_flight_calls_count_with_a_lower_bound_shown_apart(
        tmp_path: Path) -> None:
    session = Session(CallableProvider(lambda call: priced(items_reply(call))),
                      ledger=tmp_path / "l.sqlite")
    session.run_batch("labels", review_tasks(2), LABEL_SCHEMA, pack=1)
    session.close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    row = db.execute("SELECT batch_id, revision_id, request_key, task_ids FROM attempts "
                     "LIMIT 1").fetchone()
    for status, estimate in (("abandoned", 4000), ("in_flight", None)):
        db.execute("INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                   "status, model, started_at, uid, estimated_input_tokens) VALUES "
                   "(?,?,?,?, 'replay', ?, 'gpt-4o-mini', '2026-01-01', ?, ?)",
                   (*row, status, f"uid-{status}", estimate))
    db.commit()
    tasks_chars = db.execute("SELECT LENGTH(tasks) FROM requests WHERE key = ?",
                             (row[2],)).fetchone()[0]
    db.close()
    summary = Ledger(tmp_path / "l.sqlite").cost_summary("labels")["batches"][0]
    rate = price_for("gpt-4o-mini").input / 1e6
    assert (summary["calls"], summary["abandoned"], summary["in_flight"]) == (4, 1, 1)
    assert summary["unknown_cost_calls"] == 2 and summary["cost_is_lower_bound"]
    assert summary["cost"] == pytest.approx(0.002)
    assert summary["unknown_cost_lower_bound"] == pytest.approx(
        (4000 + tasks_chars // 4) * rate)
    assert summary["cost_per_usable_result"] == pytest.approx(
        (0.002 + summary["unknown_cost_lower_bound"]) / 2)
    human = cli("status", "--ledger", str(tmp_path / "l.sqlite"), cwd=tmp_path).stdout
    assert "2 call(s) have no recorded cost" in human and "an estimated" in human


RUNNER = textwrap.dedent("""
    import asyncio, json, os, sys
    from pathlib import Path
    from batchjson import CallableProvider, Reply, Session

    marker = Path(sys.argv[2])

    async def model(call):
        if call.tasks[0]["task_id"] == "t2" and not os.environ.get("HEALTHY"):
            marker.write_text("sent")
            await asyncio.sleep(3600)  # killed here, mid-call
        items = [{"task_id": t["task_id"], "verdict": "match"} for t in call.tasks]
        return Reply(json.dumps({"items": items}), input_tokens=50, output_tokens=10,
                     cost=0.0001, model="gpt-4o-mini")

    session = Session(CallableProvider(model, model="gpt-4o-mini"), ledger=sys.argv[1],
                      concurrency=1)
    tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(4)]
    schema = {"type": "object", "properties": {"verdict": {"type": "string"}}}
    result = session.run_batch("labels", tasks, schema)
    print(result.status, result.calls)
""")


def _kill_mid_batch(tmp_path: Path) -> Path:
    script, marker, ledger = tmp_path / "run.py", tmp_path / "sent", tmp_path / "l.sqlite"
    script.write_text(RUNNER)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("HEALTHY", None)
    proc = subprocess.Popen([sys.executable, str(script), str(ledger), str(marker)], env=env)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "runner never sent t2"
        time.sleep(0.02)  # polling for the marker, with a deadline
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    rerun = subprocess.run([sys.executable, str(script), str(ledger), str(marker)],
                           env={**env, "HEALTHY": "1"}, capture_output=True, text=True,
                           timeout=120)
    assert rerun.returncode == 0 and rerun.stdout.split()[0] == "resolved", rerun.stderr
    return ledger


def test_a_killed_run_stays_in_the_account_with_a_lower_bound_and_a_rerun_completes(
        tmp_path: Path) -> None:
    ledger = _kill_mid_batch(tmp_path)
    status = json.loads(cli("status", "labels", "--json", "--ledger", str(ledger),
                            cwd=tmp_path).stdout)
    (labels,) = status["batches"]
    assert labels["usable_results"] == 4 and status["unresolved_requests"] == 0
    # the killed call counts (and the next one, if its receipt was opened ahead of the kill)
    assert labels["accepted_returns"] == 4 and 1 <= labels["unknown_cost_calls"] <= 2
    assert labels["calls"] == 4 + labels["unknown_cost_calls"]
    assert labels["unknown_cost_lower_bound"] > 0 and labels["cost_is_lower_bound"]
    assert labels["cost_per_usable_result"] > labels["cost"] / 4


def test_a_killed_run_leaves_abandoned_calls_that_status_counts(tmp_path: Path) -> None:
    ledger = _kill_mid_batch(tmp_path)
    status = json.loads(cli("status", "--json", "--ledger", str(ledger), cwd=tmp_path).stdout)
    total = status["total"]
    assert total["abandoned"] >= 1 and total["in_flight"] == 0
    assert total["unknown_cost_lower_bound"] > 0


def test_merging_a_batch_of_the_same_name_with_other_content_keeps_both_revisions(
        tmp_path: Path) -> None:
    ours = Session(CallableProvider(lambda call: priced(items_reply(call))),
                   ledger=tmp_path / "ours.sqlite")
    ours.run_batch("labels", review_tasks(2), LABEL_SCHEMA)
    theirs = Session(CallableProvider(lambda call: priced(items_reply(call))),
                     ledger=tmp_path / "theirs.sqlite")
    theirs.run_batch("labels", review_tasks(3, case="gold-pair-090"), LABEL_SCHEMA)
    theirs.close()
    report = ours.ledger.merge(tmp_path / "theirs.sqlite")
    assert report["added"]["revisions"] == 1 and report["added"]["attempts"] == 3
    numbers = [r.number for r in ours.ledger.revisions("labels")]
    assert numbers == [1, 2]  # their revision 1 is numbered after ours
    assert len(ours.ledger.checkpoint("labels")) == 2  # our current revision stays current
    assert ours.ledger.cost_summary("labels")["total"]["calls"] == 5
    with pytest.raises(LedgerError, match="is this ledger"):
        ours.ledger.merge(tmp_path / "ours.sqlite")
    refused = cli("merge", str(tmp_path / "ours.sqlite"), "--ledger",
                  str(tmp_path / "ours.sqlite"), cwd=tmp_path)
    assert refused.returncode == 3 and "is this ledger" in refused.stderr


def test_a_merged_unfinished_revision_beside_our_batch_is_not_owed_work(tmp_path: Path) -> None:
    ours = Session(CallableProvider(lambda call: priced(items_reply(call))),
                   ledger=tmp_path / "ours.sqlite")
    assert ours.run_batch("labels", review_tasks(4), LABEL_SCHEMA, pack=2).resolved
    theirs = Session(CallableProvider(lambda call: priced("{broken")),
                     ledger=tmp_path / "theirs.sqlite", repairs=0, replays=0)
    theirs.run_batch("labels", review_tasks(6), LABEL_SCHEMA, pack=3, on_exhausted="return")
    theirs.close()
    ours.ledger.merge(tmp_path / "theirs.sqlite")
    assert ours.evidence.minimum_exact_retry_calls == 0  # their unfinished run is not ours
    status = json.loads(cli("status", "--json", "--ledger", str(tmp_path / "ours.sqlite"),
                            cwd=tmp_path).stdout)
    assert status["unresolved_requests"] == 0
    assert status["total"]["calls"] == 4 and status["total"]["rejected_returns"] == 2
    (merged,) = status["superseded"]
    assert merged["revision"] == 2 and merged["superseded_by"] == 1
    assert "merged from theirs.sqlite" in merged["reason"]
    assert len(ours.ledger.checkpoint("labels")) == 4


def test_import_merge_and_merge_back_count_every_attempt_once(tmp_path: Path) -> None:
    tasks = review_tasks(4)
    items = [{"task_id": t["task_id"], "case_id": t["case_id"],
              "candidate_id": t["candidate_id"], "verdict": "match"} for t in tasks]
    swapped = [dict(i) for i in items]
    swapped[0]["case_id"] = "gold-pair-079"
    line = {"batch": "old", "tasks": tasks, "status": "ok", "schema": LABEL_SCHEMA,
            "identity": ["task_id", "case_id", "candidate_id"], "input_tokens": 100,
            "output_tokens": 50, "cost": 0.25}
    history = tmp_path / "old.jsonl"
    history.write_text(json.dumps({**line, "raw": json.dumps({"items": swapped})}) + "\n"
                       + json.dumps({**line, "raw": json.dumps({"items": items})}) + "\n")
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    live = Session(CallableProvider(lambda call: priced(items_reply(call))), ledger=b)
    live.run_batch("labels", review_tasks(2, case="gold-pair-090"), LABEL_SCHEMA)
    live.close()
    assert cli("import", str(history), "--ledger", str(a), cwd=tmp_path).returncode == 1
    for source, target in ((a, b), (b, a), (a, b), (b, a)):
        done = cli("merge", str(source), "--ledger", str(target), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    again = json.loads(cli("import", str(history), "--ledger", str(b), "--json",
                           cwd=tmp_path).stdout)
    assert again["skipped"] == 2  # imported once, in whichever ledger it came through
    totals = [json.loads(cli("status", "--json", "--ledger", str(p), cwd=tmp_path).stdout)
              for p in (a, b)]
    for status in totals:
        assert status["total"]["calls"] == 4 and status["total"]["imported"] == 2
        assert status["total"]["cost"] == pytest.approx(0.502)
        assert status["total"]["usable_results"] == 6
        assert (status["total"]["input_tokens"], status["total"]["output_tokens"]) == (400, 180)
    for path in (a, b):
        db = sqlite3.connect(path)
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT uid) FROM attempts").fetchone() == (4, 4)
        assert db.execute("SELECT COUNT(*) FROM imports").fetchone()[0] == 2
        db.close()


def test_a_call_merged_while_in_flight_takes_its_outcome_when_merged_again(
        tmp_path: Path) -> None:
    there = tmp_path / "there.sqlite"
    run = Session(CallableProvider(lambda call: priced(items_reply(call))), ledger=there)
    assert run.run_batch("labels", review_tasks(2), LABEL_SCHEMA, pack=2).resolved
    run.close()
    early = tmp_path / "early.sqlite"  # the same ledger as it was while the call was out
    db = sqlite3.connect(there)
    db.execute("VACUUM INTO ?", (str(early),))
    db.close()
    db = sqlite3.connect(early)
    db.execute("DELETE FROM checkpoint")
    db.execute("UPDATE attempts SET status = 'in_flight', raw = NULL, input_tokens = NULL, "
               "output_tokens = NULL, cached_tokens = NULL, cost = NULL, finished_at = NULL")
    db.commit()
    db.close()
    here = Ledger(tmp_path / "here.sqlite")
    here.merge(early)
    assert here.cost_summary()["total"]["in_flight"] == 1
    report = here.merge(there)
    assert report["added"]["attempts"] == 0 and report["added"]["attempts_completed"] == 1
    total = here.cost_summary()["total"]
    assert (total["calls"], total["in_flight"], total["accepted_returns"]) == (1, 0, 1)
    assert total["cost"] == pytest.approx(0.001) and not total["cost_is_lower_bound"]
    assert len(here.checkpoint("labels")) == 2
    assert here.merge(there)["added"]["attempts_completed"] == 0  # idempotent


def test_status_and_evidence_agree_on_what_is_a_call_and_merge_keeps_each_calls_floor(
        tmp_path: Path) -> None:
    """One rule for the account: a receipt opened but never sent is no call, and a killed call
    is priced at least at the floor recorded when it was sent, here and after a merge."""
    from batchjson import CallableProvider, Ledger, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    ours = tmp_path / "a.sqlite"
    session = Session(CallableProvider(items_reply), ledger=ours)
    session.run_batch("labels", review_tasks(3), LABEL_SCHEMA)
    session.close()
    with sqlite3.connect(ours) as db:
        first, second = [r[0] for r in db.execute("SELECT id FROM attempts ORDER BY id LIMIT 2")]
        db.execute("UPDATE attempts SET status = 'cancelled', sent_at = NULL WHERE id = ?",
                   (first,))  # opened, never sent
        db.execute("UPDATE attempts SET status = 'abandoned', cost = NULL, cost_floor = 0.25 "
                   "WHERE id = ?", (second,))  # killed in flight, at least $0.25
    for path in (ours, tmp_path / "b.sqlite"):
        ledger = Ledger(path)
        if path != ours:
            ledger.merge(ours)
        spend, total = ledger.spend("labels"), ledger.cost_summary("labels")["total"]
        assert spend["calls"] == total["calls"] == 2
        assert spend["cost_lower_bound_unknown"] == total["unknown_cost_lower_bound"] == 0.25
        ledger.close()


def test_spend_and_cost_summary_agree_on_every_kind_of_call_and_cost(tmp_path: Path) -> None:
    """Ledger.spend() (Evidence.summary) and cost_summary() (status) are one account: a call
    with no recorded cost is unknown whatever became of it, priced at its floor (recorded when
    sent, else its prompt at the model's input price), and a recheck or unsent receipt is no
    call, in both, per batch and in total."""
    path = tmp_path / "l.sqlite"
    for batch in ("labels", "other"):
        session = Session(CallableProvider(lambda call: priced(items_reply(call))), ledger=path)
        session.run_batch(batch, review_tasks(6), LABEL_SCHEMA, pack=1)
        session.close()
    rate = price_for("gpt-4o-mini").input / 1e6
    with sqlite3.connect(path) as db:
        ids = [r[0] for r in db.execute("SELECT id FROM attempts ORDER BY id LIMIT 6")]
        for sql, attempt in (
                ("status = 'cancelled', sent_at = NULL, cost = NULL", ids[0]),  # never sent
                ("status = 'abandoned', cost = NULL, cost_floor = 0.25", ids[1]),  # killed
                ("status = 'provider_error', cost = NULL, cost_floor = 0.125", ids[2]),  # no usage
                ("cost = NULL, cost_floor = NULL, input_tokens = 1000, cached_tokens = 0",
                 ids[3]),  # imported without a cost: its prompt at the input price
                ("status = 'rejected', cost = NULL, cost_floor = NULL, model = 'no-such-model'",
                 ids[4])):  # a model with no price
            db.execute(f"UPDATE attempts SET {sql} WHERE id = ?", (attempt,))  # noqa: S608
        db.execute("INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                   "status, started_at, uid, cost, input_tokens, output_tokens) SELECT batch_id, "
                   "revision_id, request_key, task_ids, 'recheck', 'accepted', started_at, "
                   "'uid-recheck', 0, 0, 0 FROM attempts WHERE id = ?", (ids[5],))
    ledger = Ledger(path)
    summary = ledger.cost_summary()
    for name, entry in [*((e["batch"], e) for e in summary["batches"]),
                        (None, summary["total"])]:
        spend = ledger.spend(name)
        assert spend["calls"] == entry["calls"]
        assert spend["accepted"] == entry["accepted_returns"]
        assert spend["rejected"] == entry["rejected_returns"]
        assert spend["provider_errors"] == entry["provider_errors"]
        assert spend["abandoned_calls"] == entry["abandoned"]
        assert spend["unknown_cost_calls"] == entry["unknown_cost_calls"]
        assert spend["unpriced_unknown_calls"] == entry["unpriced_calls"]
        assert (spend["cost"] or 0.0) == pytest.approx(entry["cost"])  # None: nothing known
        assert spend["cost_lower_bound_unknown"] == pytest.approx(
            entry["unknown_cost_lower_bound"])
        assert spend["cost_lower_bound"] == pytest.approx(entry["cost_at_least"])
    labels = ledger.spend("labels")
    assert (labels["calls"], labels["unsent"], labels["accepted"]) == (5, 1, 2)
    assert (labels["unknown_cost_calls"], labels["unpriced_unknown_calls"]) == (4, 1)
    assert labels["cost_lower_bound_unknown"] == pytest.approx(0.25 + 0.125 + 1000 * rate)
    assert ledger.cost_summary("labels")["total"]["rechecks"] == 1
    evidence = Session(CallableProvider(items_reply), ledger=path).evidence.summary("labels")
    assert evidence["cost_per_usable_result_is_lower_bound"]
    assert evidence["cost_lower_bound"] == pytest.approx(labels["cost_lower_bound"])
    ledger.close()


def test_a_batch_with_no_known_cost_has_no_cost_per_usable_result(
        tmp_path: Path, ledger_at) -> None:
    """A model with no price and no reported cost: the account says unknown, not $0."""
    session = Session(CallableProvider(lambda call: Reply(text=items_reply(call)),
                                       source="no-price"), ledger=ledger_at("l"))
    assert session.run_batch("r", review_tasks(2), LABEL_SCHEMA).status == "resolved"
    (entry,) = [e for e in session.ledger.cost_summary()["batches"] if e["batch"] == "r"]
    assert entry["usable_results"] == 2 and entry["cost_is_lower_bound"]
    assert entry["cost_per_usable_result"] is None
    session.close()


def test_status_and_evidence_give_one_cost_per_usable_result_for_every_kind_of_batch(
        tmp_path: Path, ledger_at) -> None:
    """Priced, unpriced, re-judged for free and mixed: the two accounts never disagree, an
    unpriced batch is unknown (None), and one answered only by free rechecks cost $0."""
    path = ledger_at("l")
    unpriced = Session(CallableProvider(lambda call: Reply(text=items_reply(call)),
                                        source="no-price"), ledger=path)
    def any_label(item, task):  # only how returns are judged changes: stored ones re-judged
        return None

    unpriced.run_batch("unpriced", review_tasks(2), LABEL_SCHEMA)
    assert unpriced.run_batch("unpriced", review_tasks(2), LABEL_SCHEMA,
                              validator=any_label).rechecked == 2
    unpriced.close()
    paid = Session(CallableProvider(lambda call: priced(items_reply(call)), source="paid"),
                   ledger=path)
    paid.run_batch("paid", review_tasks(2), LABEL_SCHEMA)
    rechecked = paid.run_batch("paid", review_tasks(2), LABEL_SCHEMA, validator=any_label)
    assert rechecked.calls == 0 and rechecked.rechecked == 2  # re-judged, not paid again
    summary = {e["batch"]: e for e in paid.ledger.cost_summary()["batches"]}
    for batch in ("unpriced", "paid"):
        assert (summary[batch]["cost_per_usable_result"]
                == paid.evidence.summary(batch)["cost_per_usable_result"]), batch
    assert summary["unpriced"]["cost_per_usable_result"] is None
    assert summary["paid"]["cost_per_usable_result"] == pytest.approx(0.002 / 2)
    assert paid.ledger.spend("paid")["cost"] == pytest.approx(0.002)  # rechecks add nothing
    paid.close()
