"""What a function's bytecode reads, writes, changes in place and opens (``cfg.THRESHOLD``,
``self.calls``, ``rules.json``, ``eval``), in one pass, nested code included, cached per code
object. The fingerprint's policy decides what counts; a read behind other names is not seen."""

from __future__ import annotations

import dis
import functools
import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Any, NamedTuple

from .._canon import dump

# Builtins, and module attributes, that look names up at run time, out of a scan's sight.
DYNAMIC_BUILTINS = frozenset({"globals", "locals", "vars", "eval", "exec", "__import__"})
DYNAMIC_ATTRS = frozenset({("importlib", "import_module"), ("sys", "_getframe"),
                           ("inspect", "currentframe"), ("inspect", "stack"),
                           ("builtins", "eval"), ("builtins", "exec"),
                           ("builtins", "globals")})
# Methods that change a container in place: one the code calls them on is a log it keeps.
MUTATORS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "pop",
                      "popitem", "clear", "remove", "discard", "appendleft", "extendleft",
                      "popleft", "difference_update", "intersection_update",
                      "symmetric_difference_update", "sort", "reverse"})
PATH_METHODS = frozenset({"read_text", "read_bytes", "open"})  # Path(p).read_text(), f.open()
# The stdlib's functions that read the file system by a path (or run a program), by name, and
# what a constant path of theirs counts as (outside.py).
STDLIB_READS = {
    **dict.fromkeys(("sqlite3.connect", "linecache.getline", "linecache.getlines",
                     "fileinput.input"), "file"),
    **dict.fromkeys(("os.listdir", "os.scandir"), "listing"),
    "os.walk": "tree",
    **dict.fromkeys(("glob.glob", "glob.iglob"), "glob"),
    **dict.fromkeys(("os.path.exists", "os.path.lexists", "os.path.isfile", "os.path.isdir",
                     "os.path.getsize", "os.path.getmtime"), "check"),
    **dict.fromkeys(("subprocess.run", "subprocess.call", "subprocess.check_call",
                     "subprocess.check_output", "subprocess.Popen", "subprocess.getoutput",
                     "subprocess.getstatusoutput", "os.system", "os.popen"), "program"),
}
# A call of one of their names is noted with its first argument (what it is bound to decides).
CALL_READS = frozenset(name.rpartition(".")[2] for name in STDLIB_READS)
_GETATTR = frozenset({"getattr", "hasattr"})

# A chain starts at a root: ("g", name) a global, ("c", name) a closure variable, ("m", module)
# an import inside the code; then the attribute names read from it, in order.
Chain = tuple[tuple[str, str], *tuple[str, ...]]

_SKIP = frozenset({"CACHE", "NOP", "EXTENDED_ARG", "PRECALL", "PUSH_NULL", "KW_NAMES",
                   "RESUME", "COPY_FREE_VARS", "MAKE_CELL"})
_ROOTS = {"LOAD_GLOBAL": "g", "LOAD_NAME": "g", "LOAD_DEREF": "c", "LOAD_CLASSDEREF": "c"}
_ATTR = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_SIMPLE = frozenset({"LOAD_CONST", "LOAD_SMALL_INT", *_ROOTS})  # and every LOAD_FAST form
_CONSTS = frozenset({"LOAD_CONST", "LOAD_SMALL_INT"})  # 3.14 loads an import's level so
_STORE_LOCAL = frozenset({"STORE_FAST", "STORE_DEREF", "STORE_NAME"})
_WRITES = {"STORE_GLOBAL": "g", "DELETE_GLOBAL": "g", "STORE_ATTR": "a", "DELETE_ATTR": "a",
           "STORE_DEREF": "c", "DELETE_DEREF": "c"}
_SUBSCRIPT_STORES = (["STORE_SUBSCR"], ["DELETE_SUBSCR"])
_AUGMENTED = ["COPY", "COPY", "BINARY_SUBSCR"]  # X[k] += 1
_SITES = frozenset({*_ROOTS, *_WRITES, *_ATTR, "LOAD_FAST"})  # where a site may start
_MODE = frozenset("rwxabt+U")
_NOT_CALLED = ("STORE", "DELETE", "POP_TOP", "RETURN", "IMPORT_FROM")  # a name bound, not called
_NO_CONST = object()
_NO_CONSTS = (_NO_CONST, _NO_CONST)
MISSING = object()  # an attribute a chain names that is not there

Ops = list[tuple[str, Any]]
Scope = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]  # globals, builtins, closure cells


@dataclass(frozen=True)
class Read:
    """One file read site: what it calls, the path when a constant or a name, and what a
    ``Path(p).read_text()``'s class or a method's receiver was loaded by."""

    call: str
    path: tuple[str, Any] | None = None  # ("const", "rules.json") or ("name", (root, name))
    receiver: tuple[str, ...] | None = None  # the chain a Path(...) or a method was read from


class CodeFacts(NamedTuple):
    """What a code object and the code nested in it read, write, change in place and open."""

    globals: frozenset[str]
    chains: frozenset[Chain]
    dynamic: frozenset[Chain]  # getattr(root, name) with a name known at run time
    written_globals: frozenset[str]
    written_attrs: frozenset[str]
    written_cells: frozenset[str]
    # (kind, name) of containers changed in place: globals ("g"), closure cells ("c") and the
    # first argument's attributes ("a": self.log.append(...), or any assignment to self.x)
    mutated: frozenset[tuple[str, str]]
    files: tuple[Read, ...]  # file read sites, in order
    calls: tuple[Read, ...]  # calls of a CALL_READS name: its chain in ``receiver``


@functools.lru_cache(maxsize=4096)
def scan(code: types.CodeType) -> CodeFacts:
    """The facts of ``code``; cached, since equal code does the same."""
    facts = _scan(code)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner = scan(const)
            facts = CodeFacts(*(a | b if type(a) is frozenset else tuple(dict.fromkeys(a + b))
                                for a, b in zip(facts, inner, strict=True)))
    return facts


def _scan(code: types.CodeType) -> CodeFacts:
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in _SKIP]
    first = code.co_varnames[0] if code.co_argcount else None
    globals_: set[str] = set()
    chains, dynamic = set[Chain](), set[Chain]()  # chains read, and read by a dynamic name
    written: dict[str, set[str]] = {"g": set(), "a": set(), "c": set()}
    mutated: set[tuple[str, str]] = set()
    files, calls = list[Read](), list[Read]()
    bound: dict[str, list] = {}  # local name -> the import chain it was bound to
    cur: list | None = None  # the chain being read: root, then attribute names
    import_root: list | None = None
    last_const: object = _NO_CONST
    before_const: object = _NO_CONST  # `from .x import y`: its level, two constants back
    getattr_step = 0  # 1: `getattr` loaded; 2: its object loaded, the name comes next
    for at, (op, arg) in enumerate(ops):
        if op in _SITES:
            _site(ops, at, first, mutated, files)
        if op in _ATTR and cur is not None:
            cur.append(arg)
            continue
        if getattr_step == 2 and cur is not None:  # getattr(cfg, "X") reads cfg.X
            if op == "LOAD_CONST" and isinstance(arg, str):
                chains.add((*cur, arg))  # type: ignore[arg-type]
            else:
                dynamic.add(tuple(cur))  # type: ignore[arg-type]
        getattr_step = 2 if getattr_step == 1 and (
            op in _ROOTS or (op.startswith("LOAD_FAST") and arg in bound)) else 0
        if op in _STORE_LOCAL and cur is not None and cur[0][0] == "m":
            bound[arg] = cur  # `import cfg` / `from cfg import X` inside the code
        if cur is not None:
            chains.add(tuple(cur))  # type: ignore[arg-type]
            name = cur[-1] if len(cur) > 1 else cur[0][1]
            if name in CALL_READS and not op.startswith(_NOT_CALLED):  # os.listdir("allowed")
                calls.append(_call_site(ops, at, tuple(cur)))
            cur = None
        if op in _ROOTS:
            if _ROOTS[op] == "g":
                globals_.add(arg)
            cur = list(bound[arg]) if arg in bound else [(_ROOTS[op], arg)]
        elif op in ("LOAD_FAST", "LOAD_FAST_CHECK") and arg in bound:
            cur = list(bound[arg])
        elif op == "IMPORT_NAME":  # no fromlist: the top package is what gets bound
            module = arg if last_const not in (None, _NO_CONST) else arg.split(".")[0]
            if type(before_const) is int and before_const > 0:  # relative: its dots kept
                module = "." * before_const + module
            import_root = [("m", module)]
            cur = list(import_root)
        elif op == "IMPORT_FROM" and import_root is not None:
            cur = [*import_root, arg]
        elif op == "POP_TOP":
            import_root = None
        elif op in _WRITES:
            written[_WRITES[op]].add(arg)
        getattr_step = 1 if op == "LOAD_GLOBAL" and arg in _GETATTR else getattr_step
        before_const, last_const = (last_const, arg) if op in _CONSTS else _NO_CONSTS
    if cur is not None:
        chains.add(tuple(cur))  # type: ignore[arg-type]
    return CodeFacts(frozenset(globals_), frozenset(chains), frozenset(dynamic),
                     *(frozenset(written[k]) for k in "gac"), frozenset(mutated),
                     tuple(dict.fromkeys(files)), tuple(dict.fromkeys(calls)))


def _site(ops: Ops, at: int, first: str | None, mutated: set[tuple[str, str]],
          files: list[Read]) -> None:
    """Note what the instruction at ``at`` starts: a file read, or a change of a container in
    place (a mutating method, ``X[k] = v``, ``X[k] += 1``, an assignment to ``self``)."""
    op, arg = ops[at]
    if (op in _ATTR and arg in PATH_METHODS) or (
            op in ("LOAD_GLOBAL", "LOAD_NAME") and arg == "open" and not _attr_next(ops, at)):
        site = _method_site(ops, at) if op in _ATTR else _call_site(ops, at + 1)
        if site is not None:
            files.append(site)
    if op in _ROOTS:
        target, rest = (_ROOTS[op], arg), ops[at + 1:at + 5]
    elif op == "LOAD_FAST" and arg == first and at + 1 < len(ops) and (
            ops[at + 1][0] == "LOAD_ATTR"):
        target, rest = ("a", ops[at + 1][1]), ops[at + 2:at + 6]
    else:
        if op in ("STORE_ATTR", "DELETE_ATTR") and first is not None:
            mutated.add(("a", arg))
        return
    names = [o for o, _ in rest]
    if (rest and names[0] in _ATTR and rest[0][1] in MUTATORS) or (
            names[:1] and _simple(names[0]) and names[0].count("LOAD_FAST") < 2 and (
                names[1:2] in _SUBSCRIPT_STORES or names[1:4] == _AUGMENTED)):
        mutated.add(target)


def _attr_next(ops: Ops, at: int) -> bool:
    return at + 1 < len(ops) and ops[at + 1][0] in _ATTR


def _simple(op: str) -> bool:
    return op in _SIMPLE or "LOAD_FAST" in op


def _path_at(ops: Ops, at: int) -> tuple[str, Any] | None:
    """A path argument that is a constant (``"rules.json"``) or a bare name (``RULES``)."""
    if at >= len(ops):
        return None
    op, arg = ops[at]
    if op == "LOAD_CONST" and isinstance(arg, (str, bytes)):
        return ("const", arg)
    if op in _ROOTS and not _attr_next(ops, at):
        return ("name", (_ROOTS[op], arg))
    return None


def _arguments(ops: Ops, start: int, loaded: int) -> list[Any] | None:
    """The constants among simple arguments from ``start`` up to the call that takes them
    (``loaded`` already on the stack for it); None when anything else is computed there."""
    consts = []
    for at in range(start, len(ops)):
        op, arg = ops[at]
        if op.startswith("CALL") and op != "CALL_FUNCTION_EX":
            count = loaded - (op == "CALL_KW")  # 3.13 loads the keyword names as one more
            return consts if isinstance(arg, int) and count == arg else None
        if not _simple(op) or _attr_next(ops, at):
            return None  # an expression, or an attribute of what was loaded: computed
        if op == "LOAD_CONST":
            consts.append(arg)
        loaded += op.count("LOAD_FAST") or 1  # LOAD_FAST_LOAD_FAST (3.13) loads two
    return None


def _writes(consts: list[Any]) -> bool:
    """A mode among the arguments that writes (``"w"``, ``"a"``, ``"x"``, ``"r+"``)."""
    return any(isinstance(c, str) and c and set(c) <= _MODE and set(c) & set("wax+")
               for c in consts)


def _call_site(ops: Ops, at: int, chain: tuple | None = None) -> Read | None:
    """A call of ``chain`` (None: ``open``) whose arguments start at ``at``, with its path when
    given simply; None for an ``open()`` that writes (a log is not what a validator judges by)."""
    path = _path_at(ops, at)
    consts = _arguments(ops, at + 1, 1) if path is not None else None
    if chain is None and consts is not None and _writes(consts):
        return None
    call = "open" if chain is None else ".".join([chain[0][1], *chain[1:]])
    return Read(f"{call}()", path if consts is not None else None, receiver=chain)


def _method_site(ops: Ops, at: int) -> Read | None:
    method = ops[at][1]
    consts = _arguments(ops, at + 1, 0)
    if method == "open" and consts is not None and _writes(consts):
        return None
    before = ops[at - 1] if at >= 1 else ("", None)
    if before[0] in _ROOTS:  # RULES.read_text(), gzip.open(...)
        return Read(f".{method}()", ("name", (_ROOTS[before[0]], before[1])),
                    receiver=(before[1],))
    if before[0].startswith("CALL") and before[1] == 1 and at >= 3:  # Path(p).read_text()
        path = _path_at(ops, at - 2)
        callee = _chain_before(ops, at - 2)
        if path is not None and callee is not None:
            return Read(f"{callee[-1]}(...).{method}()", path, receiver=callee)
    return Read(f".{method}()")


def _chain_before(ops: Ops, end: int) -> tuple[str, ...] | None:
    """The names of a ``Path`` or ``pathlib.Path`` loaded just before index ``end``."""
    names: list[str] = []
    at = end - 1
    while at >= 0 and ops[at][0] in _ATTR:
        names.insert(0, ops[at][1])
        at -= 1
    return None if at < 0 or ops[at][0] not in _ROOTS else (ops[at][1], *names)


def code_canon(code: types.CodeType) -> Any:
    """What the code does, not where it was written; ``from __future__`` flags (0x20000 and up),
    which IPython inherits from earlier code, are masked: their effect is in the bytecode."""
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


def bound(root: tuple[str, str], scope: Scope) -> Any:
    """What a chain's root names now: a global (else a builtin), a closure cell, or the module
    an import inside the code binds; MISSING when none."""
    kind, name = root
    found, builtin_ns, cells = scope
    if kind == "g":
        return found.get(name, builtin_ns.get(name, MISSING))
    return cells.get(name, MISSING) if kind == "c" else imported(name, found)


def resolve_chain(chain: tuple, scope: Scope) -> tuple[types.ModuleType, Any, list[str]] | None:
    """(last module, value, names used) of a chain followed through modules, if from one."""
    (kind, _), *attrs = chain
    base = bound(chain[0], scope)
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
        if value is MISSING and kind == "m":  # `import a.b` in the code loads a.b when it runs
            value = imported(f"{owner.__name__}.{attr}", scope[0])
        used.append(attr)
    return owner, value, used


def imported(name: str, found: dict[str, Any]) -> Any:
    """The module an import inside the code binds, imported now as the code would, so the
    fingerprint is the same before and after its first run; MISSING when it cannot be."""
    try:
        if name.startswith("."):
            name = importlib.util.resolve_name(name, found.get("__package__") or "")
        module = sys.modules.get(name)
        return module if module is not None else importlib.import_module(name)
    except Exception:  # noqa: BLE001 - missing, failing on import, no package to be relative to
        return MISSING
