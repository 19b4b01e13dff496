"""Content fingerprints of validators, answer sources and data: the same in any process, never
by object identity (docs/design.md, "Why content keys"). One walk, a :class:`Walker`, turns a
callable or value into a :class:`Node`, total thanks to its cycle guard, memo tables and identity
fallbacks, counting what its :class:`Policy` says ("one walk, two policies"); under both, a
container the code fills while running counts by its type alone."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import re
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from .. import _canon as canon
from .._canon import Unhashable, canonical_json, content_hash
from .bytecode import (
    DYNAMIC_ATTRS,
    DYNAMIC_BUILTINS,
    MISSING,
    CodeFacts,
    Scope,
    code_canon,
    is_module,
    resolve_chain,
    scan,
)
from .outside import (
    declares_state,
    file_parts,
    is_library_module,
    is_plain,
    is_plain_data,
    model_content,
    outside_read,
    slots_of,
    special_content,
)

__all__ = ["Fingerprint", "Unhashable", "canonical_json", "content_hash", "describe_changes",
           "fingerprint_callable", "fingerprint_function", "model_fingerprint",
           "unwrap_callable"]

@dataclass(frozen=True)
class Fingerprint:
    """Content identity of a callable: equal digests mean interchangeable code, in this process
    only if ``by_identity`` (not ``stable``), and blind to ``unseen`` reads if ``partial``."""

    digest: str
    by_identity: tuple[str, ...] = ()
    parts: tuple[tuple[str, str], ...] = ()
    unseen: tuple[str, ...] = ()
    details: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)
    _pins: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    @property
    def stable(self) -> bool:
        return not self.by_identity

    @property
    def partial(self) -> bool:
        return bool(self.unseen)

    @property
    def short(self) -> str:
        return self.digest[:12]


_digest, _qualname = canon.digest, canon.qualname
_VALUE_TYPES, _BUILTIN_CALLABLES = canon.VALUE_TYPES, canon.BUILTIN_CALLABLES
_DESCRIPTORS = (types.MemberDescriptorType, types.GetSetDescriptorType)
_DETAIL_DEPTH = 4  # nested paths kept for describe_changes: "global:Check>attr:_limit"
_DETAIL_CAP = 256  # per node: a list of 10,000 objects must not keep 20,000 paths
# Class attributes that are interpreter or framework bookkeeping, never behaviour.
_BOOKKEEPING = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
    "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__",
    "_abc_impl", "__abstractmethods__", "__slotnames__", "__signature__", "__class_vars__",
    "__private_attributes__", "model_fields", "model_computed_fields",
})


@dataclass(frozen=True)
class Policy:
    """What differs between fingerprinting a validator and keying an answer source."""

    namespace: str | None  # a source's digests are namespaced: never equal to a validator's
    immutable_only: bool  # a mutable value counts by its type alone
    leaves_out_assigned: bool  # names and attributes the code assigns while serving calls
    reads_outside: bool  # files read count by content; environment and library reads are unseen
    # an object counts by its "state", or its "config" (a user's object's setup; a library's none)
    instance: Literal["state", "config"]


# a validator: everything that decides what it accepts, what it reads out of sight named
JUDGING = Policy(None, immutable_only=False, leaves_out_assigned=False, reads_outside=True,
                 instance="state")
# an answer source: what it is, not what it keeps (a stub that counts its calls keeps one key)
SOURCE = Policy("batchjson:source:1", immutable_only=True, leaves_out_assigned=True,
                reads_outside=False, instance="config")

_CONTAINERS = (list, dict, set, bytearray, collections.deque)
# Methods that set an object up: what they assign is configuration, not state mutated per call.
CONSTRUCTION = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__",
                          "__set_name__", "__setstate__"})


def state_digest(value: Any) -> str | None:
    """A container the code itself fills counts by its type alone; None for any other value."""
    return _digest("batchjson:state:1", _qualname(type(value))) if isinstance(
        value, _CONTAINERS) else None


def changed_attrs(functions: Iterable[types.FunctionType]) -> frozenset[str]:
    """Attributes the functions change in place on their first argument: a log kept on the
    instance (``self.log.append``), or on a model's class by its validators."""
    return frozenset(name for fn in functions for kind, name in scan(fn.__code__).mutated
                     if kind == "a")


def _methods(cls: type, only: frozenset[str] | None = None) -> Iterator[types.FunctionType]:
    """``cls``'s own methods but construction (``only``: those named, under pydantic's proxy)."""
    for name, member in vars(cls).items():
        if name in CONSTRUCTION or (only is not None and name not in only):
            continue
        if only is not None:
            member = getattr(member, "wrapped", member)
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if isinstance(member, types.FunctionType):
            yield member


def _member_code(member: Any) -> Any:
    """What a class member runs, for descriptors that wrap a function (else the member): their
    own objects would be compared by identity, new each time the class is defined."""
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    if isinstance(member, property):
        return (member.fget, member.fset, member.fdel)
    if isinstance(member, functools.cached_property):
        return member.func
    if isinstance(member, functools.partialmethod):
        return (member.func, member.args, member.keywords)
    if isinstance(member, functools.singledispatchmethod):
        return tuple(sorted(((_qualname(k), f) for k, f in member.dispatcher.registry.items()),
                            key=itemgetter(0)))
    return member


_ROOTS = {"g": "global", "c": "closure", "m": "import"}


class Node(NamedTuple):
    """A walked object: digest, parts, and what below it is compared by identity or unseen."""

    digest: str
    parts: tuple[tuple[str, str], ...]
    by_identity: tuple[str, ...]  # paths relative to the node; "" is the node itself
    unseen: tuple[tuple[str, str], ...]  # (relative path, what)
    details: tuple[tuple[str, str], ...]  # (relative path, digest) below the parts


def _merge(inner: list[tuple[str, str]], own: list[tuple[str, str]]) -> list[tuple[str, str]]:
    if {n for n, _ in inner} & {n for n, _ in own}:
        inner = [(f"func.{n}", d) for n, d in inner]
    return inner + own


_OUTSIDE = ("file:", "listing:", "tree:", "glob:", "check:")  # parts that read the file system


def _join(label: str, rel: str) -> str:
    return f"{label}>{rel}" if rel else label


_WRITTEN = _digest("batchjson:written:1", None)  # state the code writes: never part of a source key
_ABSENT = _digest("batchjson:absent:1", None)

class Walker:
    """One fingerprint computation: cycle guard, memo tables and identity fallbacks."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.index: dict[int, int] = {}  # id -> stack position of objects being fingerprinted
        self.low: list[int] = []  # per stack frame: lowest stack position it refers back to
        self.memo: dict[int, Node] = {}
        self.data_memo: dict[int, str] = {}
        self.pins: list[Any] = []  # identity-compared objects: kept alive by the Fingerprint
        self.alive: list[Any] = []  # memo keys are ids: keep their objects alive for the walk
        self.identity: list[str] = []
        self.unseen: list[tuple[str, str]] = []
        self.details: list[tuple[str, str]] = []
        self.written_attrs: set[str] = set()
        self.classes: dict[type, tuple[str, bool, bool, tuple[str, ...]]] = {}
        self.label = ""
        self.root = 0  # id of the value a ref() started from: its nodes are named by the label
        self.hook_calls = 0
        self.canon = canon.Canon(self._hook, immutable_only=policy.immutable_only,
                                 code_of=self._class_code)

    def node(self, obj: Any) -> Node:
        key = id(obj)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        pos = len(self.low)
        self.index[key] = pos
        self.low.append(pos)
        saved = self.identity, self.unseen, self.details, self.label
        self.identity, self.unseen, self.details = [], [], []
        try:
            kind, parts = self._build(obj)
            details = [(p, d) for p, d in self.details[:_DETAIL_CAP]
                       if p.count(">") < _DETAIL_DEPTH]
            node = Node(_digest("batchjson:fp:1", [kind, parts]), tuple(parts),
                         tuple(self.identity), tuple(self.unseen), tuple(details))
        finally:
            self.identity, self.unseen, self.details, self.label = saved
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
        saved, self.label = (self.label, self.root), label
        self.root = id(value)
        calls = self.hook_calls
        marks = len(self.identity), len(self.unseen), len(self.details)
        try:
            digest = _digest("batchjson:value:1", self.canon.value(value))
        except Exception:  # Unhashable, RecursionError, or an odd object raising when read:
            del self.identity[marks[0]:], self.unseen[marks[1]:], self.details[marks[2]:]
            return self.by_identity(value, label)  # fingerprinting never fails on a value
        finally:
            self.label, self.root = saved
        if self.hook_calls == calls:  # pure data: safe to reuse wherever it is referenced
            self.data_memo[id(value)] = digest
            self.alive.append(value)
        return digest

    def by_identity(self, value: Any, label: str) -> str:
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
        if isinstance(x, _DESCRIPTORS):
            return ("descriptor", _qualname(x.__objclass__), x.__name__)
        node = self.node(x)
        label = self.label
        if id(x) != self.root and isinstance(x, type | types.FunctionType):
            label = f"{label}>{'class' if isinstance(x, type) else 'function'}:{x.__qualname__}"
        self.identity.extend(_join(label, rel) for rel in node.by_identity)
        self.unseen.extend((_join(label, rel), what) for rel, what in node.unseen)
        if len(self.details) < _DETAIL_CAP:
            self.details.extend((f"{label}>{p}", d) for p, d in (*node.parts, *node.details))
        return ("node", node.digest)

    def _class_code(self, cls: type) -> Any:
        """The class of a value held as data (a dataclass, an enum member, a model), walked when
        it is the user's code; None for installed code, which goes by its name."""
        return None if self._importable(cls) else self._hook(cls)

    def _importable(self, obj: Any) -> bool:
        """Installed code reachable by module.qualname goes by name; the user's by content."""
        module = getattr(obj, "__module__", None)
        if not is_library_module(module):
            return False
        target: Any = sys.modules.get(module)  # type: ignore[arg-type]
        for attr in getattr(obj, "__qualname__", "<none>").split("."):
            target = getattr(target, attr, None)
        return target is obj

    def _build(self, obj: Any) -> tuple[str, list[tuple[str, str]]]:
        if not callable(obj) and _is_data(obj):  # by content (a source's: immutable only)
            return "value", [("value", self.ref(obj, "value"))]
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
        wrapped = getattr(obj, "__wrapped__", None) if callable(obj) else None
        if callable(wrapped) and self._importable(type(obj)):  # lru_cache: the code, not the cache
            marks = len(self.details), len(self.unseen)
            inner = self._inner(wrapped)
            walked = (*inner, *self.details[marks[0]:])  # its parts and its helpers'
            if self.policy.reads_outside and hasattr(obj, "cache_clear") and (
                    self.unseen[marks[1]:] or any(  # it reads files or out of sight
                        n.rpartition(">")[2].startswith(_OUTSIDE) for n, _ in walked)):
                name = getattr(wrapped, "__qualname__", "a function")
                self.unseen.append(("", f"{name}() is cached (functools.lru_cache): an edit of "
                                    "what it reads is not seen by this process until "
                                    f"{name}.cache_clear()"))
            return "wrapper", _merge(inner, [("type", self.ref(type(obj), "type"))])
        return "instance", self._instance(obj)

    def _inner(self, fn: Any) -> list[tuple[str, str]]:
        pos = self.index.get(id(fn))
        if pos is not None:
            return [("func", _digest("batchjson:cycle:1", self._cycle(pos)))]
        node = self.node(fn)
        self.identity.extend(node.by_identity)
        self.unseen.extend(node.unseen)
        self.details.extend(node.details)
        return list(node.parts)

    def _function(self, fn: types.FunctionType) -> list[tuple[str, str]]:
        code = fn.__code__
        facts = scan(code)
        self._note_writes(fn)
        parts = [("code", _digest("batchjson:code:1", code_canon(code)))]
        if fn.__defaults__:
            parts.append(("defaults", self.ref(fn.__defaults__, "defaults")))
        if fn.__kwdefaults__:
            parts.append(("kwdefaults", self.ref(fn.__kwdefaults__, "kwdefaults")))
        parts += self._function_attributes(fn, facts)
        cells: dict[str, Any] = {}
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
            try:
                cells[name] = cell.cell_contents
            except ValueError:  # not yet assigned
                parts.append((f"closure:{name}", _ABSENT))
                continue
            parts.append(self._held("c", name, cells[name], facts))
        found, builtin_ns = fn.__globals__, fn.__builtins__
        if isinstance(builtin_ns, types.ModuleType):
            builtin_ns = vars(builtin_ns)
        for name in facts.globals:  # `Stub.calls += 1` in a helper: known before Stub is walked
            self._note_writes(found.get(name))
        for name in sorted(facts.globals):
            if name in found:
                parts.append(self._held("g", name, found[name], facts))
            elif name in builtin_ns:
                parts.append((f"builtin:{name}", self.ref(builtin_ns[name], f"builtin:{name}")))
                if name in DYNAMIC_BUILTINS:
                    self.unseen.append(("", f"{name}()"))
        scope = (found, builtin_ns, cells)
        parts += self._module_reads(facts.chains, scope)
        if self.policy.reads_outside:  # what judging reads from files, by content or unseen
            files, unseen = file_parts(facts, scope)
            parts += files
            self.unseen += [("", what) for what in unseen]
        for chain in sorted(facts.dynamic, key=repr):  # getattr(cfg, name): out of sight
            resolved = resolve_chain(chain, scope)
            if resolved is not None and is_module(resolved[1]):
                names = ".".join([chain[0][1], *resolved[2]])
                self.unseen.append(("", f"getattr({names}, <name>)"))
        return parts

    def _function_attributes(self, fn: types.FunctionType, facts: CodeFacts
                             ) -> list[tuple[str, str]]:
        """Attributes set on the function (``check.allowed = ...``), which its code may read
        through its own name: by content, but those its own code assigns (``check.calls += 1``)
        by their type alone, and a container it may fill by its type, named unseen (its stored
        answers are judged again); a decorator's dunders (``__wrapped__``) are walked elsewhere."""
        parts = []
        for name, value in sorted(vars(fn).items()):
            if name.startswith("__"):
                continue
            label, filled = f"attribute:{name}", state_digest(value)
            if filled is not None and name not in facts.written_attrs:  # it may fill it
                self.unseen.append(("", f"{fn.__name__}.{name}"))  # or read it: judged again
            if filled is None and name in facts.written_attrs:  # a count it keeps
                filled = _digest("batchjson:written:1", _qualname(type(value)))
            parts.append((label, filled or self.ref(value, label)))
        return parts

    def _held(self, kind: str, name: str, value: Any, facts: CodeFacts) -> tuple[str, str]:
        """A global or closure cell: left out if assigned (by policy), by type if filled."""
        label = f"{_ROOTS[kind]}:{name}"
        if self.policy.leaves_out_assigned and name in (
                facts.written_globals if kind == "g" else facts.written_cells):
            return label, _WRITTEN
        held = state_digest(value) if (kind, name) in facts.mutated else None
        return label, held or self.ref(value, label)

    def _note_writes(self, value: Any) -> None:
        """Note the attributes a function or class assigns outside construction (``self.calls
        += 1``): what it assigns serving calls, for a policy leaving that out."""
        if not self.policy.leaves_out_assigned:
            return
        if isinstance(value, type):
            functions: Iterable[types.FunctionType] = _methods(value)
        elif isinstance(value, types.FunctionType) and value.__name__ not in CONSTRUCTION:
            functions = (value,)
        else:
            return
        self.written_attrs.update(*(scan(fn.__code__).written_attrs for fn in functions))

    def _module_reads(self, chains: frozenset, scope: Scope) -> list[tuple[str, str]]:
        """``mod.NAME`` read by the code: the attribute's value, not the module's name."""
        out: dict[str, str] = {}
        for chain in sorted(chains, key=repr):
            resolved = resolve_chain(chain, scope)
            if resolved is None or not resolved[2]:
                continue
            owner, value, used = resolved
            (kind, root) = chain[0]
            dot = "" if root.endswith(".") else "."  # `from . import x` names ".x"
            label = f"{_ROOTS[kind]}:{root}{dot}{'.'.join(used)}"
            if label in out:
                continue
            if (owner.__name__, used[-1]) in DYNAMIC_ATTRS:
                self.unseen.append(("", f"{owner.__name__}.{used[-1]}()"))
            library = is_library_module(owner.__name__)
            hidden = (outside_read(owner.__name__, used, value)
                      if library and self.policy.reads_outside else None)
            if hidden is not None:  # pd.read_csv(path), os.environ: read out of sight
                self.unseen.append(("", hidden))
            if value is MISSING:
                out[label] = _ABSENT
            elif used[-1] in self.written_attrs:
                out[label] = _WRITTEN
            elif library and not is_plain(value):
                # installed modules' own state (os.environ, sys.modules) is the environment
                out[label] = _digest("batchjson:ref:1", [owner.__name__, used[-1]])
            else:
                out[label] = self.ref(value, label)
        return list(out.items())

    def _class(self, cls: type) -> list[tuple[str, str]]:
        parts = [("name", _digest("batchjson:ref:1", [cls.__module__, cls.__qualname__]))]
        if self._importable(cls):
            return parts
        model = issubclass(cls, BaseModel) and cls is not BaseModel
        decorators: frozenset[str] = frozenset()
        if model:  # by what decides validation: core schema, private attributes, validators
            core, privates, decorators = model_content(cls)
            parts.append(("core", self.by_identity(cls, "core") if core is None  # forward refs
                          else self.ref(core, "core")))
            parts += [(f"private:{n}", self.ref(d, f"private:{n}")) for n, d in privates]
        for base in cls.__bases__:
            if base is not object:
                label = f"base:{base.__qualname__}"
                parts.append((label, self.ref(base, label)))
        members = sorted(vars(cls).items(), key=itemgetter(0))
        self._note_writes(cls)
        # a log its validators fill while judging is state; other methods' changes are setup
        kept = changed_attrs(_methods(cls, frozenset(decorators))) if model else ()
        for name, value in members:
            if name in _BOOKKEEPING or (model and name.startswith("__pydantic")):
                continue
            value = _member_code(value)
            label = f"{'validator' if name in decorators else 'attr'}:{name}"
            held = state_digest(value) if name in kept else None
            if name in self.written_attrs and not callable(value):
                held = _WRITTEN
            parts.append((label, held or self.ref(value, label)))
        return parts

    def _class_facts(self, cls: type) -> tuple[str, bool, bool, tuple[str, ...]]:
        """Per walk and class: its digest, whether it or any base is installed code, its slots."""
        facts = self.classes.get(cls)
        if facts is None:
            importable = self._importable(cls)
            facts = (self.ref(cls, "type"), importable,
                     importable or any(k is not object and self._importable(k)
                                       for k in cls.__mro__),
                     tuple(n for k in cls.__mro__ for n in slots_of(k)))
            if id(cls) in self.memo:  # context-free (no cycle through the stack): reusable
                self.classes[cls] = facts
        return facts

    def _instance(self, obj: Any) -> list[tuple[str, str]]:
        call = type(obj).__call__ if callable(obj) else None
        calls = [call] if isinstance(call, types.FunctionType) else []
        inner = self._inner(call) if calls else []  # first: what it walks decides the rest
        digest, importable, _, _ = self._class_facts(type(obj))
        own = [("type", digest)]
        special = special_content(obj)
        if special is not None:
            kind, content = special
            if content is not None:
                own.append((kind, self.ref(content, kind)))
        elif self.policy.instance == "state":  # what judging changes (self.log) by type
            own.append(("instance", self._state(obj, changed_attrs(calls))))
        elif not importable:  # a source's own object: its configuration only
            own.append(("config", self._config(obj)))
        return _merge(inner, own)

    def _config(self, obj: Any) -> str:
        """A source object's attributes but those it assigns serving calls (counters, logs)."""
        state = _attributes(obj, self._class_facts(type(obj))[3])
        kept = tuple(sorted((k, v) for k, v in state.items()  # a tuple: its values count
                            if k.removeprefix("slot:") not in self.written_attrs))
        return self.ref(kept, "config")

    def _state(self, obj: Any, skip: frozenset[str]) -> str:
        """An instance's content: its ``__dict__`` and slots, else what pickling would save;
        attributes in ``skip`` (changed by its own judging) by their type alone."""
        cls = type(obj)
        if cls is object:  # a sentinel (`_MISSING = object()`): nothing but its identity, which
            return _digest("batchjson:sentinel:1", None)  # a re-run cell's new one serves alike
        _, importable, library_base, slots = self._class_facts(cls)
        state: dict[str, Any] = {}
        if not importable:
            state = _attributes(obj, slots)
            state.update((k, ("state", _qualname(type(v)))) for k, v in list(state.items())
                         if k in skip)
            if not library_base:
                return self.ref(state, "instance")  # a library base may hold C-level state:
        elif not declares_state(cls):  # pickling would save it, below
            # a library object silent on its state: its __dict__ if plain data, else itself (a
            # client's pools and caches would give a new digest after every use)
            plain = dict(getattr(obj, "__dict__", None) or {})
            plain.update((f"slot:{n}", getattr(obj, n, None)) for n in slots)
            python_level = hasattr(obj, "__dict__") or slots  # else its state lives in C
            if python_level and is_plain_data(plain):
                return self.ref(plain, "instance")
            return self.by_identity(obj, "")
        try:
            reduced = obj.__reduce_ex__(4)
        except Exception:  # not picklable: nothing to read but the object itself
            return self.by_identity(obj, "")
        if isinstance(reduced, str):  # a module-level singleton named by its global name
            return self.ref((cls.__module__, reduced), "instance")
        fn, args, extra, items, pairs = (*reduced, None, None, None)[:5]
        content = (fn, args, extra, None if items is None else list(items),
                   None if pairs is None else list(pairs))
        if any(x is obj for x in (args or ())):
            return self.by_identity(obj, "")
        return self.ref((state, content) if state else content, "instance")


def _attributes(obj: Any, slots: tuple[str, ...]) -> dict[str, Any]:
    """An instance's ``__dict__`` and the slots it has set (as ``slot:<name>``)."""
    found: dict[str, Any] = {}
    with contextlib.suppress(TypeError):  # no __dict__
        found.update(vars(obj))
    found.update((f"slot:{slot}", value) for slot in slots
                 if (value := getattr(obj, slot, MISSING)) is not MISSING)
    return found


# -- fingerprints of validators, answer sources and schemas ---------------------------------
def _is_data(obj: Any) -> bool:
    """Values canon encodes itself; anything else is an object the walker reads."""
    return isinstance(obj, (*canon.SCALARS, list, dict, tuple, set, frozenset, enum.Enum,
                            BaseModel)) or (dataclasses.is_dataclass(obj)
                                            and not isinstance(obj, type))


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


def _fingerprint(obj: Any, policy: Policy) -> Fingerprint:
    walker = Walker(policy)
    try:
        node = walker.node(obj)
    except Exception:  # an object that raises when read (a hostile __getattribute__)
        walker = Walker(policy)
        parts = (("self", walker.by_identity(obj, "")),)
        node = Node(_digest("batchjson:fp:1", ["opaque", list(parts)]), parts, ("",), (), ())
    unseen = tuple(dict.fromkeys(f"{path}: {what}" if path else what
                                 for path, what in node.unseen))
    digest = _digest(policy.namespace, node.digest) if policy.namespace else node.digest
    return Fingerprint(digest, tuple(dict.fromkeys(node.by_identity)), node.parts, unseen,
                       node.details, tuple(walker.pins))


def fingerprint_function(fn: Callable[..., Any]) -> Fingerprint:
    """A validator's fingerprint: all that decides what it accepts, wherever it is defined."""
    if not callable(fn):
        raise TypeError(f"expected a callable, got {type(fn).__qualname__}")
    return _fingerprint(fn, JUDGING)


def fingerprint_callable(obj: Any) -> Fingerprint:
    """An answer source's key (never a validator's digest): its code, immutable values and
    configuration (``self.model``), never what it assigns serving calls (``self.calls += 1``)."""
    return _fingerprint(obj, SOURCE)


def model_fingerprint(model: type[BaseModel], json_schema: dict[str, Any],
                      fp: Fingerprint | None = None) -> str:
    """A pydantic answer schema's: the JSON schema shown and the whole class (``fp``, if made)."""
    fp = fp or fingerprint_function(model)
    return _digest("batchjson:model:1", [f"{model.__module__}.{model.__qualname__}",
                                         canonical_json(json_schema), fp.digest])


# -- what changed between two fingerprints: "global Check: attribute _limit changed", from the
# parts a few levels down (``global:Check>attr:_limit``) a fingerprint keeps beside its own
_SUBJECTS = {"code": "code", "defaults": "default arguments",
             "kwdefaults": "keyword-only defaults", "self": "bound instance",
             "instance": "instance state", "type": "class", "schema": "model schema",
             "core": "model fields and constraints", "func": "wrapped callable",
             "ref": "referenced callable", "name": "class name", "logger": "logger name",
             "type-adapter": "TypeAdapter type", "jsonschema": "JSON Schema",
             "config": "configuration"}
_PREFIXES = {"global": "global", "builtin": "builtin", "closure": "closure variable",
             "partial": "partial", "attr": "attribute", "base": "base class",
             "import": "imported", "validator": "validator", "private": "private attribute",
             "class": "class", "function": "function", "file": "file",
             "listing": "directory listing", "tree": "directory tree", "glob": "files matching",
             "check": "path check"}
_MAX_DETAILS = 3  # per changed top-level part


def _subject(name: str) -> str:
    core = name.removeprefix("func.")
    head, sep, rest = core.partition(":")
    subject = f"{_PREFIXES[head]} {rest}" if sep and head in _PREFIXES else _SUBJECTS.get(core)
    return ("wrapped " if core != name else "") + (subject or core)


def _phrase(name: str, what: str, identity: set[str]) -> str:
    return f"{_subject(name)} {what}" + (" (compared by identity)" if name in identity else "")


def _deeper(part: str, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The innermost changed paths under a changed top-level part."""
    prefix = part + ">"
    changed = sorted(p for p in set(before) | set(after)
                     if p.startswith(prefix) and before.get(p) != after.get(p))
    leaves = [p for p in changed if not any(q.startswith(p + ">") for q in changed)]
    out = []
    for path in leaves[:_MAX_DETAILS]:
        what = "added" if path not in before else "removed" if path not in after else "changed"
        out.append(": ".join(_subject(step) for step in path.split(">")) + f" {what}")
    return out


def describe_changes(old: Any, new: Any) -> list[str]:
    """What differs between two fingerprints; [] when they are equal."""
    if old.digest == new.digest:
        return []
    before, after = dict(old.parts), dict(new.parts)
    deep_before, deep_after = dict(old.details), dict(new.details)
    identity = set(old.by_identity) | set(new.by_identity)
    phrases = []
    for name, digest in new.parts:
        if name not in before:
            phrases.append(_phrase(name, "added", identity))
        elif before[name] != digest:
            deeper = [] if name in identity else _deeper(name, deep_before, deep_after)
            phrases.extend(deeper or [_phrase(name, "changed", identity)])
    phrases += [_phrase(n, "removed", identity) for n, _ in old.parts if n not in after]
    return phrases or ["kind of callable changed"]
