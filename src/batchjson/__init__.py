"""batchjson: structured LLM batches that are safe to run from notebooks and RLM cells.

Evidence is keyed by content, validators are defined once per session, and a return is committed
only after the whole of it passes acceptance (coverage, identity, schema, caller validator).
"""

from ._budget import Budget
from ._errors import (
    BatchJsonError,
    BatchUnresolved,
    BudgetExceeded,
    InvalidBatch,
    ProviderError,
    ProviderNotConfigured,
    ValidatorChanged,
)
from ._providers.base import Call, CallableProvider, Reply
from ._providers.simulated import FaultPlan, SimulatedModel
from ._result import BatchResult
from ._session import Session, default_session, set_default_session, validator

__version__ = "0.1.0"

__all__ = [
    "BatchJsonError", "BatchResult", "BatchUnresolved", "Budget", "BudgetExceeded", "Call",
    "CallableProvider", "FaultPlan", "InvalidBatch", "ProviderError", "ProviderNotConfigured",
    "Reply", "Session", "SimulatedModel", "ValidatorChanged", "default_session",
    "set_default_session", "validator", "load_ipython_extension", "unload_ipython_extension",
]


def load_ipython_extension(ipython):  # noqa: ANN001 - IPython's hook signature
    """``%load_ext batchjson``."""
    from ._ipython.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):  # noqa: ANN001
    from ._ipython.magics import unload_ipython_extension as unload

    unload(ipython)
