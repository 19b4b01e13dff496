"""Content fingerprints for validators and data.

An RLM engine keys evidence on validator *object identity*, so a cell re-executed after an error
defines a new function object and orphans the evidence recorded under the old one. batchjson keys
validators by *content*: the same code, defaults, closure values and referenced globals give the
same digest, in this process or any other, wherever the function was defined.
"""

from __future__ import annotations

import functools
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from pydantic import BaseModel

from .canon import (
    _BUILTIN_CALLABLES,
    _VALUE_TYPES,
    Unhashable,
    _Canon,
    _digest,
    _dump,
    _qualname,
    canonical_json,
    content_hash,
)

__all__ = ["Fingerprint", "Unhashable", "canonical_json", "content_hash", "describe_changes",
           "fingerprint_function"]

@dataclass(frozen=True)
class Fingerprint:
    """Content identity of a callable: equal digests mean interchangeable validators.

    Objects compared by identity are pinned (kept alive) so their ids cannot be reused by a
    different object while this fingerprint exists.
    """

    digest: str
    by_identity: tuple[str, ...] = ()
    parts: tuple[tuple[str, str], ...] = ()
    _pins: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    @property
    def stable(self) -> bool:
        """True when the digest means the same thing in every process."""
        return not self.by_identity

    @property
    def short(self) -> str:
        return self.digest[:12]


class _Node(NamedTuple):
    digest: str
    parts: tuple[tuple[str, str], ...]
    by_identity: tuple[str, ...]


def _code_canon(code: types.CodeType) -> Any:
    """What the code does, without where it was written (file, line, names, line tables).

    ``from __future__`` bits (0x20000 and up) are masked: compile() and IPython inherit them from
    earlier code, and their effect on behaviour is already in the bytecode.
    """
    return ("code", code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
            code.co_flags & 0xFFFF, code.co_code, [_const_canon(c) for c in code.co_consts],
            list(code.co_names), list(code.co_varnames), list(code.co_freevars),
            list(code.co_cellvars), code.co_exceptiontable)


def _const_canon(c: Any) -> Any:
    if isinstance(c, types.CodeType):
        return _code_canon(c)
    if type(c) is tuple:
        return ("t", [_const_canon(x) for x in c])
    if type(c) is frozenset:
        return ("f", sorted(_dump(_const_canon(x)) for x in c))
    if type(c) is complex:
        return ("j", c.real, c.imag)
    return ("...",) if c is Ellipsis else c


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _merge(inner: list[tuple[str, str]], own: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if {n for n, _ in inner} & {n for n, _ in own}:
        inner = [(f"func.{n}", d) for n, d in inner]
    return inner + own


class _Walker:
    """One fingerprint computation: cycle guard, memo tables and identity fallbacks."""

    def __init__(self, home: str | None) -> None:
        self.home = home  # module of the root callable: its classes/functions go by content
        self.index: dict[int, int] = {}  # id -> stack position of objects being fingerprinted
        self.low: list[int] = []  # per stack frame: lowest stack position it refers back to
        self.memo: dict[int, _Node] = {}
        self.data_memo: dict[int, str] = {}
        self.pins: list[Any] = []  # identity-compared objects: kept alive by the Fingerprint
        self.alive: list[Any] = []  # memo keys are ids: keep their objects alive for the walk
        self.identity: list[str] = []
        self.label = ""
        self.hook_calls = 0
        self.canon = _Canon(self._hook)

    def node(self, obj: Any) -> _Node:
        key = id(obj)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        pos = len(self.low)
        self.index[key] = pos
        self.low.append(pos)
        saved_identity, saved_label = self.identity, self.label
        self.identity = []
        try:
            kind, parts = self._build(obj)
            node = _Node(_digest("batchjson:fp:1", [kind, parts]), tuple(parts),
                         tuple(self.identity))
        finally:
            self.identity, self.label = saved_identity, saved_label
            del self.index[key]
            low = self.low.pop()
            if self.low:
                self.low[-1] = min(self.low[-1], low)
        if low >= pos:  # no back-reference escapes this subtree: its digest is context-free
            self.memo[key] = node
            self.alive.append(obj)
        return node

    def _cycle(self, pos: int) -> Any:
        self.low[-1] = min(self.low[-1], pos)
        return ("cycle", len(self.low) - 1 - pos)  # relative distance: independent of depth

    def ref(self, value: Any, label: str) -> str:
        """Digest of a referenced value: by content if possible, else by identity."""
        cached = self.data_memo.get(id(value))
        if cached is not None:
            return cached
        saved, self.label = self.label, label
        calls, start = self.hook_calls, len(self.identity)
        try:
            digest = _digest("batchjson:value:1", self.canon.value(value))
        except (Unhashable, RecursionError):
            del self.identity[start:]
            return self._by_identity(value, label)
        finally:
            self.label = saved
        if self.hook_calls == calls:  # pure data: safe to reuse wherever it is referenced
            self.data_memo[id(value)] = digest
            self.alive.append(value)
        return digest

    def _by_identity(self, value: Any, label: str) -> str:
        self.pins.append(value)
        self.identity.append(label)
        return _digest("batchjson:id:1", [_qualname(type(value)), f"{id(value):x}"])

    def _hook(self, x: Any) -> Any:
        """Canon extension for non-data values met while fingerprinting."""
        self.hook_calls += 1
        if isinstance(x, types.ModuleType):
            return ("module", x.__name__)
        pos = self.index.get(id(x))
        if pos is not None:
            return self._cycle(pos)
        if isinstance(x, re.Pattern):
            return ("re", x.pattern, x.flags)
        if isinstance(x, _VALUE_TYPES):
            return ("repr", _qualname(type(x)), repr(x))
        if callable(x) or isinstance(x, type) or (
            hasattr(x, "__dict__") and not self._importable(type(x))
        ):  # library objects' state is opaque and often churns (caches): identity instead
            node = self.node(x)
            self.identity.extend(f"{self.label}>{name}" for name in node.by_identity)
            return ("node", node.digest)
        raise Unhashable(f"cannot content-hash a {_qualname(type(x))}")

    def _inner(self, fn: Any) -> list[tuple[str, str]]:
        pos = self.index.get(id(fn))
        if pos is not None:
            return [("func", _digest("batchjson:cycle:1", self._cycle(pos)))]
        node = self.node(fn)
        self.identity.extend(node.by_identity)
        return list(node.parts)

    def _importable(self, obj: Any) -> bool:
        """Library objects reachable by module.qualname go by name; their code is installed."""
        module = getattr(obj, "__module__", None)
        if not isinstance(module, str) or module in ("__main__", self.home):
            return False
        target: Any = sys.modules.get(module)
        for attr in getattr(obj, "__qualname__", "<none>").split("."):
            target = getattr(target, attr, None)
        return target is obj

    def _build(self, obj: Any) -> tuple[str, list[tuple[str, str]]]:
        if isinstance(obj, type):
            return "class", self._class(obj)
        if isinstance(obj, _BUILTIN_CALLABLES) or (
            isinstance(obj, types.FunctionType) and self._importable(obj)
        ):
            name = [getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)]
            parts = [("ref", _digest("batchjson:ref:1", name))]
            owner = getattr(obj, "__self__", None)
            if owner is not None and not isinstance(owner, types.ModuleType):
                parts.append(("self", self.ref(owner, "self")))
            return "builtin", parts
        if isinstance(obj, types.FunctionType):
            return "function", self._function(obj)
        if isinstance(obj, functools.partial):
            own = [("partial:args", self.ref(obj.args, "partial:args")),
                   ("partial:keywords", self.ref(obj.keywords, "partial:keywords"))]
            return "partial", _merge(self._inner(obj.func), own)
        if isinstance(obj, types.MethodType):
            own = [("self", self.ref(obj.__self__, "self"))]
            return "method", _merge(self._inner(obj.__func__), own)
        return "instance", self._instance(obj)

    def _function(self, fn: types.FunctionType) -> list[tuple[str, str]]:
        code = fn.__code__
        parts = [("code", _digest("batchjson:code:1", _code_canon(code)))]
        if fn.__defaults__:
            parts.append(("defaults", self.ref(fn.__defaults__, "defaults")))
        if fn.__kwdefaults__:
            parts.append(("kwdefaults", self.ref(fn.__kwdefaults__, "kwdefaults")))
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                value = cell.cell_contents
            except ValueError:  # not yet assigned
                parts.append((f"closure:{name}", _digest("batchjson:empty:1", None)))
                continue
            parts.append((f"closure:{name}", self.ref(value, f"closure:{name}")))
        found, builtin_ns = fn.__globals__, fn.__builtins__
        if isinstance(builtin_ns, types.ModuleType):
            builtin_ns = vars(builtin_ns)
        for name in sorted(_global_names(code)):
            if name in found:
                parts.append((f"global:{name}", self.ref(found[name], f"global:{name}")))
            elif name in builtin_ns:
                parts.append((f"builtin:{name}", self.ref(builtin_ns[name], f"builtin:{name}")))
        return parts

    def _class(self, cls: type) -> list[tuple[str, str]]:
        parts = [("name", _digest("batchjson:ref:1", [cls.__module__, cls.__qualname__]))]
        if issubclass(cls, BaseModel) and cls is not BaseModel:
            try:
                parts.append(("schema", content_hash(cls)))
            except Unhashable:
                parts.append(("schema", self._by_identity(cls, "schema")))
        if self._importable(cls):
            return parts
        for base in cls.__bases__:
            if base is not object:
                label = f"base:{base.__qualname__}"
                parts.append((label, self.ref(base, label)))
        for name, value in sorted(vars(cls).items(), key=itemgetter(0)):
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = (value.fget, value.fset, value.fdel)
            elif not isinstance(value, types.FunctionType) and name.startswith("_"):
                continue  # interpreter and framework bookkeeping, not behaviour we can compare
            parts.append((f"attr:{name}", self.ref(value, f"attr:{name}")))
        return parts

    def _instance(self, obj: Any) -> list[tuple[str, str]]:
        cls = type(obj)
        call = cls.__call__ if callable(obj) else None
        inner = self._inner(call) if isinstance(call, types.FunctionType) else []
        own = [("type", self.ref(cls, "type"))]
        try:
            state = vars(obj)
        except TypeError:
            own.append(("instance", self._by_identity(obj, "instance")))
        else:
            own.append(("instance", self.ref(state, "instance")))
        return _merge(inner, own)


def unwrap_callable(fn: Any) -> Any:
    """The function under partials and bound methods (bounded, in case of odd nesting)."""
    for _ in range(16):
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, types.MethodType):
            fn = fn.__func__
        else:
            break
    return fn


def _home(fn: Any) -> str | None:
    module = getattr(unwrap_callable(fn), "__module__", None)
    return module if isinstance(module, str) else None


def fingerprint_function(fn: Callable[..., Any]) -> Fingerprint:
    """Content fingerprint of a callable: code, defaults, closure and referenced globals.

    The same function defined in another cell, file or line, or in another process, gets the
    same digest; values that cannot be content-hashed are compared by identity and listed in
    ``by_identity``.
    """
    if not callable(fn):
        raise TypeError(f"expected a callable, got {type(fn).__qualname__}")
    walker = _Walker(_home(fn))
    node = walker.node(fn)
    return Fingerprint(node.digest, tuple(dict.fromkeys(node.by_identity)), node.parts,
                       tuple(walker.pins))


_SUBJECTS = {"code": "code", "defaults": "default arguments",
             "kwdefaults": "keyword-only defaults", "self": "bound instance",
             "instance": "instance state", "type": "class", "schema": "model schema",
             "func": "wrapped callable", "ref": "referenced callable", "name": "class name"}
_PREFIXES = {"global": "global", "builtin": "builtin", "closure": "closure variable",
             "partial": "partial", "attr": "attribute", "base": "base class"}


def _phrase(name: str, what: str, identity: set[str]) -> str:
    core = name.removeprefix("func.")
    head, sep, rest = core.partition(":")
    subject = f"{_PREFIXES[head]} {rest}" if sep and head in _PREFIXES else _SUBJECTS.get(core)
    subject = ("wrapped " if core != name else "") + (subject or core)
    return f"{subject} {what}" + (" (compared by identity)" if name in identity else "")


def describe_changes(old: Fingerprint, new: Fingerprint) -> list[str]:
    """What differs between two fingerprints, in words a notebook user can act on."""
    if old.digest == new.digest:
        return []
    before, after = dict(old.parts), dict(new.parts)
    identity = set(old.by_identity) | set(new.by_identity)
    phrases = []
    for name, digest in new.parts:
        if name not in before:
            phrases.append(_phrase(name, "added", identity))
        elif before[name] != digest:
            phrases.append(_phrase(name, "changed", identity))
    phrases += [_phrase(n, "removed", identity) for n, _ in old.parts if n not in after]
    return phrases or ["kind of callable changed"]
