"""What lies outside the user's code, as fingerprints see it (docs/design.md, "Why content keys"):
installed code (stdlib, site-packages) by name, a library object by its known content (a Logger's
name), a file a validator reads by a constant path's content, read every run; any other read (a
computed path, inside a library, a program run) is named ``unseen``: re-judged before reuse."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import glob
import hashlib
import io
import logging
import os
import pathlib
import queue
import random
import re
import site
import stat
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

from .._canon import SCALARS, VALUE_TYPES, digest
from .bytecode import STDLIB_READS, CodeFacts, Read, Scope, bound, is_module, resolve_chain


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
    groups = (getattr(infos, group, None) for group in _DECORATOR_GROUPS)
    return core, privates, frozenset().union(*(g for g in groups if isinstance(g, dict)))


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
        return type(x)(walk(v) for v in x) if type(x) in (list, tuple) else x

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


# -- files a validator reads ----------------------------------------------------------------------
COMPUTED = ": a file read whose path is computed at run time"
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)  # read without asking the object
# An installed module's containers (os.environ, sys.argv), keyed by name: read, they are unseen.
_ENVIRONMENT = (Mapping, list, set)

# Library functions whose name says they read a file given its path.
READERS = frozenset({"open", "load", "loadtxt", "genfromtxt", "fromfile", "read_text",
                     "read_bytes", "urlopen", "imread"})
# ``load(f)`` of these takes a file already open: the ``open`` is the read, seen on its own.
FILE_OBJECT_LOADERS = frozenset({"json", "pickle", "_pickle", "marshal", "tomllib", "plistlib"})


def file_parts(facts: CodeFacts, scope: Scope) -> tuple[list[tuple[str, str]], list[str]]:
    """(parts, unseen) of the files the code reads: a constant path's content, else unseen."""
    parts: dict[str, str] = {}
    unseen: list[str] = []
    for read in facts.files:
        path, hidden = resolve(read, scope)
        if hidden is not None:
            unseen.append(hidden)
        elif path is not None:
            parts.setdefault(f"file:{path}", file_digest(path))
    called = set()
    for read in facts.calls:  # os.listdir("allowed"), sqlite3.connect(DB), subprocess.run(...)
        callee = _callee(read.receiver, scope)
        reader = stdlib_read(callee)
        if reader is not None:
            called.add(read.receiver)
            _read_part(read, (*reader, callee), scope, parts, unseen)
    for name in sorted(facts.globals):  # `from pandas import read_csv`, then read_csv(path)
        value = scope[0].get(name)
        reader = stdlib_read(value)
        if reader is not None and (("g", name),) not in called:  # `ls = os.listdir`: unseen
            unseen.append(f"{name}(), which is {reader[0]}(){COMPUTED}")
        if type(value) in _FUNCTIONS and is_library_module(value.__module__):
            reader = library_reader(value.__module__, value.__name__, value)
            if reader is not None:
                unseen.append(reader)
    return list(parts.items()), unseen


# Where the stdlib defines what it exports under another module's name.
_HOMES = {"posix": "os", "nt": "os", "posixpath": "os.path", "ntpath": "os.path",
          "genericpath": "os.path", "_sqlite3": "sqlite3"}


def stdlib_read(value: Any) -> tuple[str, str] | None:
    """(name, kind) when ``value`` is one of STDLIB_READS's functions, else None."""
    if type(value) not in (*_FUNCTIONS, type):
        return None
    module = getattr(value, "__module__", None)
    if not isinstance(module, str) or not is_library_module(module):
        return None
    name = f"{_HOMES.get(module, module)}.{getattr(value, '__qualname__', '')}"
    kind = STDLIB_READS.get(name)
    return (name, kind) if kind is not None else None


def _callee(chain: tuple, scope: Scope) -> Any:
    """What a call site's chain names: ``listdir`` (a global or closure), ``os.path.exists``."""
    if len(chain) == 1:
        return bound(chain[0], scope)
    resolved = resolve_chain(chain, scope)
    return None if resolved is None else resolved[1]


def _read_part(read: Read, reader: tuple[str, str, Any], scope: Scope, parts: dict[str, str],
               unseen: list[str]) -> None:
    """A stdlib read's part (by the path's content, listing or state now), or why unseen."""
    name, kind, fn = reader
    if kind == "program":
        unseen.append(f"{name}(): runs a program; what it reads is seen only at run time")
        return
    path = _path_value(read.path, scope)
    if path is None:
        unseen.append(f"{name}(){COMPUTED}")
    elif name == "sqlite3.connect" and path in ("", ":memory:"):
        return  # an in-memory database: nothing on disk
    elif name == "sqlite3.connect" and path.startswith("file:"):
        unseen.append(f"{name}() of the URI {path!r}: read only at run time")
    elif kind == "file":
        checked, hidden = _checked(path, f"{name}()")
        if checked is None:
            unseen.append(hidden or f"{name}(){COMPUTED}")
            return
        parts.setdefault(f"file:{path}", file_digest(path))
        if name == "sqlite3.connect" and os.path.exists(path + "-wal"):  # rows not yet in it
            parts.setdefault(f"file:{path}-wal", file_digest(path + "-wal"))
        if name.startswith("linecache."):
            unseen.append(f"{name}(): linecache keeps the lines it read in this process: an "
                          f"edit of {path!r} is not read until linecache.checkcache()")
    else:
        what = f"{name.rpartition('.')[2]}({path!r})" if kind == "check" else path
        parts.setdefault(f"{kind}:{what}", _state_digest(kind, fn, path))


def _state_digest(kind: str, fn: Callable[..., Any], path: str) -> str:
    """What a listing, a glob or a path check answers now, as a digest."""
    try:
        if kind == "listing":
            found: Any = sorted(os.listdir(path))
        elif kind == "tree":  # os.walk ignores errors: a missing top is an empty walk
            found = sorted((top, sorted(dirs), sorted(files)) for top, dirs, files in os.walk(path))
        elif kind == "glob":
            found = sorted(glob.glob(path, recursive="**" in path))
        else:
            found = fn(path)
    except (OSError, ValueError) as exc:  # missing, not a directory, a NUL in the path
        found = ["unreadable", type(exc).__name__]
    return digest(f"batchjson:{kind}:1", found)


def outside_read(module: str, used: list[str], value: Any) -> str | None:
    """What to name when code reads ``module.<used>`` out of sight: a library's file reader
    (``pd.read_csv``), or its container (``os.environ``)."""
    reader = library_reader(module, used[-1], value)
    if reader is None and isinstance(value, _ENVIRONMENT) and not is_plain(value):
        return f"{module}.{'.'.join(used)}"
    return reader


def resolve(read: Read, scope: Scope) -> tuple[str | None, str | None]:
    """(path to hash, None), (None, what is unseen), or (None, None): no file read after all."""
    if read.call == "open()" and scope[0].get("open", builtins.open) is not builtins.open:
        return None, None  # the user's own `open`, walked by content like any global
    if read.receiver is not None and read.call.startswith("."):  # NAME.method()
        target = bound(read.path[1], scope) if read.path else None
        if issubclass(type(target), types.ModuleType):  # never asks the object itself
            return None, None  # gzip.open: a module's function, seen as one (library_reader)
        if not issubclass(type(target), pathlib.PurePath):
            return None, f"{read.receiver[0]}{read.call}{COMPUTED}"
        return _checked(os.fspath(target), read.call)
    if read.receiver is not None:  # Path(p).method(): the callee must be a path class
        callee = scope[2].get(read.receiver[0], bound(("g", read.receiver[0]), scope))
        for attr in read.receiver[1:]:  # pathlib.Path: modules only, never an object's hooks
            callee = getattr(callee, attr, None) if is_module(callee) else None
        if not (issubclass(type(callee), type) and issubclass(callee, pathlib.PurePath)):
            return None, f"{read.call}{COMPUTED}"
    path = _path_value(read.path, scope)
    return (None, f"{read.call}{COMPUTED}") if path is None else _checked(path, read.call)


def _path_value(path: tuple[str, Any] | None, scope: Scope) -> str | None:
    if path is None:
        return None
    kind, what = path
    raw = what if kind == "const" else bound(what, scope)
    return os.fsdecode(raw) if issubclass(type(raw), (str, bytes, pathlib.PurePath)) else None


def _checked(path: str, call: str) -> tuple[str | None, str | None]:
    """A regular (or missing) file is hashed; a pipe or a device is never read ahead."""
    try:
        mode = os.stat(path).st_mode
    except ValueError:  # a NUL inside the path: no file has that name
        return None, f"{call} of {path!r}: not a path a file can have"
    except OSError:
        return path, None  # missing or unreadable: hashed as such, and seen once it appears
    if not stat.S_ISREG(mode):
        return None, f"{call} of {path!r}: not a regular file, read only at run time"
    return path, None


def file_digest(path: str) -> str:
    """The content of the file at ``path`` as a digest, read now, never cached."""
    try:
        with open(path, "rb") as handle:
            content = hashlib.file_digest(handle, "sha256").hexdigest()
    except FileNotFoundError:
        return digest("batchjson:file:1", ["missing"])
    except OSError as exc:
        return digest("batchjson:file:1", ["unreadable", type(exc).__name__])
    return digest("batchjson:file:1", ["content", content])


def library_reader(module: str, name: str, value: Any) -> str | None:
    """What to name when installed code called ``module.name`` reads a file, else None."""
    if not isinstance(name, str) or not (name in READERS or name.startswith("read_")):
        return None
    if name == "load" and module.split(".")[0] in FILE_OBJECT_LOADERS:
        return None
    if value is not None and not callable(value):
        return None
    return f"{module}.{name}(): a file read inside an installed library"
