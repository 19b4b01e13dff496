"""The public ``batchjson.Ledger``: the ledger's facade plus what needs judging or prices, which the
ledger itself never does: accounts (``accounts.py``), import and merge (``recovery.py``,
``merge.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._ledger import ledger
from .accounts import cost_summary, spend
from .evidence import Evidence
from .merge import merge_ledger
from .recovery import import_receipts


class Ledger(ledger.Ledger):
    """Thread-safe access to the ledger: a SQLite file (``path=None`` keeps it in memory) or a
    PostgreSQL database (``"postgresql://user@host/db"``) that runners on many hosts share.
    ``lease``: seconds a runner's claim holds unless renewed (default 30); an expired claim of a
    runner on another host is taken over."""

    def spend(self, name: str | None = None) -> dict[str, Any]:
        """Calls, tokens and cost of every call ever made (one batch or all): :meth:`cost_summary`
        summed. Calls with no recorded cost are counted in ``unknown_cost_calls``;
        ``cost_lower_bound_unknown`` is the least they cost, ``cost_lower_bound`` adds it to the
        known ``cost`` (docs/design.md, "Honest accounts")."""
        return spend(self.store, name)

    def cost_summary(self, name: str | None = None) -> dict[str, Any]:
        """Per batch and in total: every attempt's calls, tokens and cost."""
        return cost_summary(self.store, name)

    def evidence(self, name: str | None = None) -> dict[str, Any]:
        """What is owed and what was spent (for one batch or all): ``Evidence.summary``."""
        return Evidence(self).summary(name)

    def import_receipts(self, path: str | Path, *, validators: Any = None,
                        without_validator: bool = False) -> dict[str, Any]:
        """Import historical receipts (JSONL), rechecking every item, by the validators given
        (name -> function) too; see docs/recovery.md."""
        return import_receipts(self.store, path, validators=validators,
                               without_validator=without_validator)

    def merge(self, other: str | Path, *, validators: Any = None) -> dict[str, Any]:
        """Bring another ledger's batches, attempts and accepted values in (idempotent), each
        accepted attempt rechecked against its raw return (by ``validators`` too, name ->
        function, when given); see docs/recovery.md."""
        return merge_ledger(self.store, other, validators)
