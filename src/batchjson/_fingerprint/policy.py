"""What a fingerprint counts: a validator's judging, or what an answer source is.

One walk, two policies. A container the code itself fills while running (``LOG.append``,
``self.seen.add``, ``cls.judged.append`` in a pydantic validator) counts by its type alone in
both: its growth must not make every run a new validator (in a strict session,
``ValidatorChanged`` forever: the seed's ratchet).
"""

from __future__ import annotations

import collections
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .._canon import digest, qualname
from .bytecode import scan

__all__ = ["JUDGING", "SOURCE", "Policy", "class_state", "self_state", "state_digest",
           "writes_of"]


@dataclass(frozen=True)
class Policy:
    """What differs between fingerprinting a validator and keying an answer source."""

    namespace: str | None  # a source's digests are namespaced: never equal to a validator's
    immutable_only: bool  # a mutable value counts by its type alone
    leaves_out_assigned: bool  # names and attributes the code assigns while serving calls
    reads_outside: bool  # files read count by content; environment and library reads are unseen
    # an object counts by its "state" (all of it), or by its "config" (the attributes the
    # user's own object was set up with; none of an installed library's object)
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
    return digest("batchjson:state:1", qualname(type(value))) if isinstance(
        value, _CONTAINERS) else None


def self_state(call: Any) -> frozenset[str]:
    """Attributes a callable instance's ``__call__`` changes on itself while judging."""
    return _changed_attrs([call]) if isinstance(call, types.FunctionType) else frozenset()


def class_state(cls: type, judging: frozenset[str]) -> frozenset[str]:
    """Class attributes that the methods named in ``judging`` (a pydantic model's validators,
    which run while judging) change in place (``cls.seen.append``): a log kept on the class,
    not its configuration. Other methods changing them (``allow(cls, label)``) are setup."""
    return _changed_attrs(_methods(cls, judging))


def writes_of(value: Any) -> frozenset[str]:
    """Attribute names a function, or a class's methods, assign outside construction: the
    state it mutates while serving calls (``self.calls += 1``), not its configuration."""
    if isinstance(value, types.FunctionType):
        return frozenset() if value.__name__ in CONSTRUCTION else scan(
            value.__code__).written_attrs
    if isinstance(value, type):
        return frozenset().union(*(scan(fn.__code__).written_attrs for fn in _methods(value)))
    return frozenset()


def _changed_attrs(functions: Iterable[types.FunctionType]) -> frozenset[str]:
    return frozenset(name for fn in functions for kind, name in scan(fn.__code__).mutated
                     if kind == "a")


def _methods(cls: type, only: frozenset[str] | None = None) -> Iterator[types.FunctionType]:
    """The functions of ``cls``'s own methods outside construction (``only``: those named,
    under pydantic's decorator proxy)."""
    for name, member in vars(cls).items():
        if name in CONSTRUCTION or (only is not None and name not in only):
            continue
        if only is not None:
            member = getattr(member, "wrapped", member)
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__
        if isinstance(member, types.FunctionType):
            yield member
