"""Command line face: the demo, ledger inspection, and the loopback test server."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from .evidence import Evidence
from .ledger import Ledger, ledger_problem
from .session import Session

DEMO_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["verdict", "confidence"],
}
DEMO_IDENTITY = ("task_id", "case_id", "candidate_id")


def demo_tasks(cases: int = 4, per_case: int = 15) -> list[dict]:
    """Review candidates shaped like the seed's: identity travels in three fields."""
    tasks = []
    for c in range(cases):
        case = f"gold-pair-{78 + c:03d}"
        for k in range(per_case):
            candidate = f"{case}-candidate-{127 + k}"
            tasks.append({"task_id": f"{case}::{candidate}", "case_id": case,
                          "candidate_id": candidate,
                          "prompt": f"Is {candidate} the same entity as {case}?"})
    return tasks


def demo_answer(task: dict) -> dict:
    number = int(task["candidate_id"].rsplit("-", 1)[1])
    return {"verdict": "match" if number % 3 == 0 else "no_match",
            "confidence": round(0.5 + (number % 5) / 10, 2)}


def demo_model(seed: int = 0):  # noqa: ANN201 - returns a SimulatedModel
    from .providers.simulated import FaultPlan, SimulatedModel

    faults = FaultPlan(identity_swap=0.2, malformed_json=0.1, missing_item=0.05,
                       non_finite=0.05, clean_after=3)
    return SimulatedModel(answer=demo_answer, faults=faults, seed=seed,
                          price_per_million=(0.15, 0.60))


def demo_ledger_problem(ledger: Path) -> str | None:
    """The demo starts from an empty ledger, so it only ever clears one it wrote itself."""
    if not ledger.exists():
        return None
    problem = ledger_problem(ledger)
    if problem is None:
        held = Ledger(ledger)
        try:
            others = [n for n in held.batch_names() if n != "review"]
        finally:
            held.close()
        if not others:
            return None
        problem = f"{ledger} holds batches other than the demo's ({', '.join(others)})"
    return (f"{problem}. The demo starts from an empty ledger and would clear this one: pass "
            "--ledger with a new path")


def run_demo(ledger: Path, seed: int, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if ledger.exists():  # a previous demo's ledger (demo_ledger_problem was checked)
        for suffix in ("", "-wal", "-shm"):
            Path(str(ledger) + suffix).unlink(missing_ok=True)
    session = Session(demo_model(seed), ledger=ledger, repairs=1, replays=2)

    def check(item: dict, task: dict) -> None:
        if item["verdict"] == "match" and item["confidence"] < 0.5:
            raise ValueError("a match needs confidence >= 0.5")

    tasks = demo_tasks()
    print(f"batchjson demo: {len(tasks)} review tasks, 5 per call, offline model injecting "
          f"identity swaps, malformed JSON, missing items and NaN; ledger {ledger}", file=out)
    first = session.run_batch("review", tasks, DEMO_SCHEMA, validator=check,
                              identity=DEMO_IDENTITY, pack=5, split=True)
    print(f"first run:  {first!r}", file=out)
    rejected = [r for r in session.ledger.attempts("review") if r.status == "rejected"]
    kinds: dict[str, int] = {}
    for receipt in rejected:
        for error in receipt.errors:
            kinds[error["type"]] = kinds.get(error["type"], 0) + 1
    print(f"rejected returns kept as failure receipts: {len(rejected)} "
          f"(errors by type: {json.dumps(kinds, sort_keys=True)})", file=out)
    swap = next((e for r in rejected for e in r.errors if e["type"] == "identity"), None)
    if swap:
        print(f"  e.g. {swap['message']}", file=out)
    print(f"checkpoint holds {len(session.ledger.checkpoint('review'))} accepted items; "
          f"evidence: {session.evidence!r}", file=out)
    session.close()

    again = Session(demo_model(seed), ledger=ledger)
    second = again.run_batch("review", tasks, DEMO_SCHEMA, validator=check,
                             identity=DEMO_IDENTITY, pack=5, split=True)
    print(f"second run: {second!r}", file=out)
    print(f"resumed from the ledger with {second.calls} new call(s).", file=out)
    again.close()
    return 0 if first.resolved and second.calls == 0 else 1


def show_status(ledger: Path, name: str | None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    held = Ledger(ledger)
    try:
        summary = Evidence(held).summary(name)
    finally:
        held.close()
    print(json.dumps(summary, indent=2, sort_keys=True), file=out)
    return 0


def show_receipts(ledger: Path, name: str, failed: bool, raw: bool,
                  out: TextIO | None = None) -> int:
    out = out or sys.stdout
    held = Ledger(ledger)
    try:
        receipts = held.attempts(name, failed=failed)
    finally:
        held.close()
    for r in receipts:
        print(f"#{r.id} rev {r.revision} {r.kind:<7} {r.status:<14} tasks={len(r.task_ids)} "
              f"tokens={r.tokens} cost={r.cost}", file=out)
        for e in r.errors:
            print(f"    {e['type']}: {e['message']}", file=out)
        if raw and r.raw is not None:
            print(f"    raw: {r.raw}", file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["serve"]:  # the server owns its options (--port, --latency, faults)
        from .testing.server import main as serve_main

        return serve_main(args_in[1:]) or 0
    parser = argparse.ArgumentParser(prog="batchjson", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="end-to-end run on the offline model, then resume")
    demo.add_argument("--ledger", type=Path, default=Path(".batchjson/demo.sqlite"))
    demo.add_argument("--seed", type=int, default=0)
    status = sub.add_parser("status", help="evidence and spend in a ledger")
    status.add_argument("name", nargs="?")
    status.add_argument("--ledger", type=Path, default=Path(".batchjson/ledger.sqlite"))
    receipts = sub.add_parser("receipts", help="the attempts of one batch, in call order")
    receipts.add_argument("name")
    receipts.add_argument("--ledger", type=Path, default=Path(".batchjson/ledger.sqlite"))
    receipts.add_argument("--failed", action="store_true")
    receipts.add_argument("--raw", action="store_true")
    sub.add_parser("serve", help="the loopback OpenAI/Anthropic test server "
                   "(batchjson serve --help lists its options)")
    args = parser.parse_args(args_in)
    if args.command == "demo":
        problem = demo_ledger_problem(args.ledger)
        if problem:
            parser.error(problem)
        return run_demo(args.ledger, args.seed)
    problem = ledger_problem(args.ledger)
    if problem is None and args.name is not None:
        held = Ledger(args.ledger)
        try:
            problem = held.no_such_batch(args.name)
        finally:
            held.close()
    if problem:
        parser.error(problem)
    if args.command == "status":
        return show_status(args.ledger, args.name)
    return show_receipts(args.ledger, args.name, args.failed, args.raw)


if __name__ == "__main__":
    raise SystemExit(main())
