"""The one switch every benchmark reads: ``BATCHJSON_BENCH_CI=1`` (``make bench-ci``).

Under it each benchmark runs at sizes a loaded 2-core CI machine finishes in a few minutes
altogether, and judges each figure as a ratio to its floor measured in the same run, with a
margin wide enough for that machine's noise yet narrow enough that a regression of the kind
issue 35 names (a wall time of 1.12x where 1.02x was reached, CPU per call doubled, reading
values back quadratic) fails. Without it, ``make bench`` runs the full sizes and targets.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

CI = os.environ.get("BATCHJSON_BENCH_CI", "") not in ("", "0")


def ci_or(full: T, ci: T) -> T:
    """``full`` for ``make bench``, ``ci`` under ``make bench-ci``."""
    return ci if CI else full
