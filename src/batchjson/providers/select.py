"""Turn a provider spec (name, object or None) into a provider; never pick one silently."""

from __future__ import annotations

import os
from typing import Any

from ..errors import ProviderNotConfigured

PROVIDER_NAMES = ("openai", "anthropic", "simulated")


def provider_label(spec: Any) -> str:
    """A name for a provider spec; never its configuration (API keys stay inside it)."""
    return spec if isinstance(spec, str) else getattr(spec, "name", type(spec).__name__)


def make_provider(spec: Any, *, model: str | None = None) -> Any:
    """Resolve ``spec``: "openai" | "anthropic" | "simulated" | an object with async complete.

    ``None`` falls back to the BATCHJSON_PROVIDER environment variable and, failing that, raises
    ProviderNotConfigured: the offline model is never chosen for the user.
    """
    source = "provider"
    if spec is None:
        spec = os.environ.get("BATCHJSON_PROVIDER", "").strip() or None
        if spec is None:
            raise ProviderNotConfigured()
        source = "BATCHJSON_PROVIDER"
    if isinstance(spec, str):
        name = spec.strip().lower()
        if name == "openai":
            from .openai import OpenAIProvider

            return OpenAIProvider(model)
        if name == "anthropic":
            from .anthropic import AnthropicProvider

            return AnthropicProvider(model)
        if name == "simulated":
            from .simulated import SimulatedModel

            return SimulatedModel(model=model) if model else SimulatedModel()
        hint = ""
        if any(name.startswith(p) for p in ("gpt", "o1", "o3", "o4", "claude", "llama")):
            family = "anthropic" if name.startswith("claude") else "openai"
            hint = (f" That looks like a model name: pass provider={family!r}, "
                    f"model={spec!r}.")
        raise ProviderNotConfigured(f"Unknown provider {spec!r} from {source} (known: "
                                    f"{', '.join(PROVIDER_NAMES)}).{hint}")
    if callable(getattr(spec, "complete", None)):
        return spec
    if callable(spec):
        raise TypeError(f"{spec!r} is a callable, not a provider: wrap it as "
                        "batchjson.providers.CallableProvider(fn) or give it an async "
                        "complete(call) -> Reply method")
    raise TypeError(f"provider must be 'openai', 'anthropic', 'simulated' or an object with an "
                    f"async complete(call) -> Reply method; got {type(spec).__name__}. Add "
                    "complete() to it or wrap a function with CallableProvider(fn)")
