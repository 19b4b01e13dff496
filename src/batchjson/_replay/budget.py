"""Call and cost budgets: each call's worst case reserved before it, settled after, on one
session-wide :class:`Tally`, so the budget holds at any concurrency."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any

from pydantic import Field, PlainValidator

from .._checks import options
from .._errors import BudgetExceeded, ConfigError, InvalidBatch
from .._money import cost_value, usd
from .._providers.settings import declared_output_cap


@options(InvalidBatch, prefix="budget ")
class Budget:
    """A session's ceiling: ``calls`` and/or ``cost`` (USD; None: unlimited), checked when made."""

    calls: Annotated[int | None, Field(ge=0, description="a whole number >= 0 (or None for "
                                               "no limit)")] = None
    cost: Annotated[float | None, PlainValidator(cost_value)] = None

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
    """What a cost budget needs: USD per million tokens, and the most output tokens of a call."""

    model: str | None
    input: float | None
    output: float | None
    max_output_tokens: int | None = None
    cache_write: float = 0.0  # an input token written to a prompt cache may cost more (Anthropic)

    @property
    def priced(self) -> bool:
        return self.input is not None and self.output is not None

    def worst_case(self, input_bound: int) -> float:
        """The most one call can cost: its input at the dearest input rate, and a full answer."""
        return ((input_bound * max(self.input or 0.0, self.cache_write))
                + (self.max_output_tokens or 0) * (self.output or 0.0)) / 1e6

    def floor(self, input_tokens: int) -> float | None:
        """An estimate of the least one sent call costs (None if unpriced)."""
        return None if self.input is None else input_tokens * self.input / 1e6

    def cost(self, input_tokens: int | None, output_tokens: int | None) -> float | None:
        if not self.priced or input_tokens is None or output_tokens is None:
            return None
        return (input_tokens * (self.input or 0.0) + output_tokens * (self.output or 0.0)) / 1e6


def pricing_of(provider: Any) -> Pricing:
    """The provider's prices (``price_for_budget()``) and output ceiling."""
    model = getattr(provider, "model", None)
    ask = getattr(provider, "price_for_budget", None)
    price = ask() if callable(ask) else None
    cap = declared_output_cap(provider)
    if price is None:
        return Pricing(model, None, None, cap)
    return Pricing(model, float(price.input), float(price.output), cap,
                   float(getattr(price, "cache_write", None) or 0.0))


@dataclass(eq=False)
class Tally:
    """A session's spend: ``reserved`` by unsettled calls, ``cost`` by settled ones; once a call
    bills beyond its worst case, ``unbounded`` says why."""

    calls: int = 0
    cost: float = 0.0
    reserved: float = 0.0
    settled: int = 0
    overrun: float = 0.0
    unbounded: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def forgo(self, reserved: float) -> None:
        """A job line this session reserved that another runner recorded and charged: held no
        more (a run's own counts never held it: it was reserved by the run that submitted)."""
        with self.lock:
            self.calls -= 1
            self.reserved -= reserved

    def keep(self, reserved: float) -> None:
        """A job line this session reserved whose answer never came but may be billed (its job
        cancelled while uncertain): charged its worst case, as the ledger keeps it."""
        with self.lock:
            self.reserved -= reserved
            self.cost += reserved
            self.settled += 1


def charge_of(reserved: float, cost: float | None) -> float:
    """What a settled call is charged: its cost, or its worst case when that is unknown."""
    return cost if cost is not None and math.isfinite(cost) and cost >= 0 else reserved


class Spender:
    """What one run may still spend, against its max_calls, the session's ``tally`` (charged at
    once, so an interrupted run still counts) and ``shared``, the ledger's own budget."""

    def __init__(self, max_calls: int | None, budget: Budget, tally: Tally,
                 pricing: Pricing | None = None, *,
                 shared: Mapping[str, Any] | None = None) -> None:
        self.max_calls = max_calls
        self.budget = budget
        self.shared = shared
        self.calls = 0
        self.outstanding = 0  # this run's reservations not yet settled or released
        self.on_settle: Callable[[], None] | None = None
        self._tally = tally
        self.pricing = pricing or Pricing(None, None, None)
        if not self.costed:
            return
        name = self.pricing.model or "this provider's model"
        what = "a cost budget" if budget.cost is not None else "the ledger's cost budget"
        if not self.pricing.priced:
            raise ConfigError(
                f"{what} needs the model's price, and {name!r} has none, so its spend "
                "could not be held; nothing was spent. Set a price (USD per million tokens) "
                f"with batchjson.set_prices({{{name!r}: {{'input': ..., "
                "'output': ...}}) or the provider's prices= argument, or use a calls budget.")
        if self.pricing.max_output_tokens is None:
            raise ConfigError(
                f"{what} needs each call's output ceiling, and {name!r} is called "
                "without one, so a single answer could bill any number of tokens; nothing was "
                "spent. Set max_tokens: CallableProvider(..., max_tokens=N), "
                "AnthropicProvider(max_tokens=N), OpenAIProvider(extra_body="
                "{'max_completion_tokens': N}), or use a calls budget.")

    @property
    def costed(self) -> bool:
        """Whether each call's worst case is reserved (the session's or the ledger's budget)."""
        return self.budget.cost is not None or self.shared is not None

    def remaining_calls(self) -> int | None:
        limits = [limit - used for limit, used in ((self.max_calls, self.calls),
                                                   (self.budget.calls, self._tally.calls))
                  if limit is not None]
        return max(0, min(limits)) if limits else None

    def refuse_if_short(self, needed: int,
                        cheapest: Callable[[float], float | None] | None = None) -> None:
        """Refuse before spending when ``needed`` calls or the cheapest next one cannot fit."""
        remaining = self.remaining_calls()
        if remaining is not None and needed > remaining:
            raise BudgetExceeded(needed, remaining)
        if self.shared is not None and needed and cheapest is not None:
            # what calls in flight on other hosts hold may come back: only what is spent counts
            room = self.shared["cost"] - self.shared["spent"]
            worst = cheapest(room)
            if worst is not None and worst > room:
                raise BudgetExceeded(needed, 0, one_call=worst, message=(
                    f"budget refused: one call may cost up to {usd(worst)}, and the ledger's "
                    f"cost budget of {usd(self.shared['cost'])} has {usd(self.shared['left'])} "
                    f"left ({usd(self.shared['spent'])} spent, {usd(self.shared['reserved'])} "
                    "held by calls in flight on every host); raise it with batchjson budget "
                    "--cost USD; nothing was spent."))
        if self.budget.cost is None or not needed or cheapest is None:
            return
        if self._tally.unbounded is not None:
            raise BudgetExceeded(needed, 0, message=(
                f"budget refused: {self._tally.unbounded}; nothing was spent."))
        left = self.budget.cost - self._tally.cost - self._tally.reserved
        worst = cheapest(left)
        if worst is None or worst <= left:
            return
        spent = self._tally.cost + self._tally.reserved
        held = f" (of which {usd(spent)} is spent or held by calls in flight)" if spent else ""
        raise BudgetExceeded(needed, 0, one_call=worst, message=(
            f"budget refused: one call may cost up to {usd(worst)} (its input, counted as "
            f"the bytes it sends, plus max_tokens={self.pricing.max_output_tokens} of output at "
            f"{self.pricing.model or 'the model'}'s prices); the budget is "
            f"{usd(self.budget.cost)}{held}. Raise the cost budget, lower max_tokens or "
            "pack fewer tasks per call; nothing was spent."))

    def shortfall(self, input_bound: int) -> str:
        """Why a call of ``input_bound`` input tokens cannot be reserved, in words."""
        if self.remaining_calls() == 0:
            return "no calls left"
        if self._tally.unbounded is not None:
            return self._tally.unbounded
        left = max(0.0, (self.budget.cost or 0.0) - self._tally.cost - self._tally.reserved)
        return (f"one call for it may cost up to {usd(self.pricing.worst_case(input_bound))} "
                f"and the cost budget has {usd(left)} left")

    def reserve(self, input_bound: int, *, alone: bool = True) -> float | None:
        """Reserve one call's worst case; None if it cannot fit (``alone``: a first call alone)."""
        worst = self.pricing.worst_case(input_bound) if self.costed else 0.0
        with self._tally.lock:
            if self.remaining_calls() == 0 or self.stopped is not None:
                return None  # (a call billed beyond its worst case: no bound holds any more)
            if self.budget.cost is not None and (
                    (alone and self.outstanding and not self._tally.settled)
                    or self._tally.cost + self._tally.reserved + worst > self.budget.cost):
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
        if self.on_settle is not None:
            self.on_settle()

    def forgo(self, reserved: float) -> None:
        """:meth:`Tally.forgo` of the session's tally."""
        self._tally.forgo(reserved)
        if self.on_settle is not None:
            self.on_settle()

    def settle(self, reserved: float | None, cost: float | None,
               why: Callable[[], str] | None = None) -> float:
        """Replace a call's reservation by its cost (unknown: the worst case); what it billed
        beyond it (then the cost budget closes, ``why()`` saying why). ``reserved`` None: a job
        line another process reserved, charged its cost as it stands."""
        if reserved is None:
            with self._tally.lock:
                self._tally.calls += 1
                self._tally.cost += charge_of(0.0, cost)
            return 0.0
        cost = charge_of(reserved, cost)
        beyond = (cost - reserved if self.costed
                  and cost > reserved * (1 + 1e-9) else 0.0)  # float noise is no overrun
        with self._tally.lock:
            self.outstanding -= 1
            self._tally.settled += 1
            self._tally.reserved -= reserved
            self._tally.cost += cost
            if beyond:
                self._tally.overrun += beyond
                if self._tally.unbounded is None:
                    self._tally.unbounded = (
                        f"a call billed {usd(cost)}, {usd(beyond)} beyond the {usd(reserved)} "
                        f"reserved for it{f' ({why()})' if why else ''}, so the provider does "
                        "not hold the output ceiling or the price a cost budget reserves by, "
                        "and no further call is opened under it. Use a server that honours "
                        "the ceiling (some read only max_tokens), check the model's price, or "
                        "use a calls budget")
        if self.on_settle is not None:
            self.on_settle()
        return beyond

    @property
    def stopped(self) -> str | None:
        """Why the cost budget opens no further call (a call billed beyond its reservation)."""
        return self._tally.unbounded if self.costed else None


def batch_pricing(pricing: Pricing, factor: float) -> Pricing:
    """The prices of a provider batch job: every rate times ``factor``."""
    scaled = [None if rate is None else rate * factor for rate in (pricing.input, pricing.output)]
    return replace(pricing, input=scaled[0], output=scaled[1],
                   cache_write=pricing.cache_write * factor)
