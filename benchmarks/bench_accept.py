"""Cost per usable result when a validator rightly rejects a few items: whole, split, items.

N tasks (default 200; ``--n``) on the simulated model priced like gpt-4o-mini, with shared
instructions, at pack sizes 1, 5, 10 and 20. A validator rejects a fixed share of the items
(5% and 15%), chosen by a seeded hash of the task id, so the same items are rejected on every
attempt and in every mode. Each pack and share runs three ways, each on a ledger of its own in
a temporary directory, with the session's default repairs and replays (1 and 1):

  whole  a return is accepted whole or not at all (the default);
  split  the same, halved after the allowance (``split=True``);
  items  a return whose envelope holds keeps its passing items and re-asks only the rejected
         ones (``accept="items"``).

Target: items at pack 10 and 15% rejected costs at most half of split per usable result, with
the same values accepted.

Run: .venv/bin/python benchmarks/bench_accept.py [--n 200]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from batchjson import Session, SimulatedModel  # noqa: E402

PACKS = (1, 5, 10, 20)
SHARES = (0.05, 0.15)
MODES = {"whole": {}, "split": {"split": True}, "items": {"accept": "items"}}
TARGET = 0.5  # items / split, cost per usable result, at pack 10 and 15% rejected
SEED = "bench_accept"
SCHEMA = {"type": "object", "properties": {"label": {"type": "string",
                                                     "enum": ["keep", "drop"]}},
          "required": ["label"]}
INSTRUCTIONS = "Label each record keep or drop by the house rules for records. " * 20


def tasks(n: int) -> list[dict[str, Any]]:
    return [{"task_id": f"r{i:05d}", "prompt": f"Record {i}: keep or drop?"} for i in range(n)]


def rejected_ids(n: int, share: float) -> frozenset[str]:
    """Exactly ``share`` of the tasks, chosen by a seeded hash of their ids."""
    def rank(task_id: str) -> str:
        return hashlib.sha256(f"{SEED}:{task_id}".encode()).hexdigest()

    ids = sorted((t["task_id"] for t in tasks(n)), key=rank)
    return frozenset(ids[:round(share * n)])


def rejecting(rejected: frozenset[str]) -> Any:
    def house_rules(item: dict, task: dict) -> None:
        if task["task_id"] in rejected:
            raise ValueError("this record's label does not follow the house rules")
    return house_rules


def answer(task: dict) -> dict:
    return {"label": "keep" if int(task["task_id"][1:]) % 2 else "drop"}


def run(n: int, pack: int, share: float, mode: str, tmp: str) -> dict[str, Any]:
    model = SimulatedModel(answer=answer, seed=1, model="gpt-4o-mini",
                           price_per_million=(0.15, 0.60))
    ledger = str(Path(tmp) / f"{mode}-{pack}-{share}.sqlite")
    session = Session(model, ledger=ledger)
    try:
        result = session.run_batch("accept", tasks(n), SCHEMA,
                                   validator=rejecting(rejected_ids(n, share)), pack=pack,
                                   instructions=INSTRUCTIONS, on_exhausted="return",
                                   progress=False, **MODES[mode])
        values = dict(result.values)
    finally:
        session.close()
    usable = len(values)
    return {"calls": result.calls, "usable": usable, "cost": result.cost or 0.0,
            "per_usable": (result.cost or 0.0) / usable if usable else float("inf"),
            "values": values}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="tasks per run (default 200)")
    n = parser.parse_args().n
    rows: dict[tuple[str, int, float], dict[str, Any]] = {}
    print(f"{n} tasks, validator rejecting a fixed share of items; cost per usable result")
    print(f"{'mode':6} {'rejected':>8} {'pack':>4} {'calls':>6} {'usable':>7} {'cost':>10} "
          f"{'cost/usable':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:  # whole and split first: items needs accept="items"
            for share in SHARES:
                for pack in PACKS:
                    row = rows[(mode, pack, share)] = run(n, pack, share, mode, tmp)
                    per = (f"${row['per_usable']:.8f}" if row["usable"] else "n/a")
                    print(f"{mode:6} {share:>8.0%} {pack:>4} {row['calls']:>6} "
                          f"{row['usable']:>4}/{n:<3} ${row['cost']:>9.6f} {per:>12}",
                          flush=True)
    items, split = rows[("items", 10, 0.15)], rows[("split", 10, 0.15)]
    ratio = items["per_usable"] / split["per_usable"]
    same = items["values"] == split["values"]
    ok = ratio <= TARGET and same
    print(f"items / split at pack 10, 15% rejected: {ratio:.2f}x the cost per usable result "
          f"(target <= {TARGET}x); the same {len(items['values'])} values accepted: "
          f"{'yes' if same else 'no'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
