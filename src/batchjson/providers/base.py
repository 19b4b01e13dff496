"""The provider contract: one call in, raw text and usage out. Providers never validate."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import ProviderError


@dataclass(frozen=True)
class Call:
    """Everything a provider needs for one request attempt.

    ``mode`` is ``"items"`` (return ``{"items": [...]}``, one object per task) or
    ``"value"`` (return one bare JSON value, the droste-compatible helper).
    """

    tasks: tuple[Mapping[str, Any], ...]
    prompt: str
    system: str
    schema: Mapping[str, Any]
    attempt: int
    kind: str
    request_key: str
    mode: str = "items"
    identity: tuple[str, ...] = ("task_id",)


@dataclass
class Reply:
    """The raw text a provider returned, with usage as the provider reported it."""

    text: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost: float | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return (self.input_tokens or 0) + (self.output_tokens or 0)


@runtime_checkable
class Provider(Protocol):
    """Anything with an async ``complete(call) -> Reply``."""

    name: str

    async def complete(self, call: Call) -> Reply: ...


async def close_provider(provider: Any) -> None:
    """Close a provider's pooled resources if it holds any."""
    closer = getattr(provider, "aclose", None)
    if closer is not None:
        await closer()


def estimate_tokens(text: str) -> int:
    """A deterministic stand-in for tokenisation where a provider reports none."""
    return max(1, len(text) // 4)


class CallableProvider:
    """Wrap ``fn(call) -> str | Reply`` (sync or async) as a provider, for tests and glue code."""

    name = "callable"

    def __init__(self, fn: Any, *, model: str | None = None, price: Any = None,
                 max_tokens: int | None = None) -> None:
        if not callable(fn):
            raise TypeError("CallableProvider needs a callable fn(call) -> str")
        self.fn = fn
        self.model = model or getattr(fn, "__name__", "callable")
        from .pricing import as_price  # the price table imports errors only; kept local

        self.price = None if price is None else as_price(price)
        self.max_tokens = max_tokens

    def price_for_budget(self) -> Any:
        """USD per million tokens for cost budgets (``price=``), or None: unpriced."""
        return self.price

    async def complete(self, call: Call) -> Reply:
        out = await asyncio.to_thread(self.fn, call) if _is_blocking(self.fn) else self.fn(call)
        if inspect.isawaitable(out):  # async functions and objects with an async __call__
            out = await out
        if isinstance(out, Reply):
            return out
        if not isinstance(out, str):
            raise ProviderError(
                f"callable provider returned {type(out).__name__}, expected str or Reply",
                retryable=False,
            )
        return Reply(
            text=out,
            input_tokens=estimate_tokens(call.prompt),
            output_tokens=estimate_tokens(out),
            model=self.model,
        )


def _is_blocking(fn: Any) -> bool:
    """Callables opt in to a worker thread with ``fn.blocking = True``."""
    return bool(getattr(fn, "blocking", False))
