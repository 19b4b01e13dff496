"""Turn a provider spec (name, object or None) into a provider; never pick one silently."""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable
from typing import Any

from .._errors import ProviderNotConfigured, ProviderSetupError
from .._secrets import check_name, shown_name, shown_value

PROVIDER_NAMES = ("openai", "anthropic", "simulated")
# Providers above this layer chosen by name (model -> provider): the simulated model, which
# ``batchjson.testing.simulated`` offers when imported, as the package root does.
OFFERED: dict[str, Callable[[str | None], Any]] = {}
# A plausible model id given as the provider gets a hint naming the provider it belongs to.
_MODEL_NAME = re.compile(r"^(gpt|o1|o3|o4|claude|llama)[A-Za-z0-9.:_\-]{0,60}$")


def provider_label(spec: Any) -> str:
    """A name for a provider spec, never its configuration nor a pasted key."""
    if isinstance(spec, str):
        return spec if spec.strip().lower() in PROVIDER_NAMES else shown_value(spec)
    return str(shown_name(getattr(spec, "name", type(spec).__name__)))


def make_provider(spec: Any, *, model: str | None = None) -> Any:
    """Resolve a name, an object with async complete, or ``None`` (``BATCHJSON_PROVIDER``, else
    ProviderNotConfigured: the offline model is never chosen for the user)."""
    source = "provider"
    if spec is None:
        spec = os.environ.get("BATCHJSON_PROVIDER", "").strip() or None
        if spec is None:
            raise ProviderNotConfigured()
        source = "BATCHJSON_PROVIDER"
    if isinstance(spec, str):
        return _named(spec, source, model)
    complete = getattr(spec, "complete", None)
    if callable(complete):
        if not _is_async(complete):
            raise ProviderSetupError(
                f"{type(spec).__name__}.complete is not async: the replay loop awaits it. "
                "Define it as 'async def complete(self, call)', or wrap a blocking function as "
                "CallableProvider(fn) with fn.blocking = True (it then runs in a thread).")
        return spec
    if callable(spec):
        raise ProviderSetupError(f"a {type(spec).__name__} is a callable, not a provider: wrap "
                                 "it as batchjson._providers.CallableProvider(fn) or give it an "
                                 "async complete(call) -> Reply method")
    raise ProviderSetupError(f"provider must be 'openai', 'anthropic', 'simulated' or an object "
                             f"with an async complete(call) -> Reply method; got "
                             f"{type(spec).__name__}. Add complete() to it or wrap a function "
                             "with CallableProvider(fn)")


def _named(spec: str, source: str, model: str | None) -> Any:
    check_name(model, "model", "pass the key as api_key=... (or set OPENAI_API_KEY / "
               "ANTHROPIC_API_KEY) and give the model's name as model=")
    name = spec.strip().lower()
    if name in ("openai", "anthropic"):
        from . import anthropic, openai

        return (openai.OpenAIProvider if name == "openai" else anthropic.AnthropicProvider)(model)
    if name in OFFERED:
        return OFFERED[name](model)
    hint = ""
    if _MODEL_NAME.match(name):
        family = "anthropic" if name.startswith("claude") else "openai"
        hint = f" That looks like a model name: pass provider={family!r}, model={spec.strip()!r}."
    raise ProviderNotConfigured(f"Unknown provider {shown_value(spec)} from {source} (known: "
                                f"{', '.join(PROVIDER_NAMES)}).{hint}")


def _is_async(complete: Any) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    call = getattr(type(complete), "__call__", None)  # noqa: B004 - the method, not callable()
    return inspect.iscoroutinefunction(complete) or inspect.iscoroutinefunction(call)
