"""Helpers handed to cell code as plain functions: nothing a cell can reach from one (``__self__``,
``__wrapped__``, a closure) leads back to its owner, session or ledger."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

_OWNERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def tool(owner: Any, method: str) -> Callable[..., Any]:
    """``owner.<method>`` as a plain function a cell may be given: its name, signature and doc,
    and nothing that leads to ``owner`` (no ``__self__``, ``__wrapped__`` or closure over it)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_OWNERS[call], method)(*args, **kwargs)

    bound = getattr(owner, method)
    call.__name__ = call.__qualname__ = method
    call.__doc__ = bound.__doc__
    call.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
    _OWNERS[call] = owner
    return call


def owner_of(fn: Any) -> Any:
    """The object a :func:`tool` calls, or None for anything else (a name a cell rebound)."""
    return _OWNERS.get(fn)
