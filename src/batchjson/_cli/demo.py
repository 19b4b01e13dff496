"""``batchjson demo``: a faulty offline batch run end to end, then resumed with zero calls. It
starts from an empty ledger, so it only ever clears one it wrote itself."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any, TextIO

from .. import FaultPlan, Ledger, Session, SimulatedModel
from .. import _textview as cliview
from ..core import file_problem as ledger_problem
from ..core import money

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


# The faults are drawn from the seed and each request's key: with this one the first run shows
# identity swaps and malformed JSON caught, each request tried again until all 60 tasks resolve.
DEMO_SEED = 0


def demo_answer(task: dict) -> dict:
    number = int(task["candidate_id"].rsplit("-", 1)[1])
    return {"verdict": "match" if number % 3 == 0 else "no_match",
            "confidence": round(0.5 + (number % 5) / 10, 2)}


def demo_model(seed: int = DEMO_SEED):  # noqa: ANN201 - returns a SimulatedModel
    faults = FaultPlan(identity_swap=0.2, malformed_json=0.1, missing_item=0.05,
                       non_finite=0.05, clean_after=3)
    return SimulatedModel(answer=demo_answer, faults=faults, seed=seed, model="gpt-4o-mini",
                          price_per_million=(0.15, 0.60))


def command_name() -> str:
    """How to run this batchjson from here: ``batchjson`` when that is what the shell finds
    (an activated venv), else its path (``make demo`` runs .venv/bin/python, not on PATH)."""
    script = Path(sys.executable).parent / "batchjson"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m batchjson"
    found = shutil.which("batchjson")
    if found and Path(found).absolute() == script.absolute():
        return "batchjson"
    relative = os.path.relpath(script.absolute())
    return shlex.quote(relative if not relative.startswith("..") else str(script.absolute()))


def demo_ledger_problem(ledger: Path) -> str | None:
    """The demo starts from an empty ledger, so it only ever clears one it wrote itself."""
    if not ledger.exists():
        return None
    problem = ledger_problem(ledger)
    if problem is None:
        with closing(Ledger(ledger)) as held:
            others = [n for n in held.batch_names() if n != "review"]
            # A batch of one's own may well be called "review": it is the demo's only if every
            # attempt is the offline model's, made by a run, on the demo's tasks.
            ids = {t["task_id"] for t in demo_tasks()}
            foreign = [r for r in (held.attempts("review") if not others else [])
                       if r.provider != "simulated" or r.kind == "import"
                       or not set(r.task_ids) <= ids]
        if not others and not foreign:
            return None
        problem = (f"{ledger} holds batches other than the demo's ({', '.join(others)})" if others
                   else f"{ledger} holds a batch 'review' that is not the demo's ({len(foreign)} "
                   "attempt(s) of other tasks, models or imports)")
    return (f"{problem}. The demo starts from an empty ledger and would clear this one: pass "
            "--ledger with a new path")


def _demo_check(item: dict, task: dict) -> None:
    if item["verdict"] == "match" and item["confidence"] < 0.5:
        raise ValueError("a match needs confidence >= 0.5")


def _review(session: Session, tasks: list[dict]) -> Any:
    return session.run_batch("review", tasks, DEMO_SCHEMA, validator=_demo_check,
                             identity=DEMO_IDENTITY, pack=5, split=True, on_exhausted="return")


def run_demo(ledger: Path, seed: int, out: TextIO | None = None, *,
             as_json: bool = False) -> int:
    out = out or sys.stdout
    if ledger.exists():  # a previous demo's ledger (demo_ledger_problem was checked)
        for suffix in ("", "-wal", "-shm"):
            Path(str(ledger) + suffix).unlink(missing_ok=True)
    tasks = demo_tasks()
    say = (lambda *a: None) if as_json else (lambda text="": print(text, file=out))
    say(f"batchjson demo: {len(tasks)} review tasks in requests of 5, answered by an offline "
        "model that injects identity swaps, malformed JSON, missing items and NaN")
    say(f"ledger: {ledger}\n")
    with closing(Session(demo_model(seed), ledger=ledger, repairs=1, replays=2)) as session:
        first = _review(session, tasks)
        errors = [e for r in session.ledger.attempts("review", failed=True) for e in r.errors]
    kinds = Counter(e["type"] for e in errors)
    swap = next((cliview.describe_error(e) for e in errors if e["type"] == "identity"), None)
    with closing(Session(demo_model(seed), ledger=ledger)) as again:
        second = _review(again, tasks)
    code = 0 if first.resolved and second.calls == 0 else 1  # the CLI's exit codes
    if as_json:
        print(json.dumps({"ledger": str(ledger), "first": first.summary(),
                          "second": second.summary(), "rejected_errors_by_type": kinds},
                         indent=2, sort_keys=True), file=out)
        return code
    for label, r in (("first run ", first), ("second run", second)):
        say(f"{label}  {r.status}: {len(r.values)}/{r.total_tasks} tasks answered; "
            f"{r.calls} call(s): {r.accepted_returns} returns accepted, {r.rejected_returns} "
            f"rejected, {r.provider_errors} provider error(s); {r.tokens} tokens, "
            f"{money(r.cost)}")
    listed = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
    say(f"  rejected returns kept as failure receipts; their errors by type: {listed}")
    if swap:
        say("\n".join(cliview.wrapped(swap, "  e.g. ")))
    say(f"  the second run resumed every request from the ledger: {second.calls} new call(s)")
    flag = ("" if str(ledger) == cliview.DEFAULT_LEDGER
            else f" --ledger {shlex.quote(str(ledger))}")
    me = command_name()
    say("\nnext:")
    for command, why in ((f"{me} status{flag}", "calls, tokens and cost, per batch"),
                         (f"{me} receipts review --failed{flag}",
                          "every rejected return and why"),
                         (f"{me} values review --csv{flag}", "the accepted answers"),
                         (f"{me} advise review{flag}", "the cheapest pack size")):
        say(f"  {command.ljust(58)} {why}")
    return code
