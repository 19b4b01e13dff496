"""Installed code and well-known library objects, as fingerprints see them: code under the stdlib
and site-packages goes by name, the user's (a notebook, a helper module, an editable install) by
content; some library objects have a better content than their ``__dict__`` (a Logger's name)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import logging
import os
import queue
import random
import re
import site
import sys
import sysconfig
import threading
import types
from typing import Any

from .._canon import SCALARS, VALUE_TYPES


def _roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)]
    with contextlib.suppress(AttributeError):  # an embedded interpreter's site may lack them
        found += [*site.getsitepackages(), site.getusersitepackages()]
    return tuple(sorted({os.path.realpath(p).rstrip(os.sep) + os.sep for p in found}))


_ROOTS = _roots()
_LIBRARY: dict[str, bool] = {"__main__": False, "builtins": True}


def is_library_module(name: str | None) -> bool:
    """True when ``name`` is a module of installed code (stdlib, site-packages, built-in)."""
    if not isinstance(name, str):
        return False
    hit = _LIBRARY.get(name)
    if hit is not None:
        return hit
    module = sys.modules.get(name)
    if module is None:  # a namespace exec'd under a made-up name: the user's
        return False
    path = getattr(module, "__file__", None)
    if isinstance(path, str):
        answer = os.path.realpath(path).startswith(_ROOTS)
    else:
        origin = getattr(getattr(module, "__spec__", None), "origin", None)
        answer = name in sys.builtin_module_names or origin in ("built-in", "frozen")
    _LIBRARY[name] = answer
    return answer


# Objects whose state is synchronisation, I/O or randomness: the type is all that can matter.
BY_TYPE: tuple[type, ...] = (
    type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Semaphore,
    threading.Event, threading.Barrier, asyncio.Lock, asyncio.Event, asyncio.Semaphore,
    asyncio.Condition, queue.Queue, queue.SimpleQueue, io.IOBase, random.Random,
    threading.Thread, threading.local,
)


def special_content(obj: Any) -> tuple[str, Any] | None:
    """(kind, content to walk) for a known library object, else None (also when it cannot be
    read: a TypeAdapter whose type cannot be built is read generically)."""
    with contextlib.suppress(Exception):
        if isinstance(obj, (logging.Logger, logging.PlaceHolder)):
            return "logger", getattr(obj, "name", None)
        if isinstance(obj, logging.LoggerAdapter):
            return "logger", getattr(obj.logger, "name", None)
        if isinstance(obj, BY_TYPE):
            return "by-type", None
        if isinstance(obj, types.MappingProxyType):  # a class's read-only view of a dict
            return "mapping", dict(obj)
        if isinstance(obj, dataclasses.Field):  # what the generated methods do, not the type
            return "field", (obj.name, obj.default, obj.default_factory, obj.init, obj.repr,
                             obj.hash, obj.compare, dict(obj.metadata), obj.kw_only)
        module = type(obj).__module__ or ""
        if module.startswith("pydantic") and type(obj).__name__ == "TypeAdapter":
            return "type-adapter", normalized_core_schema(obj.core_schema)
        if module.startswith("jsonschema") and hasattr(type(obj), "META_SCHEMA") and hasattr(
                obj, "schema"):
            checker = getattr(obj, "format_checker", None)
            return "jsonschema", (obj.schema, getattr(checker, "checkers", None))
    return None


_DECORATOR_GROUPS = ("validators", "field_validators", "root_validators", "field_serializers",
                     "model_serializers", "model_validators", "computed_fields")


def model_content(cls: Any) -> tuple[Any, list[tuple[str, Any]], frozenset[str]]:
    """What decides a pydantic model's validation: its normalized core schema (None while forward
    references are unresolved), its private attributes' defaults, its decorators' names."""
    try:
        if not getattr(cls, "__pydantic_complete__", True):
            cls.model_rebuild(raise_errors=False)
        core = cls.__pydantic_core_schema__
    except Exception:  # pydantic raises several types for models it cannot build
        core = None
    core = normalized_core_schema(core) if isinstance(core, dict) else None
    privates = [(name, (getattr(attr, "default", None), getattr(attr, "default_factory", None)))
                for name, attr in sorted(getattr(cls, "__private_attributes__", {}).items())]
    infos = getattr(cls, "__pydantic_decorators__", None)
    names: set[str] = set()
    for group in _DECORATOR_GROUPS:
        found = getattr(infos, group, None)
        names |= set(found) if isinstance(found, dict) else set()
    return core, privates, frozenset(names)


def normalized_core_schema(schema: Any) -> Any:
    """A pydantic core schema without ``metadata`` and with ``ref`` names (which embed ``id()``)
    numbered in walk order: equal for equal models."""
    refs: dict[str, int] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            out = {}
            for key in sorted(x, key=str):
                if key == "metadata":
                    continue
                value = x[key]
                if key in ("ref", "schema_ref") and isinstance(value, str):
                    out[key] = refs.setdefault(value, len(refs))
                else:
                    out[key] = walk(value)
            return out
        if isinstance(x, list | tuple):
            return type(x)(walk(v) for v in x) if type(x) in (list, tuple) else x
        return x

    return walk(schema)


def declares_state(cls: type) -> bool:
    """Whether a class (not ``object``) defines what pickling saves of its instances."""
    return any(name in vars(k) for k in cls.__mro__ if k is not object
               for name in ("__reduce_ex__", "__reduce__", "__getstate__"))


def is_plain_data(value: Any, depth: int = 0) -> bool:
    """Plain data only: scalars, value types and containers of them (bounded depth)."""
    if type(value) in SCALARS or isinstance(value, (*VALUE_TYPES, re.Pattern)):
        return True
    if depth > 8:
        return False
    if type(value) in (list, tuple, set, frozenset):
        return all(is_plain_data(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(is_plain_data(k, depth + 1) and is_plain_data(v, depth + 1)
                   for k, v in value.items())
    return False


def slots_of(klass: type) -> tuple[str, ...]:
    slots = vars(klass).get("__slots__", ())
    slots = (slots,) if isinstance(slots, str) else tuple(slots)
    return tuple(s for s in slots if s not in ("__dict__", "__weakref__"))


def is_plain(value: Any) -> bool:
    """Immutable data or installed code: safe and cheap to fingerprint by content."""
    if type(value) in SCALARS or isinstance(value, (*VALUE_TYPES, re.Pattern)):
        return True
    if type(value) in (tuple, frozenset):
        return all(is_plain(v) for v in value)
    return callable(value) or isinstance(value, types.ModuleType)
