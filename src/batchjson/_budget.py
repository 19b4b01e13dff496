"""Call and cost budgets: validated up front, reserved at worst case before a call, settled after.

A cost is known only after a call returns, so each call first reserves its worst case (estimated
input tokens plus its output ceiling, at the model's prices) and settles to the real cost when the
reply arrives. Reservations of every run and thread of a session share one :class:`Tally`, so a
cost budget holds at any concurrency.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import BudgetExceeded, ConfigError, InvalidBatch
from ._providers.base import declared_output_cap

# Output ceiling assumed for a call whose provider sets none (OpenAI-compatible servers without
# max_tokens in extra_body): the worst case a cost budget reserves for its answer.
DEFAULT_MAX_OUTPUT_TOKENS = 4096


def _calls_value(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidBatch(f"budget calls must be a whole number >= 0 (or None for no limit), "
                           f"got {value!r}")
    return value


def _cost_value(value: Any) -> float | None:
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise InvalidBatch(f"budget cost must be a finite number of USD >= 0 (or None for no "
                           f"limit), got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Budget:
    """A session's ceiling: ``calls`` and/or ``cost`` (USD); None means unlimited."""

    calls: int | None = None
    cost: float | None = None

    def __post_init__(self) -> None:
        """A bad budget is refused here, before anything can be spent under it."""
        object.__setattr__(self, "calls", _calls_value(self.calls))
        object.__setattr__(self, "cost", _cost_value(self.cost))

    @classmethod
    def of(cls, value: Budget | Mapping[str, Any] | int | None) -> Budget:
        if value is None:
            return cls()
        if isinstance(value, Budget):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(calls=value)
        if isinstance(value, Mapping):
            unknown = set(value) - {"calls", "cost"}
            if unknown:
                raise InvalidBatch(f"budget has unknown keys {sorted(unknown)}; use calls= and "
                                   "cost=")
            return cls(calls=value.get("calls"), cost=value.get("cost"))
        raise InvalidBatch(f"budget must be Budget(calls=, cost=), a dict or an int, got {value!r}")


@dataclass(frozen=True)
class Pricing:
    """What a cost budget needs to know of the provider: USD per million tokens, output cap."""

    model: str | None
    input: float | None
    output: float | None
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS

    @property
    def priced(self) -> bool:
        return self.input is not None and self.output is not None

    def worst_case(self, input_tokens: int) -> float:
        """The most one call can cost: its input plus a full answer at the output price."""
        return ((input_tokens * (self.input or 0.0))
                + self.max_output_tokens * (self.output or 0.0)) / 1e6

    def floor(self, input_tokens: int) -> float | None:
        """The least one sent call costs: its input at the input price (None if unpriced)."""
        return None if self.input is None else input_tokens * self.input / 1e6

    def cost(self, input_tokens: int | None, output_tokens: int | None) -> float | None:
        if not self.priced or input_tokens is None or output_tokens is None:
            return None
        return (input_tokens * (self.input or 0.0) + output_tokens * (self.output or 0.0)) / 1e6


def pricing_of(provider: Any) -> Pricing:
    """Ask the provider for its prices (``price_for_budget()``) and its output ceiling."""
    model = getattr(provider, "model", None)
    ask = getattr(provider, "price_for_budget", None)
    price = ask() if callable(ask) else None
    cap = declared_output_cap(provider) or DEFAULT_MAX_OUTPUT_TOKENS
    if price is None:
        return Pricing(model, None, None, cap)
    return Pricing(model, float(price.input), float(price.output), cap)


class Tally:
    """What a session has spent, charged call by call by every run (and thread) using it.

    ``reserved`` holds the worst-case cost of calls not yet settled.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.cost = 0.0
        self.reserved = 0.0
        self.lock = threading.Lock()


class Spender:
    """What one run may still spend, against its max_calls and the session's budget.

    Each reserved call is charged to the session's ``tally`` at once, so a run that is
    interrupted or fails still counts, and concurrent runs share one budget.
    """

    def __init__(self, max_calls: int | None, budget: Budget, tally: Tally,
                 pricing: Pricing | None = None) -> None:
        self.max_calls = max_calls
        self.budget = budget
        self.calls = 0
        self.outstanding = 0  # this run's reservations not yet settled or released
        self.on_settle: Callable[[], None] | None = None
        self._tally = tally
        self.pricing = pricing or Pricing(None, None, None)
        if budget.cost is not None and not self.pricing.priced:
            name = self.pricing.model or "this provider's model"
            raise ConfigError(
                f"a cost budget needs the model's price, and {name!r} has none, so its spend "
                "could not be held; nothing was spent. Set a price (USD per million tokens) "
                f"with batchjson.set_prices({{{name!r}: {{'input': ..., 'output': ...}}}}) or the "
                "provider's prices= argument, or use a calls budget.")

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
        # Not even the answer of one call fits in what the cost budget has left.
        if (self.budget.cost is not None and needed and self._tally.cost + self._tally.reserved
                + self.pricing.worst_case(0) > self.budget.cost):
            raise BudgetExceeded(needed, 0, what="calls (the session's cost budget is spent)")

    def reserve(self, input_tokens: int) -> float | None:
        """Take one call (and its worst-case cost) from the budget; None when it cannot fit."""
        worst = self.pricing.worst_case(input_tokens) if self.budget.cost is not None else 0.0
        with self._tally.lock:
            remaining = self.remaining_calls()
            if remaining is not None and remaining <= 0:
                return None
            if (self.budget.cost is not None
                    and self._tally.cost + self._tally.reserved + worst > self.budget.cost):
                return None
            self.calls += 1
            self.outstanding += 1
            self._tally.calls += 1
            self._tally.reserved += worst
            return worst

    def release(self, reserved: float) -> None:
        """A reserved call was never sent: it costs nothing and is not a call."""
        with self._tally.lock:
            self.calls -= 1
            self.outstanding -= 1
            self._tally.calls -= 1
            self._tally.reserved -= reserved
        self._settled()

    def settle(self, reserved: float, cost: float | None) -> None:
        """Replace a call's reservation by its real cost; an unknown cost keeps the worst case."""
        if cost is None or not math.isfinite(cost) or cost < 0:
            cost = reserved
        with self._tally.lock:
            self.outstanding -= 1
            self._tally.reserved -= reserved
            self._tally.cost += cost
        self._settled()

    def _settled(self) -> None:
        if self.on_settle is not None:
            self.on_settle()

    @property
    def waiting_on_reservations(self) -> bool:
        """True when this run's reserved calls may settle below their reservation and so free
        cost budget for another call."""
        return self.budget.cost is not None and self.outstanding > 0
