"""Prompt caching: which part of a batch's requests is shared, and when it is long enough to cache.

A provider caches a prefix only past a model-dependent length and only if every byte before it is
identical, so when the shared part is long enough the wire schema is sent batch-constant instead of
pinning each request's identity values (acceptance checks them either way)."""

from __future__ import annotations

import hashlib
from typing import Any

from .base import estimate_tokens

# Anthropic's minimum cacheable prompt, in tokens, by model family (longest prefix first);
# a shorter prefix marked with cache_control is simply not cached. Unlisted models are taken
# at the largest minimum, so a newer model never gets the constant schema without its cache.
ANTHROPIC_CACHE_MINIMUM: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096), ("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
    ("claude-sonnet-4-5", 1024), ("claude-opus-4-1", 1024), ("claude-opus-4", 1024),
    ("claude-sonnet-4", 1024), ("claude-3-7-sonnet", 1024),
)
ANTHROPIC_UNLISTED_MINIMUM = 4096
OPENAI_CACHE_MINIMUM = 1024  # automatic prompt caching, from 1,024 tokens of identical prefix
CACHE_CONTROL = {"type": "ephemeral"}  # the 5-minute cache (writes 1.25x input, reads 0.1x)


def cache_minimum(provider: Any) -> int | None:
    """The fewest prefix tokens ``provider``'s API caches, or None when it has no prompt
    cache batchjson knows of (a callable, the simulated model)."""
    provider = getattr(provider, "inner", provider)  # a run's guard around the real one
    name, model = getattr(provider, "name", None), str(getattr(provider, "model", "") or "")
    if name == "openai":
        return OPENAI_CACHE_MINIMUM
    if name == "anthropic":
        return anthropic_cache_minimum(model)
    return None


def anthropic_cache_minimum(model: str) -> int:
    """The fewest tokens Anthropic caches for ``model`` (the table above)."""
    return next((least for family, least in ANTHROPIC_CACHE_MINIMUM
                 if model.startswith(family)), ANTHROPIC_UNLISTED_MINIMUM)


def prefix_cacheable(provider: Any, system: str, shared: str) -> bool:
    """Whether the batch's shared prefix (system text and instructions) is long enough for
    ``provider`` to cache (its tokens estimated as a provider's limiter does, chars / 4)."""
    least = cache_minimum(provider)
    return least is not None and estimate_tokens(system + shared) >= least


def prompt_cache_key(system: str, shared: str) -> str:
    """OpenAI's ``prompt_cache_key``: the same for every request sharing this prefix, so they
    are routed to the same cache."""
    return "batchjson-" + hashlib.sha256((system + "\x00" + shared).encode()).hexdigest()[:24]
