"""How an amount of dollars is written: one wording for results, the ledger's records and
every face."""

from __future__ import annotations

import math


def money(cost: float | None) -> str:
    """Dollars, with three significant digits below a cent so a cheap model's spend does not
    read as zero: $0.000158, $0.0421, $12.5000."""
    if cost is None:
        return "unknown"
    if cost == 0:
        return "$0.00"
    if 0 < abs(cost) < 0.01:
        digits = max(6, 2 - math.floor(math.log10(abs(cost))))
        return f"${cost:.{digits}f}"
    return f"${cost:.4f}"
