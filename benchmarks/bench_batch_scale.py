"""The batch transport over many tasks: peak memory of the runner bounded by a job, not the run.

A loopback server (its OpenAI Files and Batches endpoints, answered by its simulated model) runs
in this process; the batch run runs in a fresh child process, so the child's peak RSS
(``VmHWM``) is the runner's own and not the server's, which keeps every job in memory. Tasks
come from a generator, one request each (``--pack``, default 1: the most requests, and so the
most jobs: OpenAI takes 50,000 lines a job, ``--job-lines`` lowers it), ``wait=True``.

Target: the child's peak RSS <= 1 GB, and every task accepted; the peak is also printed per
job, the unit the runner holds.

Run: .venv/bin/python benchmarks/bench_batch_scale.py [--n 200000] [--pack 1] [--job-lines N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scale import _peak_mb, _verdict  # noqa: E402

RSS_LIMIT_MB = 1024.0
SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def task(i: int) -> dict:
    return {"task_id": f"t{i:07d}", "case_id": f"c{i:07d}", "prompt": f"label record {i}"}


def child(url: str, n: int, pack: int, job_lines: int, ledger: str) -> None:
    """The run, in its own process: every task as batch jobs, waited for."""
    from batchjson import Session
    from batchjson._providers.openai import OpenAIProvider
    from batchjson._providers.openai_batch import OpenAIBatches

    if job_lines:
        OpenAIBatches.max_requests = job_lines
    session = Session(OpenAIProvider("gpt-4o-mini", base_url=url, api_key="sk-bench"),
                      ledger=ledger)
    session.job_poll = 0.2
    start = time.perf_counter()
    result = session.run_batch("scale", (task(i) for i in range(n)), SCHEMA, pack=pack,
                               identity=["task_id", "case_id"], transport="batch", wait=True)
    wall = time.perf_counter() - start
    count = len(result.values)
    session.close()
    print(json.dumps({"wall": wall, "calls": result.calls, "accepted": count,
                      "status": result.status, "peak_mb": _peak_mb()}))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--pack", type=int, default=1)
    parser.add_argument("--job-lines", type=int, default=0)
    parser.add_argument("--child")
    parser.add_argument("--ledger")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.pack, args.job_lines, args.ledger)
        return 0
    from batchjson.testing import LoopbackServer

    with tempfile.TemporaryDirectory() as tmp, LoopbackServer() as srv:
        srv.batches.delay = 0.3
        ledger = Path(tmp) / "batch.db"
        out = subprocess.run([sys.executable, __file__, "--child", srv.base_url,
                              "--n", str(args.n), "--pack", str(args.pack),
                              "--job-lines", str(args.job_lines), "--ledger", str(ledger)],
                             capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(f"the batch run failed:\n{out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        jobs = srv.batches.created
    requests = -(-args.n // args.pack)
    print(f"input: {args.n} tasks from a generator, pack {args.pack} ({requests} requests), "
          f"{jobs} job(s)")
    print(f"  wall {row['wall']:8.2f} s  {row['wall'] / args.n * 1e6:6.1f} us/task  peak RSS "
          f"{row['peak_mb']:7.1f} MB  lines {row['calls']}  accepted {row['accepted']}  "
          f"{row['status']}")
    ok = _verdict(f"peak RSS <= {RSS_LIMIT_MB:.0f} MB", row["peak_mb"] <= RSS_LIMIT_MB)
    ok &= _verdict("every task accepted", row["accepted"] == args.n)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
