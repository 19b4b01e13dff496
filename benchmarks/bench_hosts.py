"""Four hosts on one PostgreSQL ledger against the loopback server, beside one SQLite process.

The same 2,000-task batch (pack=1) runs, in interleaved rounds against one loopback server
answering after ``--latency`` seconds:

  (s) one process, its ledger a SQLite file, at concurrency 4 x C: one machine doing it all;
  (p) the same on a PostgreSQL database, for diagnosis: what the store costs, apart from sharing;
  (h) four processes, each its own host (``BATCHJSON_HOST``), each at concurrency C, on one
      PostgreSQL database (a new one each round) of a server started here: they divide the work;
  (a) the floor of four processes on this machine: four bare aiohttp loops at concurrency C,
      each posting a quarter of the tasks (pre-rendered), nothing else;
  (m) four batchjson processes at concurrency C, each running its own quarter of the tasks
      with its ledger in memory: what batchjson costs four processes, apart from any ledger.

All have the same ideal, ceil(N / (4 x C)) x latency: the four hosts together keep as many
calls in flight as the one process. The four processes' wall time runs from the moment all
four are told to start (each has imported what it needs and connected) to the moment the last
one returns; each host of (h) must return all N values, and each request must be paid once.
The verdict is on the median of (h): <= 1.15x that of (a) (``--target``). On this 2-core machine
the four hosts, the loopback server and PostgreSQL share two cores, so (h) also measures that
crowding; (a) and (m) beside it say what four processes reach on the same machine at the same
moment, and (s) what one process does.

Run: .venv/bin/python benchmarks/bench_hosts.py [--n 2000 --concurrency 16 --latency 0.05]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "benchmarks")]

from _common import ci_or  # noqa: E402
from bench_throughput import MODEL, SCHEMA, server_process, tasks_for  # noqa: E402
from tests.postgres_server import start_postgres  # noqa: E402

TARGET = 1.15  # the median of (h) over that of (a), four bare loops of the same run
# make bench-ci: wide for a loaded CI machine, failing on a doubled overhead
CI_MARGIN = 3.5  # CI size, quiet: 2.0-2.2x (N=2,000: 1.67x one day, 2.3x the next, same code)
HOSTS = 4

HOST = textwrap.dedent("""
    import asyncio, json, os, sys, time
    sys.path[:0] = [sys.argv[7], sys.argv[8]]
    from bench_throughput import MODEL, SCHEMA, chat_body, tasks_for

    mode, ledger, base_url, go, n, concurrency = sys.argv[1:7]
    tasks = tasks_for(int(n))
    if mode != "shared":  # (a), (m): this process's own quarter
        tasks = tasks[int(sys.argv[9])::4]
    if mode == "bare":
        import aiohttp
        bodies = [chat_body(t) for t in tasks]
        headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-test"}

        async def bare():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                print("ready", flush=True)
                while not os.path.exists(go):
                    await asyncio.sleep(0.001)
                queue = iter(bodies)

                async def worker():
                    for body in queue:
                        async with http.post(f"{base_url}/chat/completions", data=body,
                                             headers=headers) as resp:
                            json.loads(await resp.read())

                await asyncio.gather(*(worker() for _ in range(int(concurrency))))
            print("resolved", len(bodies), len(bodies), time.time(), flush=True)

        asyncio.run(bare())
        sys.exit()
    from batchjson import OpenAIProvider, Session
    provider = OpenAIProvider(MODEL, base_url=base_url, api_key="sk-test")
    session = Session(provider=provider, ledger=None if mode == "memory" else ledger,
                      concurrency=int(concurrency))
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    result = session.run_batch("bench", tasks, SCHEMA, pack=1, on_exhausted="return")
    end = time.time()
    print(result.status, len(result.values), result.calls, end, flush=True)
""")


def hosts_round(mode: str, url: str, base_url: str, n: int, concurrency: int,
                tmp: Path) -> float:
    """(h), (a), (m): the wall time from "go" to the last process's whole result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    go = tmp / f"go-{time.monotonic_ns()}"
    procs = [subprocess.Popen(
        [sys.executable, "-c", HOST, mode, url, base_url, str(go), str(n), str(concurrency),
         str(ROOT / "benchmarks"), str(ROOT / "src"), str(i)],
        env={**env, "BATCHJSON_HOST": f"bench-host-{i}"}, stdout=subprocess.PIPE, text=True)
        for i in range(HOSTS)]
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a host did not start")
    start = time.time()
    go.touch()
    outs = [proc.communicate(timeout=600)[0].split() for proc in procs]
    whole = str(n) if mode == "shared" else None
    if any(out[0] != "resolved" or (whole and out[1] != whole) for out in outs):
        raise RuntimeError(f"a host did not return the whole result: {outs}")
    paid = sum(int(out[2]) for out in outs)
    if paid != n:
        raise RuntimeError(f"{paid} calls for {n} requests: some request was paid twice")
    return max(float(out[3]) for out in outs) - start


def one_process_round(base_url: str, n: int, concurrency: int, ledger: Path | str) -> float:
    """(s): one process, a SQLite file, the hosts' concurrency all together; (p) the same on
    a PostgreSQL database, for diagnosis (what the store costs, apart from sharing it)."""
    from batchjson import OpenAIProvider, Session

    provider = OpenAIProvider(MODEL, base_url=base_url, api_key="sk-test")
    session = Session(provider=provider, ledger=ledger, concurrency=concurrency)
    start = time.perf_counter()
    result = session.run_batch("bench", tasks_for(n), SCHEMA, pack=1, on_exhausted="return")
    wall = time.perf_counter() - start
    session.close()
    if len(result.values) != n:
        raise RuntimeError(f"one process returned {len(result.values)} of {n} values")
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=ci_or(2000, 1024))
    parser.add_argument("--concurrency", type=int, default=16, help="per host")
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=ci_or(3, 2))
    parser.add_argument("--target", type=float, default=ci_or(TARGET, CI_MARGIN),
                        help="(h) over the ideal; under make bench-ci over (a)")
    args = parser.parse_args(argv)
    ideal = math.ceil(args.n / (HOSTS * args.concurrency)) * args.latency
    server = start_postgres()
    walls: dict[str, list[float]] = {k: [] for k in "spham"}
    whole = HOSTS * args.concurrency
    try:
        with server_process(args.latency) as base_url, tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                walls["s"].append(one_process_round(base_url, args.n, whole,
                                                    Path(tmp) / f"one-{i}.sqlite"))
                walls["p"].append(one_process_round(base_url, args.n, whole,
                                                    server.database(f"one_{i}")))
                walls["h"].append(hosts_round("shared", server.database(f"bench_{i}"),
                                              base_url, args.n, args.concurrency, Path(tmp)))
                for mode, key in (("bare", "a"), ("memory", "m")):
                    walls[key].append(hosts_round(mode, "", base_url, args.n,
                                                  args.concurrency, Path(tmp)))
                print(f"round {i + 1}: (s) one SQLite process {walls['s'][-1] / ideal:.3f}x, "
                      f"(p) one PostgreSQL process {walls['p'][-1] / ideal:.3f}x, "
                      f"(h) {HOSTS} hosts on PostgreSQL {walls['h'][-1] / ideal:.3f}x, "
                      f"(a) {HOSTS} bare loops {walls['a'][-1] / ideal:.3f}x, "
                      f"(m) {HOSTS} in-memory quarters {walls['m'][-1] / ideal:.3f}x",
                      flush=True)
    finally:
        server.stop()
    s, p, h, a, m = (statistics.median(walls[k]) for k in "spham")
    print(f"N={args.n}, {HOSTS} hosts x concurrency {args.concurrency}, latency "
          f"{args.latency * 1000:g} ms: ideal {ideal:.3f} s")
    print(f"(s) one process, SQLite, concurrency {HOSTS * args.concurrency}: median "
          f"{s:.3f} s = {s / ideal:.3f}x the ideal")
    print(f"(p) one process, PostgreSQL, concurrency {whole} (diagnosis): median {p:.3f} s = "
          f"{p / ideal:.3f}x the ideal")
    print(f"(h) {HOSTS} hosts, one PostgreSQL ledger: median {h:.3f} s = {h / ideal:.3f}x the "
          f"ideal ({h / s:.3f}x the SQLite process)")
    print(f"(a) {HOSTS} bare aiohttp loops, a quarter each (the floor): median {a:.3f} s = "
          f"{a / ideal:.3f}x the ideal; (h) - (a) = {(h - a) / ideal:+.3f}x")
    print(f"(m) {HOSTS} batchjson processes, a quarter each, ledgers in memory: median "
          f"{m:.3f} s = {m / ideal:.3f}x the ideal; (h) - (m) = {(h - m) / ideal:+.3f}x")
    passed = h / a <= args.target
    print(f"verdict: (h) {'<=' if passed else '>'} {args.target}x (a), the bare loops "
          f"({h / a:.3f}x): {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
