"""Model providers: each turns a Call into raw text and usage; none of them validates."""

from .base import Call, CallableProvider, Provider, Reply, close_provider
from .simulated import FaultPlan, SimulatedModel

__all__ = ["Call", "CallableProvider", "FaultPlan", "Provider", "Reply", "SimulatedModel",
           "close_provider"]
