"""Files a validator reads: their content is part of what it judges by.

A validator that loads ``rules.json`` accepts or rejects by the file's content as much as by its
code: after the file is edited, answers stored under the old rules may no longer pass. A read of
a constant path in the user's code (``open("rules.json")``, ``json.load(open(RULES))`` where
``RULES`` is a str or ``Path`` global, ``Path("rules.json").read_text()``, ``RULES.read_bytes()``)
puts the file's content hash into the fingerprint, read again every time the fingerprint is made
(every run). Any other read cannot be hashed ahead of the run: a path computed at run time
(``open(task["file"])``), a read inside an installed library (``pandas.read_csv``, ``np.load``,
``gzip.open``). Those are named as ``unseen``, which makes the fingerprint partial, so stored
answers are re-judged before they are reused. Found from the bytecode, so what a read looks like
is all that is known: a read hidden behind other names is not seen.
"""

from __future__ import annotations

import builtins
import dis
import functools
import hashlib
import io
import os
import pathlib
import stat
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._bytecode import is_module
from ._canon import digest

__all__ = ["Read", "file_digest", "file_reads", "library_reader", "resolve"]

_SKIP = frozenset({"CACHE", "NOP", "EXTENDED_ARG", "PRECALL", "PUSH_NULL", "KW_NAMES",
                   "RESUME", "COPY_FREE_VARS", "MAKE_CELL"})
_NAMES = {"LOAD_GLOBAL": "g", "LOAD_NAME": "g", "LOAD_DEREF": "c", "LOAD_CLASSDEREF": "c"}
_ATTR = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_SIMPLE = frozenset({"LOAD_CONST", "LOAD_SMALL_INT", *_NAMES})  # and every LOAD_FAST form
COMPUTED = ": a file read whose path is computed at run time"
PATH_METHODS = frozenset({"read_text", "read_bytes", "open"})
_MODE = frozenset("rwxabt+U")
_OPENS = (builtins.open, io.open)

# Library functions whose name says they read a file given its path.
READERS = frozenset({"open", "load", "loadtxt", "genfromtxt", "fromfile", "read_text",
                     "read_bytes", "urlopen", "imread"})
# ``load(f)`` of these takes a file already open: the ``open`` is the read, seen on its own.
FILE_OBJECT_LOADERS = frozenset({"json", "pickle", "_pickle", "marshal", "tomllib", "plistlib"})


@dataclass(frozen=True)
class Read:
    """One read site: what it calls, the path when it is a constant or a name, and for
    ``Path(p).read_text()`` the name the path class was loaded by."""

    call: str
    path: tuple[str, Any] | None = None  # ("const", "rules.json") or ("name", (root, name))
    receiver: tuple[str, ...] | None = None  # the chain a Path(...) or a method was read from


@functools.lru_cache(maxsize=4096)
def file_reads(code: types.CodeType) -> tuple[Read, ...]:
    """The read sites of ``code`` and the code nested in it; cached, equal code reads alike."""
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in _SKIP]
    found: list[Read | None] = []
    for at, (op, arg) in enumerate(ops):
        if op in ("LOAD_GLOBAL", "LOAD_NAME") and arg == "open" and (
                at + 1 == len(ops) or ops[at + 1][0] not in _ATTR):
            found.append(_open_site(ops, at))
        elif op in _ATTR and arg in PATH_METHODS:
            found.append(_method_site(ops, at))
    out = [r for r in found if r is not None]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out += file_reads(const)
    return tuple(dict.fromkeys(out))


def _path_at(ops: list[tuple[str, Any]], at: int) -> tuple[str, Any] | None:
    """A path argument that is a constant (``"rules.json"``) or a bare name (``RULES``)."""
    if at >= len(ops):
        return None
    op, arg = ops[at]
    if op == "LOAD_CONST" and isinstance(arg, (str, bytes)):
        return ("const", arg)
    if op in _NAMES and (at + 1 == len(ops) or ops[at + 1][0] not in _ATTR):
        return ("name", (_NAMES[op], arg))
    return None


def _arguments(ops: list[tuple[str, Any]], start: int, loaded: int) -> list[Any] | None:
    """The constants among simple arguments from ``start`` up to the call that takes them
    (``loaded`` already on the stack for it); None when anything else is computed there."""
    consts = []
    for at in range(start, len(ops)):
        op, arg = ops[at]
        if op.startswith("CALL") and op != "CALL_FUNCTION_EX":
            count = loaded - (op == "CALL_KW")  # 3.13 loads the keyword names as one more
            return consts if isinstance(arg, int) and count == arg else None
        fast = op.count("LOAD_FAST")  # LOAD_FAST_LOAD_FAST (3.13) loads two
        if not (fast or op in _SIMPLE) or (at + 1 < len(ops) and ops[at + 1][0] in _ATTR):
            return None  # an expression, or an attribute of what was loaded: computed
        if op == "LOAD_CONST":
            consts.append(arg)
        loaded += fast or 1
    return None


def _writes(consts: list[Any]) -> bool:
    """A mode among the arguments that writes (``"w"``, ``"a"``, ``"x"``, ``"r+"``)."""
    return any(isinstance(c, str) and c and set(c) <= _MODE and set(c) & set("wax+")
               for c in consts)


def _open_site(ops: list[tuple[str, Any]], at: int) -> Read | None:
    path = _path_at(ops, at + 1)
    consts = _arguments(ops, at + 2, 1) if path is not None else None
    if consts is not None and _writes(consts):
        return None  # a file the validator writes (a log) is not what it judges by
    return Read("open()", path if consts is not None else None)


def _method_site(ops: list[tuple[str, Any]], at: int) -> Read | None:
    method = ops[at][1]
    consts = _arguments(ops, at + 1, 0)
    if method == "open" and consts is not None and _writes(consts):
        return None
    before = ops[at - 1] if at >= 1 else ("", None)
    if before[0] in _NAMES:  # RULES.read_text(), gzip.open(...)
        return Read(f".{method}()", ("name", (_NAMES[before[0]], before[1])),
                    receiver=(before[1],))
    if before[0].startswith("CALL") and before[1] == 1 and at >= 3:  # Path(p).read_text()
        path = _path_at(ops, at - 2)
        callee = _chain_before(ops, at - 2)
        if path is not None and callee is not None:
            return Read(f"{callee[-1]}(...).{method}()", path, receiver=callee)
    return Read(f".{method}()")


def _chain_before(ops: list[tuple[str, Any]], end: int) -> tuple[str, ...] | None:
    """The names of a ``Path`` or ``pathlib.Path`` loaded just before index ``end``."""
    names: list[str] = []
    at = end - 1
    while at >= 0 and ops[at][0] in _ATTR:
        names.insert(0, ops[at][1])
        at -= 1
    if at < 0 or ops[at][0] not in _NAMES:
        return None
    return (ops[at][1], *names)


def resolve(read: Read, found: Mapping[str, Any], cells: Mapping[str, Any]
            ) -> tuple[str | None, str | None]:
    """(path to hash, None) for a constant path; (None, what to name as unseen) for a read
    that cannot be hashed ahead; (None, None) when the site is not a file read after all."""
    def value(root: tuple[str, str]) -> Any:
        kind, name = root
        scope = cells if kind == "c" else found
        return scope.get(name, getattr(builtins, name, None) if kind == "g" else None)

    if read.call == "open()" and not any(found.get("open", builtins.open) is o for o in _OPENS):
        return None, None  # the user's own `open`, walked by content like any global
    if read.receiver is not None and read.call.startswith("."):  # NAME.method()
        target = value(read.path[1]) if read.path else None
        if issubclass(type(target), types.ModuleType):  # never asks the object itself
            return None, None  # gzip.open: a module's function, seen as one (library_reader)
        if not issubclass(type(target), pathlib.PurePath):
            return None, f"{read.receiver[0]}{read.call}{COMPUTED}"
        return _checked(os.fspath(target), read.call)
    if read.receiver is not None:  # Path(p).method(): the callee must be a path class
        callee = cells.get(read.receiver[0], value(("g", read.receiver[0])))
        for attr in read.receiver[1:]:  # pathlib.Path: modules only, never an object's hooks
            callee = getattr(callee, attr, None) if is_module(callee) else None
        if not (issubclass(type(callee), type) and issubclass(callee, pathlib.PurePath)):
            return None, f"{read.call}{COMPUTED}"
    path = _path_value(read.path, value)
    if path is None:
        return None, f"{read.call}{COMPUTED}"
    return _checked(path, read.call)


def _path_value(path: tuple[str, Any] | None, value: Any) -> str | None:
    if path is None:
        return None
    kind, what = path
    raw = what if kind == "const" else value(what)
    if issubclass(type(raw), (str, bytes, pathlib.PurePath)):
        return os.fsdecode(raw)
    return None


def _checked(path: str, call: str) -> tuple[str | None, str | None]:
    """A regular file (or one that is missing) is hashed; a pipe or a device is never read
    ahead, since reading it would consume it or block."""
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
    """The content of the file at ``path`` as a digest: read now, never cached (an edit
    between two runs must be seen)."""
    content = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                content.update(chunk)
    except FileNotFoundError:
        return digest("batchjson:file:1", ["missing"])
    except OSError as exc:
        return digest("batchjson:file:1", ["unreadable", type(exc).__name__])
    return digest("batchjson:file:1", ["content", content.hexdigest()])


def library_reader(module: str, name: str, value: Any) -> str | None:
    """What to name when installed code called ``module.name`` reads a file, else None."""
    if not isinstance(name, str) or not (name in READERS or name.startswith("read_")):
        return None
    if name == "load" and module.split(".")[0] in FILE_OBJECT_LOADERS:
        return None
    if value is not None and not callable(value):
        return None
    return f"{module}.{name}(): a file read inside an installed library"
