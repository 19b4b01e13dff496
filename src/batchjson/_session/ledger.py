"""The public ``batchjson.Ledger``: the ledger's facade, with what the ledger itself cannot do
because it judges and prices nothing: the priced accounts (``accounts.py``), and the import and
merge that judge what they bring in (``recovery.py``, ``merge.py``)."""

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

    ``lease``: seconds a runner's claim on a request holds unless renewed (every third of it
    while the runner lives); a claim of a runner on another host that stopped renewing is
    taken over once it has expired. Default 30.
    """

    def spend(self, name: str | None = None) -> dict[str, Any]:
        """Calls, tokens and cost of every call ever made (for one batch or all): the same
        account as :meth:`cost_summary`, summed.

        A receipt whose call was never sent (cancelled before sending) is not a call; nor is a
        recheck. A call with no recorded cost (killed or interrupted before its answer, an error
        without usage, a model with no price) has an unknown cost: it is counted in
        ``unknown_cost_calls``, and ``cost_lower_bound_unknown`` is the least those calls cost
        (their prompt tokens at the model's input price); ``cost_lower_bound`` adds it to the
        known ``cost``.
        """
        return spend(self.store, name)

    def cost_summary(self, name: str | None = None) -> dict[str, Any]:
        """Per batch and in total: every attempt's calls, tokens and cost."""
        return cost_summary(self.store, name)

    def evidence(self, name: str | None = None) -> dict[str, Any]:
        """What is owed and what was spent (for one batch or all): ``Evidence.summary``."""
        return Evidence(self.store).summary(name)

    def import_receipts(self, path: str | Path, *, validators: Any = None,
                        without_validator: bool = False) -> dict[str, Any]:
        """Import historical receipts (JSONL), rechecking every item, by the validators given
        (name -> function) too; see docs/recovery.md."""
        with self.store.whole_or_nothing("the import"):
            return import_receipts(self.store, path, validators=validators,
                                   without_validator=without_validator)

    def merge(self, other: str | Path, *, validators: Any = None) -> dict[str, Any]:
        """Bring another ledger's batches, attempts and accepted values in (idempotent), each
        accepted attempt rechecked against its raw return (by ``validators`` too, name ->
        function, when given); see docs/recovery.md."""
        with self.store.whole_or_nothing("the merge"):
            return merge_ledger(self.store, other, validators)
