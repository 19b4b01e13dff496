"""The batch transport through the faces: ``%%batch_json --transport batch``, ``%config
BatchJson.transport``, and the RLM bindings that refuse it (their contract has no pending
result)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from batchjson import InvalidBatch, RunSpec
from batchjson.testing import LoopbackServer
from tests.helpers import cell_ok, openai

pytest.importorskip("IPython")

BODY = """
tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(3)]
schema = {"type": "object", "properties": {"task_id": {"type": "string"},
                                           "verdict": {"type": "string"}},
          "required": ["task_id", "verdict"]}
"""


ok = cell_ok  # a cell that must succeed


@pytest.fixture
def srv():
    with LoopbackServer() as server:
        server.batches.delay = 0.1
        yield server


@pytest.mark.parametrize("how", ["option", "config"])
def test_a_batch_cell_returns_pending_and_rerunning_it_collects(ip, srv, how):
    ok(ip, "%load_ext batchjson")
    ip.user_ns["model"] = openai(srv)
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, "%config BatchJson.ledger = 'l.sqlite'")
    line = "%%batch_json labels --transport batch"
    if how == "config":
        ok(ip, "%config BatchJson.transport = 'batch'")
        line = "%%batch_json labels"
    ok(ip, f"{line}\n{BODY}")  # a pending result is no error
    pending = ip.user_ns["labels"]
    assert pending.status == "pending" and pending.jobs[0]["requests"] == 3
    time.sleep(0.3)
    ok(ip, f"{line}\n{BODY}")
    assert ip.user_ns["labels"].resolved and srv.batches.created == 1


def test_the_wait_option_blocks_until_the_job_ends(ip, srv):
    ok(ip, "%load_ext batchjson")
    ip.user_ns["model"] = openai(srv)
    ok(ip, "%config BatchJson.provider = model")
    ip.user_ns["batch_session"].job_poll = 0.05
    ok(ip, f"%%batch_json labels --transport batch --wait\n{BODY}")
    assert ip.user_ns["labels"].resolved


def test_a_bad_transport_is_refused_by_config_and_option(ip, capsys):
    ok(ip, "%load_ext batchjson")
    ip.run_cell("%config BatchJson.transport = 'carrier-pigeon'")
    assert ip.user_ns["batch_session"] is not None
    from batchjson._ipython.magics import ATTRIBUTE

    assert getattr(ip, ATTRIBUTE).magics.transport == "live"
    result = ip.run_cell(f"%%batch_json labels --transport pigeon\n{BODY}")
    assert not result.success


@pytest.mark.parametrize("args", ["index", "droste"])
def test_droste_and_rlm_contract_refuses_the_batch_transport(args):
    """The llm_batch_json helpers the droste and rlm bindings hand out build their runs with
    validator_args "index" or "droste": a pending result has no place in that contract."""
    with pytest.raises(InvalidBatch, match="no pending result"):
        RunSpec(name="b", tasks=[], schema={}, mode="value", validator_args=args,
                transport="batch")


def test_batch_status_names_the_open_jobs_and_how_to_collect_them(ip, srv):
    ok(ip, "%load_ext batchjson")
    ip.user_ns["model"] = openai(srv)
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, f"%%batch_json labels --transport batch\n{BODY}")
    view = ok(ip, "%batch_status labels")
    job = ip.user_ns["labels"].jobs[0]["provider_job_id"]
    assert f"job 1 of 'labels' ({job}, open, 3 request(s))" in repr(view)
    assert "re-run their cells to collect" in repr(view)


VALIDATED = BODY + """
def has_verdict(item, task):
    assert item["verdict"], "an empty verdict"
"""


def test_batch_status_collects_an_ended_job_with_the_kernels_validator(ip, srv):
    ok(ip, "%load_ext batchjson")
    ip.user_ns["model"] = openai(srv)
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, f"%%batch_json labels --transport batch --validator has_verdict\n{VALIDATED}")
    assert ip.user_ns["labels"].status == "pending"
    time.sleep(0.3)
    view = ok(ip, "%batch_status labels")
    assert "job 1 of 'labels'" in repr(view) and "ended: collected 3 line(s), 3 accepted" in \
        repr(view) and "re-run its cell for the values" in repr(view)
    assert view["unresolved_requests"] == 0 and not view["jobs"]
    ok(ip, f"%%batch_json labels --transport batch --validator has_verdict\n{VALIDATED}")
    assert ip.user_ns["labels"].resolved and srv.batches.created == 1
    assert srv.batches.lines_answered.total() == 3  # nothing asked again


def pending_elsewhere(srv: LoopbackServer, path: Any, **spec: Any) -> None:
    """A batch job of two tasks submitted by another session (another kernel), then ended."""
    from batchjson import Session

    other = Session(openai(srv), ledger=path)
    tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(2)]
    schema = {"type": "object", "properties": {"task_id": {"type": "string"},
                                               "verdict": {"type": "string"}}}
    assert other.run(RunSpec(name="labels", tasks=tasks, schema=schema, transport="batch",
                             on_exhausted="return", **spec)).status == "pending"
    other.close()
    time.sleep(0.3)


def status_here(ip: Any, srv: LoopbackServer, path: Any) -> Any:
    ok(ip, "%load_ext batchjson")
    ip.user_ns["model"] = openai(srv)
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, f"%config BatchJson.ledger = '{path}'")
    return ok(ip, "%batch_status labels")


def test_batch_status_in_a_kernel_without_the_validator_says_to_rerun_the_cell(ip, srv,
                                                                             tmp_path):
    def has_verdict(item: Any, task: Any) -> None:
        assert item["verdict"]

    pending_elsewhere(srv, tmp_path / "l.sqlite", validator=has_verdict,
                      validator_name="has_verdict")
    view = status_here(ip, srv, tmp_path / "l.sqlite")
    assert ("was not collected here: its validator 'has_verdict' (the version it ran with) is "
            "not registered in this kernel; re-run its cell to collect it") in repr(view)
    assert len(view["jobs"]) == 1  # still open, for the cell to collect


def test_batch_status_collects_a_job_without_a_validator_from_the_schema_on_record(
        ip, srv, tmp_path):
    pending_elsewhere(srv, tmp_path / "l.sqlite")
    view = status_here(ip, srv, tmp_path / "l.sqlite")
    assert "ended: collected 2 line(s), 2 accepted" in repr(view)
    assert view["unresolved_requests"] == 0


def test_a_cell_whose_validator_is_edited_while_its_job_runs_pays_for_its_prompts_once(ip, srv):
    """The cell's inline validator is edited and the cell run again while its job is pending:
    the same prompts are not submitted again; once the job ends, re-running the cell collects
    it by the first validator and judges its answers by the edited one, free."""
    ok(ip, "%load_ext batchjson")
    ip.user_ns["model"] = openai(srv)
    ok(ip, "%config BatchJson.provider = model")
    line = "%%batch_json labels --transport batch --validator has_verdict"
    ok(ip, f"{line}\n{VALIDATED}")
    assert ip.user_ns["labels"].status == "pending"
    edited = VALIDATED.replace('"an empty verdict"', '"say what the verdict is"')
    ok(ip, f"{line}\n{edited}")  # run again at once: the first job still holds the prompts
    assert ip.user_ns["labels"].status == "pending" and srv.batches.created == 1
    time.sleep(0.3)
    ok(ip, f"{line}\n{edited}")
    assert ip.user_ns["labels"].resolved and len(ip.user_ns["labels"].values) == 3
    assert srv.batches.created == 1 and srv.batches.lines_answered.total() == 3
