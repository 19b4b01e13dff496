"""Call and cost budgets, checked before any spending and reserved call by call."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BudgetExceeded, InvalidBatch


@dataclass(frozen=True)
class Budget:
    """A session's ceiling: ``calls`` and/or ``cost`` (USD); None means unlimited."""

    calls: int | None = None
    cost: float | None = None

    @classmethod
    def of(cls, value: Budget | Mapping[str, Any] | int | None) -> Budget:
        if value is None:
            return cls()
        if isinstance(value, Budget):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(calls=_limit("calls", value, whole=True))
        if isinstance(value, Mapping):
            unknown = set(value) - {"calls", "cost"}
            if unknown:
                raise InvalidBatch(f"budget has unknown keys {sorted(unknown)}; use calls= and "
                                   "cost=")
            return cls(calls=_limit("calls", value.get("calls"), whole=True),
                       cost=_limit("cost", value.get("cost"), whole=False))
        raise InvalidBatch(f"budget must be Budget(calls=, cost=), a dict or an int, got {value!r}")


def _limit(name: str, value: Any, *, whole: bool) -> Any:
    """A budget limit is None (unlimited) or a number >= 0: refused before anything is spent."""
    if value is None:
        return None
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
        what = "a whole number of calls" if whole else "an amount in USD"
        raise InvalidBatch(f"budget {name} must be None or {what} >= 0, got {value!r}")
    return value


class Tally:
    """What a session has spent, charged call by call by every run (and thread) using it."""

    def __init__(self) -> None:
        self.calls = 0
        self.cost = 0.0
        self.lock = threading.Lock()


class Spender:
    """Tracks what one run may still spend, against its max_calls and the session's budget.

    Each reserved call and each known cost is charged to the session's ``tally`` at once, so
    a run that is interrupted or fails still counts, and concurrent runs share one budget.
    """

    def __init__(self, max_calls: int | None, budget: Budget, tally: Tally) -> None:
        self.max_calls = max_calls
        self.budget = budget
        self.calls = 0
        self._tally = tally

    def remaining_calls(self) -> int | None:
        limits = []
        if self.max_calls is not None:
            limits.append(self.max_calls - self.calls)
        if self.budget.calls is not None:
            limits.append(self.budget.calls - self._tally.calls)
        return max(0, min(limits)) if limits else None

    def refuse_if_short(self, needed: int) -> None:
        remaining = self.remaining_calls()
        if remaining is not None and needed > remaining:
            raise BudgetExceeded(needed, remaining)
        if self.budget.cost is not None and needed and self._tally.cost >= self.budget.cost:
            raise BudgetExceeded(needed, 0, what="calls (the session's cost budget is spent)")

    def reserve(self) -> bool:
        """Take one call from the budget; False when nothing is left."""
        with self._tally.lock:
            remaining = self.remaining_calls()
            if remaining is not None and remaining <= 0:
                return False
            if self.budget.cost is not None and self._tally.cost >= self.budget.cost:
                return False
            self.calls += 1
            self._tally.calls += 1
            return True

    def ample(self, calls: int) -> bool:
        """True when no cost budget applies and more than ``calls`` calls remain (or no limit)."""
        remaining = self.remaining_calls()
        return self.budget.cost is None and (remaining is None or remaining > calls)

    def refund(self) -> None:
        """Give back a reserved call that was never made."""
        with self._tally.lock:
            self.calls -= 1
            self._tally.calls -= 1

    def add_cost(self, cost: float | None) -> None:
        if cost:
            with self._tally.lock:
                self._tally.cost += cost
