"""Canonical validators: a re-executed RLM cell hands every call a new function object, so the
registry's first object for that content is rebound, at call time, to every name bound to the
duplicate (the function's ``__globals__``, the calling cell's locals, the host's namespaces).

For droste's own structured helpers, droste's code untouched: droste keys evidence by validator
identity, so before every cell the wrapper re-wraps the helpers ``run_rlm`` bound, handing droste
the first object registered with the same content."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any

from .. import ConfigError, Session, ValidatorRegistry
from ..core import ValidatorVersion

__all__ = ["CanonicalValidatorsEnvironment", "canonical_version", "cell_frame",
           "droste_environment"]

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


def canonical_version(registry: ValidatorRegistry, fn: Callable[..., Any], *,
                      namespaces: Iterable[MutableMapping[str, Any]] = (),
                      frame: types.FrameType | None = None,
                      name: str | None = None, hand_over: bool = False) -> ValidatorVersion:
    """Register ``fn`` and rebind every duplicate to the canonical object for its content (the
    version's ``fn``); a changed validator is a new version (a strict registry may refuse it).
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


STRUCTURED_HELPERS = ("llm_batch_json", "llm_query_batched_json")
_VALIDATOR_POSITION = 4  # droste: (prompts, schema, contexts, max_repair_attempts, validator)


def droste_environment(environment: Any, *, session: Session | None = None,
                       registry: ValidatorRegistry | None = None
                       ) -> CanonicalValidatorsEnvironment:
    """Wrap any droste ``RLMEnvironment`` so its structured helpers get canonical validators;
    ``session=`` shares that session's registry (one validator object for batchjson and droste)."""
    wanted = registry if registry is not None else (
        session.validators if session is not None else None)
    if isinstance(environment, CanonicalValidatorsEnvironment):  # wrapping twice: once
        if wanted is not None and wanted is not environment.validators:
            raise ConfigError(
                "this environment is already wrapped by droste_environment with another "
                "validator registry; wrap the unwrapped environment once, passing session= "
                "(or registry=) the first time, so batchjson and droste share one validator")
        return environment
    return CanonicalValidatorsEnvironment(
        environment, wanted if wanted is not None else ValidatorRegistry())


class CanonicalValidatorsEnvironment:
    """Delegates everything to the wrapped environment; ``execute`` first re-wraps helpers."""

    def __init__(self, environment: Any, registry: ValidatorRegistry) -> None:
        self.environment = environment
        self.validators = registry
        self._wrappers: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}

    def __getattr__(self, name: str) -> Any:  # globals, capabilities, close, broker, ...
        return getattr(self.environment, name)

    def execute(self, code: str) -> Any:
        self.install()
        return self.environment.execute(code)

    def install(self) -> None:
        """Wrap whatever structured helpers the globals hold now (droste rebinds them)."""
        scope = self.environment.globals()
        for name in STRUCTURED_HELPERS:
            current = scope.get(name)
            if callable(current) and not getattr(current, "__batchjson_canonical__", False):
                scope[name] = self._wrap(current)

    def _wrap(self, helper: Callable[..., Any]) -> Callable[..., Any]:
        known = self._wrappers.get(id(helper))
        if known is not None and known[0] is helper:
            return known[1]
        registry, scope = self.validators, self.environment.globals

        def canonical_helper(*args: Any, **kwargs: Any) -> Any:
            frame, at = cell_frame(2), _VALIDATOR_POSITION

            def canonical(fn: Callable[..., Any]) -> Callable[..., Any]:
                return canonical_version(registry, fn, namespaces=[scope()], frame=frame).fn

            if callable(kwargs.get("validator")):
                kwargs["validator"] = canonical(kwargs["validator"])
            elif len(args) > at and callable(args[at]):
                args = (*args[:at], canonical(args[at]), *args[at + 1:])
            return helper(*args, **kwargs)

        canonical_helper.__batchjson_canonical__ = True  # type: ignore[attr-defined]
        canonical_helper.__name__ = getattr(helper, "__name__", "llm_batch_json")
        canonical_helper.__doc__ = getattr(helper, "__doc__", None)
        canonical_helper.__wrapped__ = helper  # type: ignore[attr-defined]
        self._wrappers[id(helper)] = (helper, canonical_helper)  # keeps helper alive: id stable
        return canonical_helper
