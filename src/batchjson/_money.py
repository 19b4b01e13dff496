"""How an amount of dollars is written (one wording for results, the ledger's records and
every face), and which amounts a cost budget may be (one check for a session's budget and the
ledger's own)."""

from __future__ import annotations

import math
from typing import Any

from ._errors import InvalidBatch


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


def cost_value(value: Any) -> float | None:
    """A cost budget in USD as given, checked: a finite number >= 0, or None for no limit."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise InvalidBatch(f"budget cost must be a finite number of USD >= 0 (or None for no "
                           f"limit), got {value!r}")
    return float(value)
