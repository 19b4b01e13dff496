"""What judging changes while it runs: logs, caches and counters a validator keeps.

A validator that appends to a global list, counts in ``self.n`` or fills a closure's set gets a
new content after every call; keyed by that content it would be a new validator on every run (and
in a strict session, ``ValidatorChanged`` forever: the seed's ratchet). Found from the bytecode,
so only what the code itself changes is state; a container it only reads stays content.
"""

from __future__ import annotations

import collections
import dis
import functools
import types
from typing import Any

from ._canon import digest, qualname

# Methods that change a container in place: a global or closure container the code calls one of
# these on is a log, a cache or a counter it keeps (LOG.append(task_id)), not configuration.
_MUTATORS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "pop",
                       "popitem", "clear", "remove", "discard", "appendleft", "extendleft",
                       "popleft", "difference_update", "intersection_update",
                       "symmetric_difference_update", "sort", "reverse"})
_CONTAINERS = (list, dict, set, bytearray, collections.deque)


_SKIP = frozenset({"CACHE", "NOP", "EXTENDED_ARG"})
_KEY_LOADS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME"})
_TARGETS = {"LOAD_GLOBAL": "g", "LOAD_DEREF": "c", "LOAD_CLOSURE": "c"}


@functools.lru_cache(maxsize=4096)
def mutated_by(code: types.CodeType) -> frozenset[tuple[str, str]]:
    """(kind, name) of the containers the code changes in place: globals (``g``), closure cells
    (``c``) and its first argument's attributes (``a``: ``self.log.append(...)``), by a mutating
    method, a subscript store (``X[k] = v``, ``X[k] += 1``) or, for ``self``, an assignment."""
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in _SKIP]
    first = code.co_varnames[0] if code.co_argcount else None
    out: set[tuple[str, str]] = set()
    for at, (op, arg) in enumerate(ops):
        if op in _TARGETS:
            target, rest = (_TARGETS[op], arg), ops[at + 1:at + 5]
        elif op == "LOAD_FAST" and arg == first and at + 1 < len(ops) and (
                ops[at + 1][0] == "LOAD_ATTR"):
            target, rest = ("a", ops[at + 1][1]), ops[at + 2:at + 6]
        elif op in ("STORE_ATTR", "DELETE_ATTR") and first is not None:
            out.add(("a", arg))
            continue
        else:
            continue
        names = [o for o, _ in rest]
        if (rest and names[0] in ("LOAD_ATTR", "LOAD_METHOD") and rest[0][1] in _MUTATORS) or (
                names[:1] and names[0] in _KEY_LOADS and (
                    names[1:2] in (["STORE_SUBSCR"], ["DELETE_SUBSCR"])
                    or names[1:4] == ["COPY", "COPY", "BINARY_SUBSCR"])):
            out.add(target)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= mutated_by(const)
    return frozenset(out)


def self_state(call: Any) -> frozenset[str]:
    """Attributes a callable instance's ``__call__`` changes on itself while judging."""
    if not isinstance(call, types.FunctionType):
        return frozenset()
    return frozenset(name for kind, name in mutated_by(call.__code__) if kind == "a")


def is_state(root: tuple[str, str], value: Any, mutated: frozenset[tuple[str, str]]) -> bool:
    return root in mutated and isinstance(value, _CONTAINERS)


def state_digest(value: Any) -> str:
    """A container the code itself fills while judging is keyed by its type alone: its growth
    must not make every run a new validator (in a strict session: ValidatorChanged forever)."""
    return digest("batchjson:state:1", qualname(type(value)))


_SETUP = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__", "__set_name__",
                    "__setstate__"})


def class_state(cls: type, judging: frozenset[str]) -> frozenset[str]:
    """Class attributes that the methods named in ``judging`` (a pydantic model's validators,
    which run while judging) change in place (``cls.seen.append``): a log kept on the class,
    not its configuration. Other methods changing them (``allow(cls, label)``) are setup."""
    out: set[str] = set()
    for name, member in vars(cls).items():
        if name not in judging:
            continue
        member = getattr(member, "wrapped", member)  # pydantic's decorator proxy
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if isinstance(member, types.FunctionType) and name not in _SETUP:
            out |= {attr for kind, attr in mutated_by(member.__code__) if kind == "a"}
    return frozenset(out)
