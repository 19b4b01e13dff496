"""Files a validator reads are part of what it judges by (docs/design.md, "Why content keys"): a
constant path's content, read every run; any other read (a computed path, inside a library, a
program run) is named ``unseen``, so stored answers are re-judged before reuse."""

from __future__ import annotations

import builtins
import glob
import hashlib
import io
import os
import pathlib
import stat
import types
from collections.abc import Callable, Mapping
from typing import Any

from .._canon import digest
from .bytecode import MISSING, STDLIB_READS, CodeFacts, Read, is_module, resolve_chain
from .library import is_library_module, is_plain

COMPUTED = ": a file read whose path is computed at run time"
_OPENS = (builtins.open, io.open)
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType)  # read without asking the object
# An installed module's containers (os.environ, sys.argv), keyed by name: read, they are unseen.
_ENVIRONMENT = (Mapping, list, set)

# Library functions whose name says they read a file given its path.
READERS = frozenset({"open", "load", "loadtxt", "genfromtxt", "fromfile", "read_text",
                     "read_bytes", "urlopen", "imread"})
# ``load(f)`` of these takes a file already open: the ``open`` is the read, seen on its own.
FILE_OBJECT_LOADERS = frozenset({"json", "pickle", "_pickle", "marshal", "tomllib", "plistlib"})


def file_parts(facts: CodeFacts, found: Mapping[str, Any], cells: Mapping[str, Any]
               ) -> tuple[list[tuple[str, str]], list[str]]:
    """(parts, unseen) of the files the code reads: a constant path's content, else unseen."""
    parts: dict[str, str] = {}
    unseen: list[str] = []
    for read in facts.files:
        path, hidden = resolve(read, found, cells)
        if hidden is not None:
            unseen.append(hidden)
        elif path is not None:
            parts.setdefault(f"file:{path}", file_digest(path))
    called = set()
    for read in facts.calls:  # os.listdir("allowed"), sqlite3.connect(DB), subprocess.run(...)
        callee = _callee(read.receiver, found, cells)
        reader = stdlib_read(callee)
        if reader is not None:
            called.add(read.receiver)
            _read_part(read, (*reader, callee), found, cells, parts, unseen)
    for name in sorted(facts.globals):  # `from pandas import read_csv`, then read_csv(path)
        value = found.get(name)
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


LINECACHE = ("linecache keeps the lines it read in this process: an edit of {path!r} is not "
             "read until linecache.checkcache()")


def _bound(root: tuple[str, str], found: Mapping[str, Any], cells: Mapping[str, Any]) -> Any:
    """What a name the code reads is bound to: a closure cell, else a global or a builtin."""
    kind, name = root
    scope = cells if kind == "c" else found
    return scope.get(name, getattr(builtins, name, None) if kind == "g" else None)


def _callee(chain: tuple, found: Mapping[str, Any], cells: Mapping[str, Any]) -> Any:
    """What a call site's chain names: ``listdir`` (a global or closure), ``os.path.exists``."""
    if len(chain) == 1:
        return _bound(chain[0], found, cells)
    resolved = resolve_chain(chain, (found, vars(builtins), cells))  # type: ignore[arg-type]
    return MISSING if resolved is None else resolved[1]


def _read_part(read: Read, reader: tuple[str, str, Any], found: Mapping[str, Any],
               cells: Mapping[str, Any], parts: dict[str, str], unseen: list[str]) -> None:
    """A stdlib read's part (by the path's content, listing or state now), or why unseen."""
    name, kind, fn = reader
    if kind == "program":
        unseen.append(f"{name}(): runs a program; what it reads is seen only at run time")
        return
    path = _path_value(read.path, found, cells)
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
            unseen.append(f"{name}(): " + LINECACHE.format(path=path))
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


def resolve(read: Read, found: Mapping[str, Any], cells: Mapping[str, Any]
            ) -> tuple[str | None, str | None]:
    """(path to hash, None), (None, what is unseen), or (None, None): no file read after all."""
    if read.call == "open()" and not any(found.get("open", builtins.open) is o for o in _OPENS):
        return None, None  # the user's own `open`, walked by content like any global
    if read.receiver is not None and read.call.startswith("."):  # NAME.method()
        target = _bound(read.path[1], found, cells) if read.path else None
        if issubclass(type(target), types.ModuleType):  # never asks the object itself
            return None, None  # gzip.open: a module's function, seen as one (library_reader)
        if not issubclass(type(target), pathlib.PurePath):
            return None, f"{read.receiver[0]}{read.call}{COMPUTED}"
        return _checked(os.fspath(target), read.call)
    if read.receiver is not None:  # Path(p).method(): the callee must be a path class
        callee = cells.get(read.receiver[0], _bound(("g", read.receiver[0]), found, cells))
        for attr in read.receiver[1:]:  # pathlib.Path: modules only, never an object's hooks
            callee = getattr(callee, attr, None) if is_module(callee) else None
        if not (issubclass(type(callee), type) and issubclass(callee, pathlib.PurePath)):
            return None, f"{read.call}{COMPUTED}"
    path = _path_value(read.path, found, cells)
    return (None, f"{read.call}{COMPUTED}") if path is None else _checked(path, read.call)


def _path_value(path: tuple[str, Any] | None, found: Mapping[str, Any],
                cells: Mapping[str, Any]) -> str | None:
    if path is None:
        return None
    kind, what = path
    raw = what if kind == "const" else _bound(what, found, cells)
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
