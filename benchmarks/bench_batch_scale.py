"""The batch transport over many tasks: the runner's memory grows with a job, not with the run.

A loopback server (its OpenAI Files and Batches endpoints, answered by its simulated model) runs
in this process; each batch run runs in a fresh child process, so the child's peak RSS
(``VmHWM``) is the runner's own and not the server's, which keeps every job in memory. Tasks
come from a generator, one request each (``--pack``, default 1: the most requests), every job at
most ``--job-lines`` lines (default 10,000; the provider's own ceiling is 50,000 OpenAI
requests), ``wait=True``:

  (a) ``--small`` tasks (default a fifth of N): one job's worth or so;
  (b) N tasks (default 50,000; ``--n``): five times as many requests and jobs.

Targets: peak RSS of (b) <= 1.3x (a)'s (memory flat in the task count for one job size), and
every task accepted.

Run: .venv/bin/python benchmarks/bench_batch_scale.py [--n 50000] [--job-lines 10000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scale import _peak_mb, _verdict, run_child  # noqa: E402

RSS_RATIO = 1.3
SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def task(i: int) -> dict:
    return {"task_id": f"t{i:07d}", "case_id": f"c{i:07d}", "prompt": f"label record {i}"}


def child(url: str, n: int, pack: int, job_lines: int, ledger: str) -> None:
    """The run, in its own process: every task as batch jobs, waited for."""
    from batchjson import Session
    from batchjson._providers.openai import OpenAIBatches, OpenAIProvider

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


def phase(url: str, n: int, args: argparse.Namespace, ledger: Path) -> dict:
    return run_child(__file__, ["--child", url, "--n", str(n), "--pack", str(args.pack),
                                "--job-lines", str(args.job_lines), "--ledger", str(ledger)],
                     f"the batch run of {n} tasks")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--small", type=int, default=0)
    parser.add_argument("--pack", type=int, default=1)
    parser.add_argument("--job-lines", type=int, default=10_000)
    parser.add_argument("--child")
    parser.add_argument("--ledger")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.pack, args.job_lines, args.ledger)
        return 0
    from batchjson.testing import LoopbackServer

    small = args.small or max(1, args.n // 5)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp, LoopbackServer() as srv:
        srv.batches.delay = 0.3
        for label, n in (("small", small), ("big", args.n)):
            before = srv.batches.created
            rows[label] = phase(srv.base_url, n, args, Path(tmp) / f"{label}.db")
            rows[label]["jobs"], rows[label]["n"] = srv.batches.created - before, n
    print(f"tasks from a generator, pack {args.pack}, at most {args.job_lines} lines a job")
    for label, row in rows.items():
        print(f"  {label:5s} {row['n']:8d} tasks  {row['jobs']:3d} job(s)  wall "
              f"{row['wall']:8.2f} s  {row['wall'] / row['n'] * 1e6:6.1f} us/task  peak RSS "
              f"{row['peak_mb']:7.1f} MB  accepted {row['accepted']}  {row['status']}")
    ratio = rows["big"]["peak_mb"] / rows["small"]["peak_mb"]
    ok = _verdict(f"peak RSS {ratio:.2f}x the {small}-task run's (<= {RSS_RATIO})",
                  ratio <= RSS_RATIO)
    ok &= _verdict("every task accepted", all(r["accepted"] == r["n"] for r in rows.values()))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
