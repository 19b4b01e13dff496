"""batchjson: structured LLM batches that are safe to run from notebooks and RLM cells. Evidence
is keyed by content, and a return is committed only once the whole of it passes acceptance.

Everything a user needs is importable from here (docs/api.md); the modules behind it are private,
but for :mod:`batchjson.rlm` (RLM hosts), :mod:`batchjson.testing` (the simulated model and a
loopback OpenAI/Anthropic server) and :mod:`batchjson.core` (what faces use of the core)."""

from importlib import import_module
from typing import Any

from ._canon import show_as
from ._errors import (
    BatchJsonError,
    BatchUnresolved,
    BudgetExceeded,
    ConfigError,
    InvalidBatch,
    LedgerError,
    NotReady,
    ProviderError,
    ProviderNotConfigured,
    ProviderSetupError,
    RejectReturn,
    SubcallClientError,
    ValidatorChanged,
)
from ._ledger.records import Receipt
from ._providers.base import Call, CallableProvider, Provider, ProviderHandle, Reply
from ._providers.pricing import PRICES_AS_OF, Price, set_prices
from ._replay.budget import Budget
from ._replay.pacing import RateLimits
from ._session.accounts import Evidence
from ._session.estimate import Estimate
from ._session.ledger import Ledger
from ._session.registry import ValidatorRegistry
from ._session.result import BatchResult
from ._session.session import Session, default_session, set_default_session, validator
from ._session.spec import RunSpec
from .testing.simulated import FaultPlan, SimulatedModel

__version__ = "0.1.0"

__all__ = [
    # running batches
    "Session", "RunSpec", "BatchResult", "Estimate", "Budget", "RateLimits", "validator",
    "default_session", "set_default_session",
    # what a session holds
    "Ledger", "Receipt", "Evidence", "ValidatorRegistry",
    # providers and prices
    "Provider", "Call", "Reply", "CallableProvider", "ProviderHandle", "SimulatedModel",
    "FaultPlan", "OpenAIProvider", "AnthropicProvider", "Price", "set_prices", "PRICES_AS_OF",
    # the one exception tree
    "BatchJsonError", "InvalidBatch", "ConfigError", "ProviderNotConfigured",
    "ProviderSetupError", "LedgerError", "ProviderError", "SubcallClientError", "ValidatorChanged",
    "BudgetExceeded", "BatchUnresolved", "NotReady", "RejectReturn",
    # IPython
    "load_ipython_extension", "unload_ipython_extension",
]
show_as(__name__, *(value for name, value in list(globals().items())
                    if name in __all__ and isinstance(value, type)))


_HTTP_PROVIDERS = {"OpenAIProvider": "openai", "AnthropicProvider": "anthropic"}


def __getattr__(name: str) -> Any:
    """The HTTP providers load on first use (aiohttp), so ``import batchjson`` stays light."""
    if name in _HTTP_PROVIDERS:
        return getattr(import_module(f"._providers.{_HTTP_PROVIDERS[name]}", __name__), name)
    raise AttributeError(f"module 'batchjson' has no attribute {name!r}")


def load_ipython_extension(ipython):  # noqa: ANN001 - IPython's hook signature
    """``%load_ext batchjson``."""
    from ._ipython.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # noqa: ANN001
    """``%unload_ext batchjson``: the names it added leave the namespace."""
    from ._ipython.magics import unload_ipython_extension as unload

    unload(ipython)
