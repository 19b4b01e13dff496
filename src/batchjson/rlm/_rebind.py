"""Call-time canonical validators: a re-executed RLM cell hands every call a new function object, so
the registry's first object for that content is rebound to every name bound to the duplicate (the
function's ``__globals__``, the calling cell's locals, the host's namespaces)."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from .. import ValidatorRegistry
from ..core import ValidatorVersion

__all__ = ["canonical_validator", "canonical_version", "cell_frame"]

_FRAMES_UP = 8  # how far a helper called from a cell's own helper function looks for the cell


def cell_frame(depth: int = 2) -> types.FrameType | None:
    """The nearest calling frame that runs cell code (module level: its locals are a dict)."""
    try:
        frame: types.FrameType | None = sys._getframe(depth)
    except ValueError:  # called from the bottom of a thread's stack: no cell above
        return None
    for _ in range(_FRAMES_UP):
        if frame is None:
            return None
        if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            return frame
        frame = frame.f_back
    return None


def canonical_validator(registry: ValidatorRegistry, fn: Callable[..., Any], *,
                        namespaces: Iterable[MutableMapping[str, Any]] = (),
                        frame: types.FrameType | None = None,
                        name: str | None = None) -> Callable[..., Any]:
    """Register ``fn`` and return the canonical object for its content, rebinding duplicates; a
    changed validator is a new version (a strict registry may refuse it)."""
    return canonical_version(registry, fn, namespaces=namespaces, frame=frame, name=name).fn


def canonical_version(registry: ValidatorRegistry, fn: Callable[..., Any], *,
                      namespaces: Iterable[MutableMapping[str, Any]] = (),
                      frame: types.FrameType | None = None,
                      name: str | None = None, hand_over: bool = False) -> ValidatorVersion:
    """Like :func:`canonical_validator`, returning the version record (name, fingerprint);
    ``hand_over``: for the run this call is on its way to (see ``version_of``)."""
    version = registry.version_of(fn, name, hand_over=hand_over)
    canonical = version.fn
    if canonical is fn:
        return version
    targets: list[MutableMapping[str, Any]] = []
    found = getattr(fn, "__globals__", None)
    if isinstance(found, MutableMapping):
        targets.append(found)
    if frame is not None and isinstance(frame.f_locals, MutableMapping):
        targets.append(frame.f_locals)
    targets.extend(namespaces)
    seen: set[int] = set()
    for target in targets:
        if id(target) in seen:
            continue
        seen.add(id(target))
        for key, value in list(target.items()):
            if value is fn:
                target[key] = canonical
    return version
