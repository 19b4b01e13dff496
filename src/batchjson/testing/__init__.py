"""Test helpers, offline: the simulated model (``simulated.py``: ``SimulatedModel``, ``FaultPlan``,
public as ``batchjson.SimulatedModel``) with the seeded generator it answers from, and a real
loopback HTTP server that speaks OpenAI and Anthropic, backed by it.

Public package. May import the providers and every layer below them; never the session, the
ledger or a face. The product needs none of it: only the root package's re-export and the
provider named "simulated" (``_providers/select.py``, when that name is chosen) import it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HTTP_FAULTS", "BatchFaults", "HttpFaults", "Limits", "LoopbackServer", "main"]


def __getattr__(name: str) -> Any:
    # Lazy, so ``python -m batchjson.testing.server`` does not import the module twice.
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
