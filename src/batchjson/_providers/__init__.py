"""Model providers: each turns a Call into raw text and usage; none of them validates."""

from typing import Any

from .base import Call, CallableProvider, Provider, Reply, close_provider
from .select import make_provider
from .simulated import FaultPlan, SimulatedModel

__all__ = ["AnthropicProvider", "Call", "CallableProvider", "FaultPlan", "OpenAIProvider",
           "Provider", "Reply", "SimulatedModel", "close_provider", "make_provider"]


def __getattr__(name: str) -> Any:
    """HTTP providers load on first use, so importing batchjson stays light."""
    if name == "OpenAIProvider":
        from .openai import OpenAIProvider

        return OpenAIProvider
    if name == "AnthropicProvider":
        from .anthropic import AnthropicProvider

        return AnthropicProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
