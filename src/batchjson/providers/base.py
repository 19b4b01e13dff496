"""The provider contract: one call in, raw text and usage out. Providers never validate."""

from __future__ import annotations

import asyncio
import inspect
import re
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

    def __init__(self, fn: Any, *, model: str | None = None) -> None:
        if not callable(fn):
            raise TypeError("CallableProvider needs a callable fn(call) -> str")
        self.fn = fn
        self.model = model or getattr(fn, "__name__", "callable")

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


# Settings that decide answers, read when a provider defines no ``source_key()``.
_ANSWER_SETTINGS = ("name", "model", "base_url", "temperature", "top_p", "max_tokens", "seed",
                    "response_format", "mode", "extra_body", "answer", "faults", "fn", "source")
_IMMUTABLE = (str, int, float, bool, type(None), bytes, tuple, frozenset)
_SECRET = re.compile(r"key|token|secret|passw|auth|cred", re.IGNORECASE)  # never read


def answer_source(provider: Any) -> str:
    """Where answers come from, as a stable key: part of every request key, so switching
    provider, model, endpoint or a sent setting never reuses another source's answers.

    The provider's class plus ``provider.source_key()`` when it defines one (each built-in
    provider does: base URL, model and every sent setting; an offline model's answer code, seed
    and fault plan). Otherwise the settings above that it has: values by content, functions
    and callable objects by their code (see :func:`_code_part`). Never API keys: nothing here
    reads them.
    """
    from ..canon import canonical_json
    from ..tasks import sha

    cls = type(provider)
    own = getattr(provider, "source_key", None)
    if callable(own):
        detail: Any = own()
    else:
        detail = {name: getattr(provider, name) for name in _ANSWER_SETTINGS
                  if hasattr(provider, name)}
    if not isinstance(detail, str):
        items = detail.items() if isinstance(detail, Mapping) else [("", detail)]
        detail = canonical_json({str(k): _code_part(v) for k, v in items})
    return f"{cls.__module__}.{cls.__qualname__}:{sha(detail)}"


def _code_part(value: Any, depth: int = 0) -> Any:
    """A value's part of an answer source: data by content, a function by its code fingerprint,
    a callable object by its class's code and the immutable attributes its own methods never
    assign (so a stub counting its calls keeps one key); what cannot be encoded by type."""
    from ..canon import Unhashable, content_hash
    from ..fingerprint import fingerprint_function

    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if not callable(value) or isinstance(value, _IMMUTABLE) or _frozen(value):
        try:  # a setting (extra_body, a fault plan) is data: keyed by its content
            return "data:" + content_hash(value)
        except Unhashable:
            return "type:" + kind
    if inspect.isfunction(value):
        return "code:" + fingerprint_function(_without_mutable_closure(value)).digest
    if inspect.ismethod(value) or isinstance(value, type):
        return "code:" + fingerprint_function(value).digest
    if callable(value) and depth < 3 and hasattr(value, "__dict__"):
        written = _assigned_attributes(type(value))
        state = {k: _code_part(v, depth + 1) for k, v in sorted(vars(value).items())
                 if k not in written and not _SECRET.search(k)
                 and (isinstance(v, _IMMUTABLE) or callable(v))}
        call = type(value).__call__
        return {"object": kind, "call": fingerprint_function(call).digest, "state": state}
    if callable(value):
        try:
            return "code:" + fingerprint_function(value).digest
        except Exception:
            return "type:" + kind
    return "type:" + kind


def _without_mutable_closure(fn: Any) -> Any:
    """``fn`` with closure cells holding mutable values (call logs, counters in a list or
    dict) replaced by their type name: state a stub writes is not where its answers come from."""
    import types

    cells = fn.__closure__
    if not cells:
        return fn
    kept = []
    for cell in cells:
        try:
            value = cell.cell_contents
        except ValueError:  # not yet assigned
            kept.append(cell)
            continue
        mutable = isinstance(value, (list, dict, set, bytearray)) or (
            not callable(value) and not isinstance(value, _IMMUTABLE) and not _frozen(value)
            and hasattr(value, "__dict__"))
        kept.append(types.CellType(f"<mutable {type(value).__name__}>") if mutable else cell)
    clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                               tuple(kept))
    clone.__kwdefaults__ = fn.__kwdefaults__
    clone.__qualname__, clone.__module__ = fn.__qualname__, fn.__module__
    return clone


def _frozen(value: Any) -> bool:
    params = getattr(type(value), "__dataclass_params__", None)
    return bool(params is not None and params.frozen)


def _assigned_attributes(cls: type) -> set[str]:
    """Attribute names a class's own methods assign on an instance outside ``__init__``: its
    run-time state (counters, call logs), which never decides an answer's source."""
    import dis

    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        for attr, member in vars(klass).items():
            code = getattr(getattr(member, "__func__", member), "__code__", None)
            if code is None or attr == "__init__":
                continue
            names.update(ins.argval for ins in dis.get_instructions(code)
                         if ins.opname in ("STORE_ATTR", "DELETE_ATTR"))
    return names
