"""How an amount of dollars is written, everywhere, and which amounts a cost budget may be."""

from __future__ import annotations

import math
from typing import Any

from ._errors import InvalidBatch


def money(cost: float | None) -> str:
    """Dollars as results and receipts show them: four decimals, three significant digits below
    a cent so a cheap model's spend never reads as zero ($0.000158, $0.0421, $12.5000)."""
    if cost is None:
        return "unknown"
    if cost == 0:
        return "$0.00"
    return f"${cost:.{_places(abs(cost))}f}" if abs(cost) < 0.01 else f"${cost:.4f}"


def usd(amount: float) -> str:
    """Dollars in a budget message: cents from $1, else :func:`money`'s without trailing 0s."""
    if amount >= 1:
        return f"${amount:,.2f}"
    if amount <= 0:
        return "$0"
    if amount < 1e-12:
        return f"${amount:.3g}"
    return f"${amount:.{_places(amount)}f}".rstrip("0").rstrip(".")


def _places(amount: float) -> int:
    """Decimals that show three significant digits of a positive amount (at least six)."""
    return max(6, 2 - math.floor(math.log10(amount)))


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _shown(value: Any) -> str:
    """A value as an error names it: an integer too long to print by its size."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:60]


def cost_value(value: Any) -> float | None:
    """A cost budget in USD as given, checked: a finite number >= 0, or None for no limit."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not _finite(value) or value < 0):
        raise InvalidBatch(f"budget cost must be a finite number of USD >= 0 (or None for no "
                           f"limit), got {_shown(value)}")
    return float(value)
