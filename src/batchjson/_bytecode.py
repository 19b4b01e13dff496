"""What a function's bytecode reads and writes, so a fingerprint can see it.

A validator that reads ``cfg.THRESHOLD`` depends on that attribute's value, not on the module's
name; a stub that writes ``self.calls`` or ``global COUNT`` owns that state, so keying its source
by it would give a new key per call; ``globals()["X"]`` or ``eval`` reads what no scan can see.
One pass over the instructions (nested code included) answers all three.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from dataclasses import dataclass
from typing import Any

from ._canon import dump

__all__ = ["CONSTRUCTION", "DYNAMIC_ATTRS", "DYNAMIC_BUILTINS", "MISSING", "Reads", "code_canon",
           "is_module",
           "reads_of", "resolve_chain", "writes_of"]

# Builtins that look names up at run time, out of a scan's sight.
DYNAMIC_BUILTINS = frozenset({"globals", "locals", "vars", "eval", "exec", "__import__"})
# Module attributes that do the same.
DYNAMIC_ATTRS = frozenset({("importlib", "import_module"), ("sys", "_getframe"),
                           ("inspect", "currentframe"), ("inspect", "stack"),
                           ("builtins", "eval"), ("builtins", "exec"),
                           ("builtins", "globals")})
_GETATTR = frozenset({"getattr", "hasattr"})

# A chain starts at a root: ("g", name) a global, ("c", name) a closure variable, ("m", module)
# an import inside the code; then the attribute names read from it, in order.
Chain = tuple[tuple[str, str], *tuple[str, ...]]

_STARTS = {"LOAD_GLOBAL": "g", "LOAD_NAME": "g", "LOAD_DEREF": "c", "LOAD_CLASSDEREF": "c"}
_ATTR = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_STORE_LOCAL = frozenset({"STORE_FAST", "STORE_DEREF", "STORE_NAME"})
_NEUTRAL = frozenset({"EXTENDED_ARG", "CACHE", "NOP"})
_NO_CONST = object()
MISSING = object()  # an attribute a chain names that is not there


@dataclass(frozen=True)
class Reads:
    """Names a code object (and the code nested in it) reads and writes."""

    globals: frozenset[str]
    chains: frozenset[Chain]
    written_globals: frozenset[str]
    written_attrs: frozenset[str]
    written_cells: frozenset[str]
    dynamic: frozenset[Chain] = frozenset()  # getattr(root, name) with a name known at run time


@functools.lru_cache(maxsize=4096)
def reads_of(code: types.CodeType) -> Reads:
    """The reads and writes of ``code``; cached, since equal code reads equal names."""
    globals_: set[str] = set()
    chains: set[Chain] = set()
    written: dict[str, set[str]] = {"g": set(), "a": set(), "c": set()}
    dynamic: set[Chain] = set()
    _scan(code, globals_, chains, written, dynamic)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner = reads_of(const)
            globals_ |= inner.globals
            chains |= inner.chains
            written["g"] |= inner.written_globals
            written["a"] |= inner.written_attrs
            written["c"] |= inner.written_cells
            dynamic |= inner.dynamic
    return Reads(frozenset(globals_), frozenset(chains), frozenset(written["g"]),
                 frozenset(written["a"]), frozenset(written["c"]), frozenset(dynamic))


def _scan(code: types.CodeType, globals_: set[str], chains: set[Chain],
          written: dict[str, set[str]], dynamic: set[Chain]) -> None:
    bound: dict[str, list] = {}  # local name -> the import chain it was bound to
    cur: list | None = None  # the chain being read: root, then attribute names
    import_root: list | None = None
    last_const: object = _NO_CONST
    getattr_step = 0  # 1: `getattr` loaded; 2: its object loaded, the name comes next
    for ins in dis.get_instructions(code):
        op, arg = ins.opname, ins.argval
        if op in _NEUTRAL:
            continue
        if op in _ATTR and cur is not None:
            cur.append(arg)
            continue
        if getattr_step == 2 and cur is not None:  # getattr(cfg, "X") reads cfg.X
            if op == "LOAD_CONST" and isinstance(arg, str):
                chains.add((*cur, arg))  # type: ignore[arg-type]
            else:
                dynamic.add(tuple(cur))  # type: ignore[arg-type]
        getattr_step = 2 if getattr_step == 1 and (
            op in _STARTS or (op.startswith("LOAD_FAST") and arg in bound)) else 0
        if op in _STORE_LOCAL and cur is not None and cur[0][0] == "m":
            bound[arg] = cur  # `import cfg` / `from cfg import X` inside the code
        if cur is not None:
            chains.add(tuple(cur))  # type: ignore[arg-type]
            cur = None
        if op in _STARTS:
            if _STARTS[op] == "g":
                globals_.add(arg)
            cur = list(bound[arg]) if arg in bound else [(_STARTS[op], arg)]
        elif op in ("LOAD_FAST", "LOAD_FAST_CHECK") and arg in bound:
            cur = list(bound[arg])
        elif op == "IMPORT_NAME":  # no fromlist: the top package is what gets bound
            module = arg if last_const not in (None, _NO_CONST) else arg.split(".")[0]
            import_root = [("m", module)]
            cur = list(import_root)
        elif op == "IMPORT_FROM" and import_root is not None:
            cur = [*import_root, arg]
        elif op == "POP_TOP":
            import_root = None
        elif op in ("STORE_GLOBAL", "DELETE_GLOBAL"):
            written["g"].add(arg)
        elif op in ("STORE_ATTR", "DELETE_ATTR"):
            written["a"].add(arg)
        elif op in ("STORE_DEREF", "DELETE_DEREF"):
            written["c"].add(arg)
        if op == "LOAD_GLOBAL" and arg in _GETATTR:
            getattr_step = 1
        last_const = arg if op == "LOAD_CONST" else _NO_CONST
    if cur is not None:
        chains.add(tuple(cur))  # type: ignore[arg-type]


# Methods that set an object up: what they assign is configuration, not state mutated per call.
CONSTRUCTION = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__",
                          "__set_name__", "__setstate__"})


def writes_of(value: Any) -> frozenset[str]:
    """Attribute names a function, or a class's methods, assign outside construction: the
    state it mutates while serving calls (``self.calls += 1``), not its configuration."""
    if isinstance(value, types.FunctionType):
        if value.__name__ in CONSTRUCTION:
            return frozenset()
        return reads_of(value.__code__).written_attrs
    if isinstance(value, type):
        out: set[str] = set()
        for name, member in vars(value).items():
            if isinstance(member, (classmethod, staticmethod)):
                member = member.__func__
            if isinstance(member, types.FunctionType) and name not in CONSTRUCTION:
                out |= reads_of(member.__code__).written_attrs
        return frozenset(out)
    return frozenset()


def code_canon(code: types.CodeType) -> Any:
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
        return code_canon(c)
    if type(c) is tuple:
        return ("t", [_const_canon(x) for x in c])
    if type(c) is frozenset:
        return ("f", sorted(dump(_const_canon(x)) for x in c))
    if type(c) is complex:
        return ("j", c.real, c.imag)
    return ("...",) if c is Ellipsis else c


def is_module(x: Any) -> bool:
    return issubclass(type(x), types.ModuleType)  # never asks x itself (isinstance would)


def resolve_chain(chain: tuple, scope: tuple[dict[str, Any], ...]
                  ) -> tuple[types.ModuleType, Any, list[str]] | None:
    """Follow a chain's attributes through modules: (last module, value, names used), or None
    when the root is not a module."""
    (kind, root), *attrs = chain
    found, builtin_ns, cells = scope
    if kind == "g":
        base = found.get(root, builtin_ns.get(root, MISSING))
    elif kind == "c":
        base = cells.get(root, MISSING)
    else:
        base = sys.modules.get(root, MISSING)
    if not is_module(base):
        return None
    owner, value, used = base, base, []
    for attr in attrs:
        if not is_module(value):
            break
        try:
            owner, value = value, getattr(value, attr, MISSING)
        except Exception:  # a module __getattr__ (lazy import) failing: nothing to read
            owner, value = value, MISSING
        used.append(attr)
    return owner, value, used
