"""How close batchjson's real HTTP path gets to the latency floor, over loopback.

The server runs in a separate process (so client and server do not share one event loop) and
answers every request after ``--latency`` seconds. With concurrency C the ideal wall time for N
single-task calls is ceil(N / C) * latency; every phase is reported as a ratio to that:

  (a) a bare aiohttp loop at concurrency C: the floor this machine can reach;
  (a2) the OpenAIProvider alone at concurrency C (no session, no ledger), for diagnosis;
  (b0) the same as (b) with the ledger in memory, for diagnosis (what the ledger file costs);
  (b) the full batchjson path: Session(OpenAIProvider, SQLite ledger).run_batch(pack=1);
  (c) a sequential loop over a small subset, extrapolated to N;
  (d) the server's own requests/second, as it saw phases (a) and (b), plus a saturation run
      against a second, zero-latency server.

(a), (a2), (b0) and (b) run in interleaved rounds (``--rounds``, default 5) against the same server,
and the verdict is on the median of (b): on a shared 2-core machine single runs of the same
code vary by several hundredths of the ideal, and interleaving exposes (a) and (b) to the same
moments of noise. The figures judged, each beside the bare loop of the same run: the median wall
time of (b) <= 1.10x the bare loop's at 50 ms latency and <= 1.02x at 1 s (``--target``;
``--n 640 --latency 1``, where real models live), and client CPU per call <= 2.5x the bare
loop's, for a session whose ledger has seen the server before.

Run: .venv/bin/python benchmarks/bench_throughput.py [--n 2000 --concurrency 64 --latency 0.05]
     .venv/bin/python benchmarks/bench_throughput.py --n 640 --latency 1 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import CI, ci_or  # noqa: E402

from batchjson._content.schema import compile_schema, wire_schema  # noqa: E402
from batchjson._content.tasks import render_items_prompt  # noqa: E402
from batchjson._providers.base import Call  # noqa: E402
from batchjson._providers.openai import OpenAIProvider  # noqa: E402

# Targets: the median of (b) over the bare loop's median in the same run, and client CPU per call
# over the bare loop's, both with a ledger that has seen the server before.
TARGET = 1.10  # wall at 50 ms latency
TARGET_SLOW = 1.02  # at >= 0.5 s latency
TARGET_CPU = 2.5
# make bench-ci: small N on a CI machine; wide enough for its noise, narrow enough that a fresh
# lone first call (1 s of 6: 1.2x) or a doubled client overhead fails
CI_MARGIN = 1.6  # 50 ms (1.13x measured quiet)
CI_MARGIN_SLOW = 1.08  # 1 s (1.02x measured)
CI_CPU = 4.5  # (2.7-3.0x measured; a doubled client overhead is about 4.7x)
SCHEMA = {"type": "object", "properties": {}}
MODEL = "gpt-4o-mini"


# The loopback server reports rate limits (sessions pace to what they learn); these are far
# above what any phase sends, so the ideal below is the latency's alone (bench_ratelimits
# measures pacing). Requests, input tokens, output tokens per minute.
UNBOUND_LIMITS = (100_000_000, 10_000_000_000, 10_000_000_000)
SERVER = """
import sys
from batchjson.testing import Limits, LoopbackServer
with LoopbackServer(latency=float(sys.argv[1]), rate_limits=Limits(*map(int, sys.argv[2:]))) as srv:
    print(srv.base_url, flush=True)
    sys.stdin.read()
"""


@contextmanager
def server_process(latency: float) -> Iterator[str]:
    """Start the loopback server in a process of its own and yield its OpenAI base URL."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(latency),
                             *map(str, UNBOUND_LIMITS)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:\d+/v1", line)
        if not match:
            raise RuntimeError(f"loopback server did not start: {line!r}")
        yield match.group(0)
    finally:
        proc.communicate(timeout=10)


WARM_TASKS = [{"task_id": "warm", "prompt": "a first question, before the run timed"}]


def tasks_for(n: int) -> list[dict[str, Any]]:
    return [{"task_id": f"t{i:06d}", "prompt": f"question number {i}"} for i in range(n)]


def chat_body(task: dict[str, Any]) -> bytes:
    prompt = render_items_prompt([task], ("task_id",), None)
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}]}).encode()


async def server_stats(session: aiohttp.ClientSession, base_url: str, *, reset: bool = False
                       ) -> dict[str, Any]:
    root = base_url.removesuffix("/v1")
    if reset:
        async with session.post(f"{root}/stats/reset") as resp:
            return await resp.json()
    async with session.get(f"{root}/stats") as resp:
        return await resp.json()


async def bare_loop(base_url: str, n: int, concurrency: int) -> tuple[float, dict[str, Any]]:
    """(a) C workers posting pre-rendered bodies and decoding the JSON: nothing else."""
    bodies = [chat_body(t) for t in tasks_for(n)]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-test"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await server_stats(session, base_url, reset=True)
        queue = iter(bodies)

        async def worker() -> None:
            for body in queue:
                async with session.post(f"{base_url}/chat/completions", data=body,
                                        headers=headers) as resp:
                    json.loads(await resp.read())

        start = time.perf_counter()
        cpu = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        CPU["a"].append((time.process_time() - cpu) / n)
        return wall, await server_stats(session, base_url)


COMPILED = compile_schema(SCHEMA)


def call_for(task: dict[str, Any]) -> Call:
    return Call(tasks=(task,), prompt=render_items_prompt([task], ("task_id",), None),
                system="", schema=wire_schema(COMPILED, [task], ("task_id",)),
                attempt=0, kind="answer", request_key=task["task_id"])


async def provider_only(base_url: str, n: int, concurrency: int) -> float:
    """(a2) the OpenAIProvider alone at concurrency C: what the provider adds to the floor."""
    provider = OpenAIProvider(MODEL, base_url=base_url, api_key="sk-test")
    calls = iter([call_for(t) for t in tasks_for(n)])

    async def worker() -> None:
        for call in calls:
            await provider.complete(call)

    try:
        start = time.perf_counter()
        cpu = time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        CPU["a2"].append((time.process_time() - cpu) / n)
        return time.perf_counter() - start
    finally:
        await provider.aclose()


async def sequential(base_url: str, n: int) -> float:
    """(c) one call at a time through the real provider; returns seconds per call."""
    provider = OpenAIProvider(MODEL, base_url=base_url, api_key="sk-test")
    try:
        start = time.perf_counter()
        for task in tasks_for(n):
            await provider.complete(call_for(task))
        return (time.perf_counter() - start) / n
    finally:
        await provider.aclose()


def _time_the_loop() -> None:
    """Diagnosis only: note when the replay loop starts and ends inside (b), so the report can
    say how much of (b) is the session's own work before and after it (normalising the tasks,
    keys, the revision, re-judging, reading the result)."""
    from batchjson._replay.replay import Replayer

    if getattr(Replayer.run, "_timed", False):
        return
    run = Replayer.run

    async def timed(self: Any, requests: Any) -> Any:
        EDGES["loop_start"] = time.perf_counter()
        try:
            return await run(self, requests)
        finally:
            EDGES["loop_end"] = time.perf_counter()

    timed._timed = True  # type: ignore[attr-defined]
    Replayer.run = timed  # type: ignore[method-assign]


EDGES: dict[str, float] = {}
OUTSIDE: list[tuple[float, float]] = []  # (b): seconds before and after the replay loop


def session_path(base_url: str, n: int, concurrency: int, *, durable: bool = True
                 ) -> tuple[float, Any, dict[str, Any]]:
    """(b) the whole thing: Session + replay loop + acceptance + SQLite ledger, pack=1.
    ``durable=False`` is (b0): the same with the ledger in memory, for diagnosis only (what
    the ledger file's writes cost)."""
    from batchjson import Session

    _time_the_loop()

    with tempfile.TemporaryDirectory() as tmp:
        provider = OpenAIProvider(MODEL, base_url=base_url, api_key="sk-test")
        ledger = str(Path(tmp) / "bench.sqlite") if durable else None
        session = Session(provider=provider, concurrency=concurrency, ledger=ledger)
        # The target is for a ledger that has seen the server before (its limits, or that it
        # reports none, are kept there): an earlier session ran on it; in memory, this one did.
        session.run_batch("seen", WARM_TASKS, SCHEMA, pack=1, on_exhausted="return")
        if durable:
            session.close()
            session = Session(provider=OpenAIProvider(MODEL, base_url=base_url, api_key="sk-test"),
                              concurrency=concurrency, ledger=ledger)
        asyncio.run(_reset(base_url))
        start = time.perf_counter()
        cpu = time.process_time()  # all threads: the session's event loop runs on its own
        result = session.run_batch("bench", tasks_for(n), SCHEMA, pack=1, on_exhausted="return")
        end = time.perf_counter()
        wall = end - start
        if durable:
            OUTSIDE.append((EDGES["loop_start"] - start, end - EDGES["loop_end"]))
        CPU["b" if durable else "b0"].append((time.process_time() - cpu) / n)
        stats = asyncio.run(_stats(base_url))
        session.close()
    return wall, result, stats


async def _reset(base_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        await server_stats(session, base_url, reset=True)


async def _stats(base_url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        return await server_stats(session, base_url)


# seconds of client CPU per call, per round
CPU: dict[str, list[float]] = {"a": [], "a2": [], "b0": [], "b": []}


def line(label: str, wall: float, ideal: float, extra: str = "") -> None:
    print(f"  {label:<44} {wall:8.3f} s   {wall / ideal:6.3f}x ideal  {extra}")


def rate(stats: dict[str, Any]) -> str:
    rps = stats.get("requests_per_second")
    return f"server saw {stats['requests']} req at {rps:,.0f} req/s" if rps else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=ci_or(2000, 768))
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=ci_or(5, 3),
                        help="interleaved rounds of (a)-(b)")
    parser.add_argument("--sequential", type=int, default=ci_or(20, 0),
                        help="calls in phase (c)")
    parser.add_argument("--saturate", type=int, default=ci_or(5000, 0),
                        help="requests in phase (d)")
    parser.add_argument("--skip-session", action="store_true", help="skip phase (b)")
    parser.add_argument("--target", type=float, default=None,
                        help=f"wall target for (b) (default {TARGET} below 0.5 s latency, "
                        f"{TARGET_SLOW} from there)")
    args = parser.parse_args(argv)
    n, c, latency = args.n, args.concurrency, args.latency
    target = args.target or (TARGET if latency < 0.5 else TARGET_SLOW)
    if CI:  # a ratio to the floor of the same run: the bare loop's median
        target = args.target or (CI_MARGIN if latency < 0.5 else CI_MARGIN_SLOW)
    ideal = math.ceil(n / c) * latency
    print(f"N={n} concurrency={c} latency={latency}s -> ideal ceil(N/C)*latency = {ideal:.3f} s"
          f"  (python {sys.version.split()[0]}, {os.cpu_count()} cpu, {args.rounds} rounds)")
    walls: dict[str, list[float]] = {"a": [], "a2": [], "b0": [], "b": []}
    verdict = 0
    with server_process(latency) as base_url:
        print(f"server (separate process): {base_url}")
        for round_no in range(1, args.rounds + 1):
            wall, stats = asyncio.run(bare_loop(base_url, n, c))
            walls["a"].append(wall)
            line(f"[{round_no}] (a) bare aiohttp loop", wall, ideal, rate(stats))
            if not CI:  # diagnosis only
                walls["a2"].append(asyncio.run(provider_only(base_url, n, c)))
                line(f"[{round_no}] (a2) OpenAIProvider.complete alone", walls["a2"][-1], ideal)
            if args.skip_session:
                continue
            if not CI:
                walls["b0"].append(session_path(base_url, n, c, durable=False)[0])
                line(f"[{round_no}] (b0) the same, ledger in memory", walls["b0"][-1], ideal)
            wall_b, result, stats_b = session_path(base_url, n, c)
            walls["b"].append(wall_b)
            line(f"[{round_no}] (b) batchjson Session.run_batch(pack=1)", wall_b, ideal,
                 f"status={result.status} calls={result.calls} values={len(result.values)}; "
                 f"{rate(stats_b)}")
            if result.status != "resolved" or len(result.values) != n:
                print("  (b) did not resolve every task: the run is invalid")
                verdict = 2
        print("medians:")
        for key, label in (("a", "(a) bare aiohttp loop"), ("a2", "(a2) provider alone"),
                           ("b0", "(b0) ledger in memory"), ("b", "(b) batchjson Session")):
            if walls[key]:
                values = walls[key]
                line(label, statistics.median(values), ideal,
                     f"range {min(values) / ideal:.3f}-{max(values) / ideal:.3f}x")
        if walls["b"]:
            median_b = statistics.median(walls["b"]) / ideal
            median_a = statistics.median(walls["a"]) / ideal
            ok = median_b / median_a <= target
            print(f"  (b) wall target <= {target}x the bare loop: "
                  f"{'PASS' if ok else 'FAIL'} (median {median_b:.3f}x; bare loop "
                  f"{median_a:.3f}x, difference {median_b - median_a:+.3f}x, ratio "
                  f"{median_b / median_a:.3f}x)")
            cpu_a, cpu_b = statistics.median(CPU["a"]), statistics.median(CPU["b"])
            cpu_target = CI_CPU if CI else TARGET_CPU
            ok &= cpu_b / cpu_a <= cpu_target
            print(f"  (b) CPU per call target <= {cpu_target}x the bare loop's: "
                  f"{'PASS' if cpu_b / cpu_a <= cpu_target else 'FAIL'}")
            before = statistics.median(b for b, _ in OUTSIDE)
            after = statistics.median(a for _, a in OUTSIDE)
            print(f"  (b) of which outside the replay loop: {before * 1000:.0f} ms before it, "
                  f"{after * 1000:.0f} ms after it ({(before + after) / ideal:.3f}x of the ideal)")
            if CPU["a2"] and CPU["b0"]:  # the diagnosis phases (not run by make bench-ci)
                cpu_a2, cpu_b0 = (statistics.median(CPU[k]) for k in ("a2", "b0"))
                print(f"  CPU per call, where it goes: bare loop {cpu_a * 1e6:.0f} us; the "
                      f"provider adds {(cpu_a2 - cpu_a) * 1e6:+.0f} us; session, replay loop, "
                      f"acceptance and an in-memory ledger {(cpu_b0 - cpu_a2) * 1e6:+.0f} us; "
                      f"the ledger file (WAL writes, commits) {(cpu_b - cpu_b0) * 1e6:+.0f} us")
            print(f"  (b) CPU per call: median {cpu_b * 1e6:.0f} us against "
                  f"{cpu_a * 1e6:.0f} us for the bare loop, {cpu_b / cpu_a:.2f}x; rounds "
                  f"{', '.join(f'{v * 1e6:.0f}' for v in CPU['b'])} us")
            verdict = verdict or (0 if ok else 1)
        else:
            print("  (b) skipped (--skip-session)")
        if args.sequential:
            per_call = asyncio.run(sequential(base_url, args.sequential))
            line(f"(c) sequential, {args.sequential} calls extrapolated to N", per_call * n,
                 ideal, f"{per_call * 1000:.1f} ms/call")
    if not args.saturate:
        return verdict
    with server_process(0.0) as fast_url:
        wall, stats = asyncio.run(bare_loop(fast_url, args.saturate, c))
        print(f"  (d) server capacity at latency 0: {stats['requests_per_second']:,.0f} req/s "
              f"server-side, {args.saturate / wall:,.0f} req/s client-side "
              f"({args.saturate} requests, concurrency {c})")
    return verdict


if __name__ == "__main__":
    raise SystemExit(main())
