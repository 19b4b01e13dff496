"""A result's errors at scale: built one at a time when read, counted without being built, and
shown a few failed requests at a time (the rest counted), whatever the number of failures."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

both_stores = pytest.mark.parametrize("ledger_at", ["sqlite", "postgres"], indirect=True)


def every_third_request_rejected(call) -> str:
    """Requests 0, 3, 6, ... (of three tasks) get an item with a verdict outside the enum."""
    first = int(call.tasks[0]["candidate_id"].rsplit("-", 1)[1]) - 127
    if (first // len(call.tasks)) % 3:
        return items_reply(call)
    return items_reply(call, **{call.tasks[0]["task_id"]: {"verdict": "maybe"}})


def crashes_on(task_id: str):
    """A validator with a bug that only one task reaches (a crash stops the run)."""
    def check(item, task):
        if task["task_id"] == task_id:
            raise RuntimeError("validator bug")
        return True

    return check


@both_stores
def test_errors_read_as_the_list_they_stand_for_without_being_one(ledger_at):
    tasks = review_tasks(60)
    session = Session(CallableProvider(every_third_request_rejected), ledger=ledger_at(),
                      concurrency=1)
    result = session.run_batch("b", tasks, LABEL_SCHEMA, pack=3, repairs=0, replays=0,
                               validator=crashes_on(tasks[40]["task_id"]),
                               on_exhausted="return")
    errors = result.errors
    copied = list(errors)
    assert not isinstance(errors, list) and len(errors) == len(copied) and errors == copied
    assert errors[0] == copied[0] and errors[-1] == copied[-1] and errors[2:5] == copied[2:5]
    kinds = [e["type"] for e in copied]
    # requests of 3 tasks, every third rejected (one own error, two bystanders); then the
    # validator crashes on request 13 and the other 18 tasks are never attempted, in order
    assert kinds.count("schema") == 5 and kinds.count("validator_error") == 1
    assert kinds.count("batch_rejected") == 12 and kinds.count("not_attempted") == 18
    assert [e["task_id"] for e in copied if e["type"] == "not_attempted"] == [
        t["task_id"] for t in tasks[42:]]
    assert all("raw" not in e for e in copied) and len(result.raws) == 6
    assert {e["task_id"] for e in copied} == set(result.unresolved)
    assert len(result.values) + len(result.unresolved) == 60


@both_stores
def test_a_failure_report_shows_ten_failed_requests_and_counts_the_rest(ledger_at):
    tasks = review_tasks(90)
    session = Session(CallableProvider(every_third_request_rejected), ledger=ledger_at())
    result = session.run_batch("b", tasks, LABEL_SCHEMA, pack=3, repairs=0, replays=0,
                               on_exhausted="return")
    assert len(result.failures) == 10  # every third of 30 requests
    report = result.failure_report(limit=4)
    assert report.count("  request of 3 tasks") == 4
    assert "... and 6 more failed request(s)" in report
    page = result._repr_html_()
    assert "10 failed request(s)" in page and page.count("<li><code>") == 10
    assert "2 other task(s) of this request were fine" in report


def test_a_run_failing_200000_tasks_reports_them_in_bounded_memory(tmp_path):
    """A ceiling far above what it takes, never a timing: every task rejected, the result's
    errors counted, iterated and shown as a notebook shows them (ten requests and a count).
    About 250 MB now; errors as a list of dicts grouped whole took several times more."""
    script = textwrap.dedent("""
        import json, resource, sys
        from batchjson import CallableProvider, Session
        def wrong(call):
            return json.dumps({"items": [{"task_id": t["task_id"], "label": 7}
                                         for t in call.tasks]})
        tasks = ({"task_id": f"t{i:07d}", "prompt": f"label {i}"} for i in range(200_000))
        schema = {"type": "object", "properties": {"label": {"type": "string"}},
                  "required": ["label"]}
        result = Session(CallableProvider(wrong), ledger=sys.argv[1]).run_batch(
            "big", tasks, schema, pack=50, identity=["task_id"], repairs=0, replays=0,
            on_exhausted="return")
        shown = result._repr_html_()
        report = result.failure_report()
        count = sum(1 for _ in result.errors)
        print(json.dumps({"errors": len(result.errors), "iterated": count,
                          "more": "and 3990 more failed request(s)" in report,
                          "shown": shown.count("<li><code>"),
                          "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "big.sqlite")],
                         capture_output=True, text=True, check=True, timeout=300)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["errors"] == seen["iterated"] == 200_000 and seen["more"], seen
    assert seen["shown"] == 10
    assert seen["peak_mb"] < 900, seen
