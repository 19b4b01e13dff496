"""A run's progress over ``tqdm.auto``: the tasks read and checked, then the tasks judged with
the returns, the cost against the budget and what the run waits on. The last state is the tasks
with a value, coloured by outcome: a run that ends with none accepted never shows a full bar."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

from .._money import usd
from .._replay.budget import Budget, Tally
from .._replay.plan import Outcome
from .result import BatchResult

COLOURS = {"resolved": "green", "pending": "yellow"}  # any other end (unresolved, stopped): red
READING_DELAY = 0.5  # seconds of reading before its count shows: a quick refusal prints only itself


def wanted(progress: bool | None) -> bool:
    """``None``: on where a person watches (a terminal or a Jupyter kernel), off in pipes."""
    if progress is not None:
        return progress
    stderr = sys.stderr
    return bool(getattr(stderr, "isatty", lambda: False)()) or type(
        stderr).__module__.startswith("ipykernel")


def _bar(**options: Any) -> Any:
    """A tqdm.auto bar, without tqdm's warning that the notebook widget is missing."""
    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        from tqdm.auto import tqdm

        return tqdm(unit="task", **options)


class Progress:
    """One run's progress; every method does nothing when it is off."""

    def __init__(self, name: str, progress: bool | None, budget: Budget, tally: Tally) -> None:
        self.name, self.budget, self.tally, self.note = name, budget, tally, ""
        self.outcome: Outcome | None = None  # the run's live counts, once its calls begin
        self.bar = _bar(desc=f"{name}: reading tasks", leave=False,
                        delay=READING_DELAY) if wanted(progress) else None

    @property
    def reading(self) -> Callable[[int], Any] | None:
        """What counts the tasks as they are read and checked (nothing to call when off)."""
        return None if self.bar is None else self.bar.update

    def checking(self) -> None:
        """Every task read: the ledger is looked at before any call."""
        bar = self.bar
        if bar is not None:
            bar.set_description_str(f"{self.name}: {bar.n:,} task(s) read, checking the ledger",
                                    refresh=bar.last_print_t >= bar.start_t + bar.delay)

    def calls(self, total: int, done: int, outcome: Outcome) -> None:
        """The calls begin, ``done`` of ``total`` tasks resolved already."""
        self.outcome = outcome
        if self.bar is not None:
            self.bar.close()  # the reading bar goes; the run's bar takes its line
            self.bar = _bar(desc=self.name, total=total, initial=done, leave=True,
                            postfix=self._counts())

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self._counts(), refresh=False)
            self.bar.update(n)

    def wait(self, note: str) -> None:
        """What the run waits on (a rate limit, a provider's job); ``""`` when it is over."""
        self.note = note
        if self.bar is not None and self.outcome is not None:
            self.bar.set_postfix_str(self._counts())

    def end(self, result: BatchResult | None) -> None:
        """The last state: the tasks with a value, named and coloured by the result's status
        (``None``: the run raised, and is shown stopped where it stood)."""
        if self.bar is not None and self.outcome is None and result is not None:
            self.calls(result.total_tasks, len(result.values), Outcome())  # nothing was sent
        bar, self.bar, self.note = self.bar, None, ""
        if bar is None or self.outcome is None:  # refused before any call: the error says why
            if bar is not None:
                bar.close()
            return
        status = "stopped" if result is None else result.status
        if result is not None:
            bar.n = len(result.values)
        bar.colour = COLOURS.get(status, "red")
        bar.set_description_str(f"{self.name} {status}", refresh=False)
        bar.set_postfix_str(self._counts(), refresh=False)
        bar.close()

    def _counts(self) -> str:
        outcome = self.outcome
        assert outcome is not None
        cost = "cost unknown" if outcome.cost is None else usd(outcome.cost)
        if self.budget.cost is not None:
            cost += f" (session {usd(self.tally.cost)} of {usd(self.budget.cost)} budget)"
        part = f"{outcome.partial_returns} in part, " if outcome.partial_returns else ""
        said = (f"returns: {outcome.accepted_returns} accepted, {part}"
                f"{outcome.rejected_returns} rejected, {cost}")
        return f"{said}; {self.note}" if self.note else said
