"""The public ``batchjson.Ledger``: the ledger's facade, with the import and merge that judge
what they bring in (``recovery.py``, ``merge.py``), which the ledger itself cannot do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._ledger import ledger
from .merge import merge_ledger
from .recovery import import_receipts


class Ledger(ledger.Ledger):
    __doc__ = ledger.Ledger.__doc__

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
