"""Time fingerprint_function on a validator that references a 3,200-record list.

The registry fingerprints a validator on every define and every batch call, so hashing the data
a validator closes over must cost about what serialising it once costs. Target: median <= 5 ms
and <= 4x a json.dumps(records, sort_keys=True) baseline measured in the same run.

Run: .venv/bin/python benchmarks/bench_fingerprint.py
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from batchjson._fingerprint.fingerprint import content_hash, fingerprint_function  # noqa: E402

REPEATS = 50
TARGET_MS = 5.0
TARGET_RATIO = 4.0

CELL = '''
def validate_labels(items):
    """Reject labels outside the reference set and scores under the threshold."""
    known = {r["label"] for r in RECORDS}
    errors = []
    for i, item in enumerate(items):
        if item.get("label") not in known:
            errors.append(f"item {i}: unknown label {item.get('label')!r}")
        elif item.get("score", 0) < THRESHOLD:
            errors.append(f"item {i}: score below {THRESHOLD}")
    return errors
'''


def make_records(n: int = 3200, seed: int = 7) -> list[dict[str, object]]:
    """Records shaped like OOLONG-style labelled items: six str/int fields each."""
    rng = random.Random(seed)
    labels = ["positive", "negative", "neutral", "mixed", "unknown"]
    return [
        {
            "id": i,
            "text": f"example text number {i} " + "".join(rng.choices("abcdefgh ", k=24)),
            "label": rng.choice(labels),
            "score": rng.randint(0, 100),
            "source": f"doc-{i % 97}",
            "lang": rng.choice(["en", "de", "fr"]),
        }
        for i in range(n)
    ]


def median_ms(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> int:
    records = make_records()
    namespace: dict[str, object] = {"RECORDS": records, "THRESHOLD": 40}
    exec(compile(CELL, "<cell>", "exec"), namespace)
    validator = namespace["validate_labels"]
    assert callable(validator)

    baseline = median_ms(lambda: json.dumps(records, sort_keys=True))
    data_only = median_ms(lambda: content_hash(records))
    measured = median_ms(lambda: fingerprint_function(validator))
    ratio = measured / baseline
    fp = fingerprint_function(validator)

    print(f"records: {len(records)} x {len(records[0])} fields, repeats: {REPEATS}")
    print(f"baseline json.dumps(sort_keys=True): {baseline:.2f} ms (median)")
    print(f"content_hash(records):               {data_only:.2f} ms (median)")
    print(f"fingerprint_function(validator):     {measured:.2f} ms (median), "
          f"{ratio:.2f}x baseline")
    print(f"digest {fp.short}, stable={fp.stable}, parts={[name for name, _ in fp.parts]}")
    ok = measured <= TARGET_MS and ratio <= TARGET_RATIO
    verdict = "PASS" if ok else "FAIL"
    print(f"{verdict}: target fingerprint median <= {TARGET_MS:g} ms and <= {TARGET_RATIO:g}x "
          f"the json.dumps baseline (got {measured:.2f} ms, {ratio:.2f}x)")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
