"""A million tasks from one notebook: memory bounded by streaming, time per task flat, resume cheap.

An instant provider (it echoes ``task_id`` and ``case_id`` at once, no network) answers packs of
50, so what is measured is batchjson's own cost per task: checking, keying, the ledger, results.
Each phase runs in a fresh child process, so its peak RSS (``VmHWM``) is its own:

  (a) ``--small`` tasks (default 100,000) from a JSON Lines file: the baseline of time per task;
  (a') ``--small`` tasks from a generator: the generator's baseline;
  (b) N tasks (default 1,000,000; ``BATCHJSON_BENCH_SCALE_N`` or ``--n``) from a JSON Lines file;
  (c) N tasks from a generator;
  (d) (b) again, resumed from its completed ledger;
  (e) (c) again, resumed (a generator's tasks are made, checked and keyed again, but no
      request is built).

The baselines and resumes run ``--rounds`` times (default 3), their median compared: one run of
the small baseline varies by more than the targets' margins on a shared machine. Each phase
then reads every value back (``result.values.items()``, the pages ``to_jsonl`` and
``to_pandas`` read too), timed apart from the run.

Targets: peak RSS of (b) <= 1 GB, of (c) <= 256 MB (also printed as a ratio to the JSONL file's
size); time per task of (b) <= 1.25x (a) and of (c) <= 1.1x (a') (a shared 2-core machine
varies by about that much between runs); reading back each value of (b) <= 1.25x (a)'s (linear
in their number); (d) and (e) make 0 calls and take <= 0.1x the time of (b), (c) (each
phase's CPU time is printed too: a loaded machine's wall ratios measure its load as much).
10M streamed tasks: ``--n 10000000 --phases small-gen,generator``
(``BATCHJSON_BENCH_SCALE_N=10000000``).

Run: .venv/bin/python benchmarks/bench_scale.py [--n 1000000] [--small 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import ci_or  # noqa: E402

RSS_LIMIT_MB = {"file": 1024.0, "generator": 256.0}
# make bench-ci runs 100,000 tasks beside 25,000 (a second or so): a loaded machine varies by 2x
TIME_RATIO = ci_or({"file": 1.25, "generator": 1.1}, {"file": 2.0, "generator": 2.0})
READ_RATIO = ci_or(1.25, 1.6)
# a generator's resume makes, checks and encodes every task again: its tasks are its revision
RESUME_RATIO = {"resume": 0.1, "resume-gen": ci_or(0.1, 0.2)}
SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def task(i: int) -> dict:
    return {"task_id": f"t{i:07d}", "case_id": f"c{i:07d}", "prompt": f"label record {i}"}


def write_jsonl(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as out:
        for i in range(n):
            out.write(json.dumps(task(i)) + "\n")


def instant_answers(call) -> str:
    """Every task answered at once, its identity copied: no network, no waiting."""
    return json.dumps({"items": [{"task_id": t["task_id"], "case_id": t["case_id"],
                                  "label": "ok"} for t in call.tasks]})


def child(source: str, n: int, ledger: str) -> None:
    """One phase, in its own process: run the batch and print what it cost."""
    from batchjson import CallableProvider, Session

    if source == "generator":
        tasks = (task(i) for i in range(n))
    elif os.environ.get("BATCHJSON_BENCH_AS_LIST"):  # the tasks read into a list first
        with open(source, encoding="utf-8") as lines:
            tasks = [json.loads(line) for line in lines]
    else:
        tasks = Path(source)
    session = Session(CallableProvider(instant_answers), ledger=ledger, concurrency=16)
    start, cpu = time.perf_counter(), time.process_time()
    result = session.run_batch("scale", tasks, SCHEMA, pack=50, identity=["task_id", "case_id"])
    count = len(result.values)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    start = time.perf_counter()
    read = sum(1 for _ in result.values.items())
    read_wall = time.perf_counter() - start
    session.close()
    peak_mb = _peak_mb()
    print(json.dumps({"wall": wall, "cpu": cpu, "calls": result.calls, "accepted": count,
                      "read": read, "read_wall": read_wall, "status": result.status,
                      "peak_mb": peak_mb}))


def _peak_mb() -> float:
    """This process's own peak RSS: VmHWM where Linux gives it (``ru_maxrss`` also carries
    the high-water mark of the process that forked this one)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status
                        if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def phase(source: str, n: int, ledger: Path, rounds: int = 1, *, resume: bool = False) -> dict:
    """The phase run ``rounds`` times (a first run on a new ledger each time; a ``resume`` on
    the same finished one): its median wall, CPU and read-back times, so that one noisy moment
    of a shared machine does not decide a ratio."""
    runs = [run_child(__file__, ["--child", source, "--n", str(n), "--ledger", str(
        ledger if resume or number == 0 else ledger.with_name(f"{number}-{ledger.name}"))],
        f"phase {source} n={n}") for number in range(rounds)]
    row = dict(runs[-1])
    for what in ("wall", "cpu", "read_wall"):
        row[what] = statistics.median(run[what] for run in runs)
    row["peak_mb"] = max(run["peak_mb"] for run in runs)
    row["calls"] = max(run["calls"] for run in runs)
    return row


def run_child(script: str, argv: list[str], what: str) -> dict:
    """``script argv`` in a fresh process: the JSON object its last line prints."""
    out = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"{what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int,
                        default=int(os.environ.get("BATCHJSON_BENCH_SCALE_N",
                                                   ci_or(1_000_000, 100_000))))
    parser.add_argument("--small", type=int, default=ci_or(100_000, 25_000))
    parser.add_argument("--child")
    parser.add_argument("--ledger")
    parser.add_argument("--phases", default="small,small-gen,file,generator,resume")
    parser.add_argument("--rounds", type=int, default=ci_or(3, 1),
                        help="runs of each baseline and resume, their median taken")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.n, args.ledger)
        return 0
    phases = args.phases.split(",")
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        rows = {}
        small_file, big_file = where / "small.jsonl", where / "big.jsonl"
        if "small" in phases:
            write_jsonl(small_file, args.small)
            rows["small"] = phase(str(small_file), args.small, where / "small.db", args.rounds)
        if "small-gen" in phases:
            rows["small-gen"] = phase("generator", args.small, where / "small-gen.db",
                                      args.rounds)
        if {"file", "resume"} & set(phases):
            write_jsonl(big_file, args.n)
        size_mb = args.n * len(json.dumps(task(0)) + "\n") / 2**20
        if "file" in phases:
            rows["file"] = phase(str(big_file), args.n, where / "file.db")
        if "generator" in phases:
            rows["generator"] = phase("generator", args.n, where / "generator.db")
        if "resume" in phases and "file" in phases:
            rows["resume"] = phase(str(big_file), args.n, where / "file.db", args.rounds,
                                   resume=True)
        if "resume" in phases and "generator" in phases:  # diagnosis: tasks read and checked
            rows["resume-gen"] = phase("generator", args.n, where / "generator.db",
                                       args.rounds, resume=True)
        print(f"input: {args.n} tasks, JSONL file {size_mb:.1f} MB")
        for label, row in rows.items():
            count = args.small if label.startswith("small") else args.n
            per_task = row["wall"] / count * 1e6
            print(f"  {label:10s} wall {row['wall']:8.2f} s  {per_task:6.1f} us/task  (CPU "
                  f"{row['cpu'] / count * 1e6:6.1f} us/task)  "
                  f"peak RSS {row['peak_mb']:7.1f} MB ({row['peak_mb'] / size_mb:.2f}x the file)"
                  f"  calls {row['calls']}  accepted {row['accepted']}  {row['status']}; read "
                  f"back {row['read']} in {row['read_wall']:.2f} s "
                  f"({row['read_wall'] / max(row['read'], 1) * 1e6:.1f} us/value)")
        for label, small in (("file", "small"), ("generator", "small-gen")):
            if label in rows:
                ok &= _verdict(f"{label}: peak RSS <= {RSS_LIMIT_MB[label]:.0f} MB",
                               rows[label]["peak_mb"] <= RSS_LIMIT_MB[label])
                ok &= _verdict(f"{label}: every task accepted and read back",
                               rows[label]["accepted"] == rows[label]["read"] == args.n)
            if small in rows and label in rows:
                ratio, cpu = ((rows[label][what] / args.n) / (rows[small][what] / args.small)
                              for what in ("wall", "cpu"))
                ok &= _verdict(f"{label}: time per task {ratio:.2f}x the {args.small} run's "
                               f"(<= {TIME_RATIO[label]}; CPU time {cpu:.2f}x)",
                               ratio <= TIME_RATIO[label])
        if "small" in rows and "file" in rows:
            ratio = ((rows["file"]["read_wall"] / args.n)
                     / (rows["small"]["read_wall"] / args.small))
            ok &= _verdict(f"reading back: time per value {ratio:.2f}x the {args.small} run's "
                           f"(<= {READ_RATIO})", ratio <= READ_RATIO)
        for label, first in (("resume", "file"), ("resume-gen", "generator")):
            if label in rows:
                ratio, cpu = (rows[label][what] / rows[first][what] for what in ("wall", "cpu"))
                ok &= _verdict(f"{label}: {ratio:.3f}x the first run's time (<= "
                               f"{RESUME_RATIO[label]}; CPU time {cpu:.3f}x), "
                               f"{rows[label]['calls']} calls",
                               ratio <= RESUME_RATIO[label] and rows[label]["calls"] == 0)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _verdict(what: str, passed: bool) -> bool:
    print(f"  {'ok  ' if passed else 'MISS'} {what}")
    return passed


if __name__ == "__main__":
    raise SystemExit(main())
