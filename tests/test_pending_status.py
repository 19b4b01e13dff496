"""A request an unfinished provider batch job holds is pending, not failed: amber in
``%batch_status``, said as pending by ``batchjson status`` with when its job was submitted, the
provider's window, the provider's own progress and an estimate of its end, its cost estimated at
the batch price; a provider that cannot be reached leaves the progress unknown and never fails
the command."""

from __future__ import annotations

import io
import json
import re
import time
from contextlib import closing
from datetime import datetime, timedelta
from typing import Any

import pytest

from batchjson import Ledger, OpenAIProvider, RunSpec, Session
from batchjson._cli import main
from batchjson._providers.openai import OpenAIBatches
from batchjson._session.accounts import floor_price
from batchjson.core import pending_jobs
from batchjson.testing import LoopbackServer
from tests.helpers import openai

TASKS = [{"task_id": f"t{i}", "prompt": f"question {i} " * 50} for i in range(3)]
SCHEMA = {"type": "object", "properties": {"task_id": {"type": "string"},
                                           "verdict": {"type": "string"}}}
SUBMITTED = re.compile(r"submitted \d{4}-\d\d-\d\d \d\d:\d\dZ")


@pytest.fixture
def srv():
    with LoopbackServer() as server:
        server.batches.delay = 60  # the job stays open for the test
        yield server


def submit(srv: LoopbackServer, path: Any) -> None:
    session = Session(openai(srv), ledger=path)
    assert session.run(RunSpec(name="labels", tasks=TASKS, schema=SCHEMA, transport="batch",
                               on_exhausted="return")).status == "pending"
    session.close()


def status(path: Any, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["status", "--ledger", str(path), *extra], out)
    return code, out.getvalue()


def test_status_says_pending_with_submitted_time_progress_and_a_batch_price_estimate(
        srv, tmp_path):
    submit(srv, tmp_path / "l.sqlite")
    code, text = status(tmp_path / "l.sqlite")
    assert code == 0
    flat = " ".join(text.split())
    assert "pending: 3 call(s) in 1 unfinished batch job(s), an estimated $" in flat
    assert "at the batch price" in flat and SUBMITTED.search(flat)
    assert "0/3 ended at the provider" in flat
    assert "when the provider's 24 h window closes" in flat
    assert "killed" not in text and "abandoned," not in text and "no recorded cost" not in text
    assert re.search(r"next:\n  \S*batchjson jobs --ledger \S+ +the batch jobs still pending",
                     text)


def test_the_pending_estimate_is_the_prompts_at_the_batch_price_not_the_live_one(srv, tmp_path):
    submit(srv, tmp_path / "l.sqlite")
    with closing(Ledger(tmp_path / "l.sqlite")) as ledger:
        total = ledger.cost_summary()["total"]
        spend = ledger.spend()
    assert total["pending"] == 3 and total["unknown_cost_calls"] == 0
    assert total["in_flight"] == 0 and spend["in_flight_calls"] == 0
    assert spend["pending_calls"] == 3 and spend["pending_cost"] == total["pending_cost"]
    live = floor_price("gpt-4o-mini", 1_000_000, 0)
    batch = floor_price("gpt-4o-mini", 1_000_000, 0, batch=True)
    assert batch == pytest.approx(live / 2)  # gpt-4o-mini's batch jobs bill half
    tokens = total["pending_cost"] / batch * 1_000_000
    assert 3 * 100 < tokens < 3 * 1000  # the three prompts' own size, not a worst case
    code, data = status(tmp_path / "l.sqlite", "--json")
    assert json.loads(data)["jobs"][0]["progress"] == {"ended": 0, "total": 3}


def test_an_unreachable_provider_leaves_progress_unknown_and_never_fails_status(tmp_path):
    with LoopbackServer() as srv:
        srv.batches.delay = 60
        submit(srv, tmp_path / "l.sqlite")
    began = time.monotonic()
    code, text = status(tmp_path / "l.sqlite")
    assert code == 0 and time.monotonic() - began < 30
    flat = " ".join(text.split())
    assert "progress unknown (its provider could not be asked)" in flat
    assert "pending: 3 call(s)" in flat and "window closes" in flat


def test_a_job_that_has_come_partway_is_expected_to_end_at_its_rate(srv, tmp_path, monkeypatch):
    submit(srv, tmp_path / "l.sqlite")
    monkeypatch.setattr(OpenAIBatches, "progress", lambda self, batch: (2, 3))
    with closing(Ledger(tmp_path / "l.sqlite")) as ledger:
        [job] = pending_jobs(ledger)
    assert job["progress"] == {"ended": 2, "total": 3} and job["ends_from"] == "rate"
    elapsed = datetime.fromisoformat(job["ends_by"]) - datetime.fromisoformat(job["submitted_at"])
    assert elapsed < timedelta(minutes=1)  # half as long again as it took so far, not 24 h


def test_batch_status_shows_a_pending_job_amber_with_its_submitted_time_never_killed(
        ip, srv, tmp_path):
    assert ip.run_cell("%load_ext batchjson").success
    ip.user_ns["model"] = openai(srv)
    for line in ("%config BatchJson.provider = model",
                 f"%config BatchJson.ledger = '{tmp_path / 'l.sqlite'}'"):
        assert ip.run_cell(line).success
    body = (f"tasks = {TASKS!r}\nschema = {SCHEMA!r}")
    assert ip.run_cell(f"%%batch_json labels --transport batch\n{body}").success
    view = ip.run_cell("%batch_status labels").result
    page, text = view._repr_html_(), repr(view)
    assert "color:#9a6700" in page and "#cf222e" not in page  # amber, not red
    assert "3 call(s) in 1 unfinished batch job(s), an estimated $" in text
    assert "at the batch price" in text and SUBMITTED.search(text)
    assert "`batchjson jobs` lists them" in text
    assert "killed" not in text + page and "abandoned," not in text


@pytest.mark.parametrize("line, said", [
    ({"custom_id": "x", "response": None, "error": None}, "no response"),
    ({"custom_id": "x", "response": {"status_code": 302, "body": {}}, "error": None},
     "no response"),
    ({"custom_id": "x", "response": None, "error": {"code": "expired", "message": "ran out"}},
     "expired ran out"),
])
def test_an_openai_batch_line_without_an_answer_says_why_not_none(line, said):
    lines = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1",
                           api_key="sk-test").batch_api()
    error = lines.answer(line)
    assert str(error) == f"openai batch line failed: {said}"
