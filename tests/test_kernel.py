"""A real Jupyter kernel: re-running a failing cell converges, a restart resumes from the ledger,
and an interrupt leaves no receipt in flight."""

from __future__ import annotations

import ast
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.kernel

SRC = Path(__file__).resolve().parents[1] / "src"

SETUP = """
%load_ext batchjson
from batchjson import FaultPlan, SimulatedModel
model = SimulatedModel(
    answer=lambda task: {"verdict": "match"},
    faults=FaultPlan(identity_swap=0.3,
                     script={0: "identity_swap", 1: "malformed_json", 2: "missing_item"},
                     clean_after=3))
%config BatchJson.provider = model
%config BatchJson.repairs = 0
%config BatchJson.replays = 0
"""

CELL = """%%batch_json labels --validator check_verdict --pack 2
tasks = [{"task_id": f"t{i}", "prompt": f"Is item {i} a match?"} for i in range(6)]
schema = {"type": "object", "properties": {"verdict": {"type": "string"}},
          "required": ["verdict"]}
ALLOWED = ("match", "no_match")
def check_verdict(item, task):
    if item["verdict"] not in ALLOWED:
        raise ValueError(f"verdict must be one of {ALLOWED}")
"""

SLOW_SETUP = """
%load_ext batchjson
from batchjson import SimulatedModel
model = SimulatedModel(answer=lambda task: {"verdict": "match"}, latency=0.5)
%config BatchJson.provider = model
%config BatchJson.concurrency = 2
"""

SLOW_CELL = """%%batch_json slow
tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(16)]
schema = {"type": "object", "properties": {"verdict": {"type": "string"}}}
"""


@dataclass
class Run:
    """What one execute request produced on iopub, and its reply."""

    status: str = ""
    stdout: str = ""
    stderr: str = ""
    data: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] = field(default_factory=dict)

    def hook(self, msg: dict[str, Any]) -> None:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            if content["name"] == "stdout":
                self.stdout += content["text"]
            else:
                self.stderr += content["text"]
        elif kind in ("display_data", "execute_result"):
            self.data.append(content["data"])
        elif kind == "error":
            self.error = content


class Kernel:
    def __init__(self, km: Any, kc: Any) -> None:
        self.km = km
        self.kc = kc

    def run(self, code: str, timeout: float = 30) -> Run:
        run = Run()
        reply = self.kc.execute_interactive(code, output_hook=run.hook, timeout=timeout)
        run.status = reply["content"]["status"]
        return run

    def ok(self, code: str) -> Run:
        run = self.run(code)
        assert run.status == "ok", (run.error, run.stderr)
        return run

    def value(self, expr: str) -> Any:
        reply = self.kc.execute_interactive("", user_expressions={"v": expr}, timeout=30)
        result = reply["content"]["user_expressions"]["v"]
        assert result["status"] == "ok", result
        return ast.literal_eval(result["data"]["text/plain"])

    def restart(self) -> None:
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=60)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    from jupyter_client.manager import KernelManager

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    env.pop("BATCHJSON_PROVIDER", None)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=env)
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        yield Kernel(km, kc)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_rerunning_a_failing_cell_converges_and_restart_resumes(kernel: Kernel,
                                                                tmp_path: Path) -> None:
    kernel.ok(SETUP)
    ids, statuses = set(), []
    for _ in range(7):
        run = kernel.run(CELL)
        statuses.append(run.status)
        ids.add(kernel.value("id(check_verdict)"))
        unresolved = kernel.value("batch_session.evidence.unresolved_batches")
        assert unresolved <= 1
        assert kernel.value("labels.status") == ("resolved" if run.status == "ok" else
                                                 "unresolved")
        if run.status == "ok":
            assert unresolved == 0
            assert any("text/html" in d and "labels" in d["text/html"] for d in run.data)
        else:
            assert run.error["ename"] == "BatchUnresolved"
            assert "is unresolved" in run.error["evalue"]
            assert len(run.error["traceback"]) < 15  # the short report, not a traceback
            assert not any("site-packages" in line for line in run.error["traceback"])
    assert statuses == ["error"] * 3 + ["ok"] * 4
    assert len(ids) == 1
    assert kernel.value("len(batch_session.validators.versions('check_verdict'))") == 1
    assert kernel.value("labels.calls") == 0
    assert kernel.value("batch_session.evidence.summary()['calls']") == 12  # 3 requests x 4
    assert (tmp_path / ".batchjson" / "ledger.sqlite").exists()

    kernel.restart()
    kernel.ok(SETUP)
    assert kernel.value("batch_session.provider is model") is True  # through later %config
    refused = kernel.ok("%config BatchJson.concurrency = 0")  # IPython's %config: said, runs on
    assert "'concurrency' trait of a BatchJson instance should not be less than 1" in (
        refused.stderr)
    assert kernel.value("batch_session.concurrency") == 16
    kernel.ok(CELL)
    assert kernel.value("labels.status") == "resolved"
    assert kernel.value("labels.calls") == 0
    assert kernel.value("model.calls") == 0
    assert kernel.value("batch_session.evidence.unresolved_batches") == 0
    assert kernel.value("len(labels.values)") == 6


def _accepted(ledger: Path) -> int:
    try:
        with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT COUNT(*) FROM attempts WHERE status = 'accepted'"
                              ).fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_interrupt_keeps_receipts_and_rerun_completes(kernel: Kernel, tmp_path: Path) -> None:
    kernel.ok(SLOW_SETUP)
    run = Run()
    msg_id = kernel.kc.execute(SLOW_CELL)
    ledger = tmp_path / ".batchjson" / "ledger.sqlite"
    deadline = time.monotonic() + 20
    while _accepted(ledger) < 2:
        assert time.monotonic() < deadline, "the batch never got going"
        time.sleep(0.05)
    kernel.km.interrupt_kernel()
    while True:
        msg = kernel.kc.get_iopub_msg(timeout=20)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        run.hook(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kernel.kc.get_shell_msg(timeout=20)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert "KeyboardInterrupt" in run.error["traceback"][0]
    assert "interrupted. Receipts are kept" in run.stderr
    assert "re-run the cell to resume" in run.stderr

    statuses = kernel.value("[a.status for a in batch_session.ledger.attempts('slow')]")
    assert statuses and "in_flight" not in statuses
    assert set(statuses) <= {"accepted", "cancelled"}
    accepted = kernel.value("sorted({t for a in batch_session.ledger.attempts('slow') "
                            "if a.status == 'accepted' for t in a.task_ids})")
    assert kernel.value("sorted(batch_session.ledger.checkpoint('slow'))") == accepted
    assert 2 <= len(accepted) < 16
    assert kernel.value("'slow' in dir()") is False  # nothing bound for an interrupted run

    kernel.ok(SLOW_CELL)
    assert kernel.value("slow.status") == "resolved"
    assert kernel.value("slow.calls") == 16 - len(accepted)
    assert kernel.value("batch_session.evidence.unresolved_batches") == 0


PRICED_SETUP = """
%load_ext batchjson
from batchjson import FaultPlan, SimulatedModel
model = SimulatedModel(answer=lambda task: {"verdict": "match"}, latency=0.05,
                       faults=FaultPlan(script={0: "malformed_json"}, clean_after=1),
                       price_per_million=(1.0, 2.0))
%config BatchJson.provider = model
%config BatchJson.concurrency = 1
"""


def test_a_cell_in_a_notebook_shows_time_eta_returns_and_cost_in_its_progress(
        kernel: Kernel) -> None:
    """Without ipywidgets tqdm.auto draws its text bar, which a front end redraws in place;
    a plain ``run_batch`` in a kernel shows it too, by default."""
    import re

    kernel.ok(PRICED_SETUP)
    run = kernel.ok("%%batch_json labels --pack 2\n" + SLOW_CELL.split("\n", 1)[1])
    end = run.stderr.rstrip("\n").split("\n")[-1].split("\r")[-1]
    assert end.startswith("labels resolved: 100%") and "| 16/16 [" in end, run.stderr
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+task/s, returns: 8 accepted, "
                     r"8 rejected, \$0\.\d+\]$", end), end  # elapsed<ETA, rate, counts, cost
    direct = kernel.ok("again = batch_session.run_batch('direct', tasks, schema)")
    assert "direct resolved: 100%" in direct.stderr
