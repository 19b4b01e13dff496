"""Content hashing of data: a type-tagged, order-insensitive, process-stable digest."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import decimal
import enum
import hashlib
import json
import marshal
import pathlib
import threading
import types
import typing
import uuid
from collections.abc import Callable
from itertools import chain, repeat
from json.encoder import c_make_encoder, encode_basestring, encode_basestring_ascii
from operator import itemgetter
from typing import Any

from pydantic import BaseModel
from pydantic_core import from_json

from ._errors import BatchJsonError

# marshal format 2 writes no back-references, so its bytes depend on values, never on sharing.
_MARSHAL = 2
SCALARS = frozenset({str, int, float, bool, type(None), bytes})
_BASES = (str, int, float, bytes, list, tuple, dict, set, frozenset)
_MUTABLE = frozenset({list, dict, set, bytearray})
BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.MethodWrapperType,
                      types.WrapperDescriptorType, types.MethodDescriptorType,
                      types.ClassMethodDescriptorType)
VALUE_TYPES = (_dt.date, _dt.time, _dt.timedelta, decimal.Decimal, uuid.UUID, pathlib.PurePath,
                complex, range)


class Unhashable(BatchJsonError, TypeError):
    """A value has no stable content encoding; fingerprints fall back to its identity."""


class _Back(Exception):
    def __init__(self, levels: int) -> None:
        self.levels = levels


class FastEncoder:
    """``encoder.encode`` by the C encoder alone, without ``encode``'s costly Python layers (the
    same text): one per thread, since it records the containers it is in, made anew after an
    encoding that failed part way."""

    def __init__(self, encoder: json.JSONEncoder, encode_string: Callable[[str], str]) -> None:
        self._encoder = encoder
        self._args = (encoder.default, encode_string, None, encoder.key_separator,
                      encoder.item_separator, encoder.sort_keys, encoder.skipkeys,
                      encoder.allow_nan)
        self._per_thread = threading.local()

    def __call__(self, value: Any) -> str:
        if c_make_encoder is None:  # an interpreter without the C accelerator
            return self._encoder.encode(value)
        encode = getattr(self._per_thread, "encode", None) or self._new()
        try:
            return "".join(encode(value, 0))
        except BaseException:
            self._new()
            raise

    def _new(self) -> Callable[[Any, int], Any]:
        self._per_thread.encode = c_make_encoder({}, *self._args)
        return self._per_thread.encode


# One JSON text per JSON value (keys sorted, no spaces, non-ASCII kept, finite numbers): what
# content is keyed and hashed by.
canonical_json = FastEncoder(json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False),
    encode_basestring)
# The ledger's JSON text of a value (json.dumps's form, keys sorted), as every checkpoint row
# holds.
ledger_json = FastEncoder(json.JSONEncoder(sort_keys=True, allow_nan=False),
                          encode_basestring_ascii)


def read_json(text: str | bytes) -> Any:
    """A JSON text read as ``json.loads`` reads it, by pydantic-core's parser (several times
    faster on the small texts of tasks and replies); by ``json.loads`` itself where that parser
    refuses (a lone surrogate, escaped or not, nesting deeper than it goes, a text that is no
    JSON), so what is returned or raised is always ``json.loads``'s."""
    try:
        return from_json(text)
    except (ValueError, TypeError):
        return json.loads(text)


def dump(canon: Any) -> bytes:
    try:
        return marshal.dumps(canon, _MARSHAL)
    except (ValueError, RecursionError) as exc:
        raise Unhashable(f"cannot encode value: {exc}") from None


def digest(tag: str, canon: Any) -> str:
    return hashlib.sha256(tag.encode() + b"\0" + dump(canon)).hexdigest()


def show_as(module: str, *classes: type) -> None:
    """The public classes print, and are keyed, as ``module.Name`` (``batchjson.Session``): no
    move inside batchjson changes a stored key. Annotations are resolved in their own module."""
    for cls in classes:
        own = cls.__dict__.get("__annotations__", {})
        hints = typing.get_type_hints(cls, include_extras=True)
        cls.__annotations__ = {name: hints[name] for name in own}
        cls.__module__ = module


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _as_base(x: Any, base: type) -> Any:
    """An exact-type copy of a builtin-subclass instance, read without its overrides."""
    if base in (str, bytes, list, tuple):
        return base.__getitem__(x, slice(None))
    copy = {int: int.__int__, float: float.__float__, dict: dict.copy}.get(base, base)
    return copy(x)


class Canon:
    """Maps a value to a marshal-able form, injective over values (types included), blind to
    dict and set order and to sharing; every tuple in it is a tag (a user's: ("t", [...])). With
    ``immutable_only`` a mutable value counts by its type (a source's log must not move its key)."""

    def __init__(self, hook: Callable[[Any], Any] | None = None, *,
                 immutable_only: bool = False,
                 code_of: Callable[[type], Any] | None = None) -> None:
        self.hook = hook
        self.code_of = code_of  # a user's class's content (its methods), None for a library's
        self.immutable_only = immutable_only
        self.active: dict[int, int] = {}  # id -> depth of the containers being encoded

    def value(self, x: Any) -> Any:
        t = type(x)
        if t in SCALARS:
            return x
        if self.immutable_only and t in _MUTABLE:
            return ("M", t.__name__)
        try:
            if t is list:
                return self.seq(x)
            if t is dict:
                return self.mapping(x)
            if t is tuple:
                return ("t", self.seq(x))
            if t is set or t is frozenset:
                return ("s" if t is set else "f", self.members(x))
            return self.other(x)
        except _Back as back:  # x is a container already being encoded, `levels` up
            return ("B", back.levels)

    def _enter(self, x: Any) -> int:
        key = id(x)
        depth = self.active.get(key)
        if depth is not None:
            if self.hook is None:
                raise Unhashable("cyclic structure")
            # a cycle through code (a dispatch table its functions read): by distance
            raise _Back(len(self.active) - depth)
        self.active[key] = len(self.active)
        return key

    def seq(self, xs: list[Any] | tuple[Any, ...]) -> Any:
        types_ = set(map(type, xs))
        if types_ <= SCALARS:
            return xs if type(xs) is list else list(xs)
        key = self._enter(xs)
        try:
            if types_ == {dict}:
                records = self.records(xs)
                if records is not None:
                    return records
            return [self.value(x) for x in xs]
        finally:
            self.active.pop(key, None)

    def records(self, xs: list[dict[Any, Any]] | tuple[dict[Any, Any], ...]) -> Any:
        """Columnar form for a list of dicts sharing one set of str keys, else None."""
        first = xs[0]
        n = len(first)
        if n == 0 or set(map(type, first)) != {str} or set(map(len, xs)) != {n}:
            return None
        keys = sorted(first)
        try:
            rows = list(map(itemgetter(*keys), xs))  # same size + all keys present = same keys
        except KeyError:
            return None
        cells = rows if n == 1 else chain.from_iterable(rows)
        if set(map(type, cells)) <= SCALARS:
            return ("R", keys, rows)
        columns = [rows] if n == 1 else list(zip(*rows, strict=True))
        return ("C", keys, [self.seq(column) for column in columns])

    def mapping(self, d: dict[Any, Any]) -> Any:
        if not d:
            return ("d", [], [])
        key = self._enter(d)
        try:
            if set(map(type, d)) == {str}:
                keys = sorted(d)
                return ("d", keys, self.seq(list(map(d.__getitem__, keys))))
            pairs = sorted(((dump(self.value(k)), v) for k, v in d.items()), key=itemgetter(0))
            return ("k", [k for k, _ in pairs], self.seq([v for _, v in pairs]))
        finally:
            self.active.pop(key, None)

    def members(self, s: set[Any] | frozenset[Any]) -> list[bytes]:
        if set(map(type, s)) <= SCALARS:
            return sorted(map(marshal.dumps, s, repeat(_MARSHAL)))
        return sorted(dump(self.value(e)) for e in s)

    def other(self, x: Any) -> Any:
        name = qualname(x if isinstance(x, type) else type(x))
        if isinstance(x, enum.Enum):
            return ("E", self._class_of(x, name), self.value(x.value))
        if isinstance(x, type):
            if self.hook is not None:  # classes are code: the fingerprint walker owns them
                return ("H", self.hook(x))
            if issubclass(x, BaseModel):
                return ("S", name, self.value(_call(x.model_json_schema, name)))
        elif isinstance(x, (BaseModel, *_BASES)) or dataclasses.is_dataclass(x):
            if self.immutable_only and not _frozen(x):
                return ("M", name)
            key, name = self._enter(x), self._class_of(x, name)
            try:
                if isinstance(x, BaseModel):
                    return ("P", name, self.value(_call(x.model_dump, name, mode="json")))
                if dataclasses.is_dataclass(x):
                    names = [f.name for f in dataclasses.fields(x)]
                    return ("D", name, names, self.seq([getattr(x, n) for n in names]))
                base = next(b for b in _BASES if isinstance(x, b))
                return ("X", name, self.value(_as_base(x, base)))
            finally:
                self.active.pop(key, None)
        if self.hook is not None:
            return ("H", self.hook(x))
        raise Unhashable(f"cannot content-hash a {name}")

    def _class_of(self, x: Any, name: str) -> Any:
        """An instance held as data named by its class, and by the class's content where that
        is the user's code: its methods edited, it is another value."""
        code = None if self.code_of is None else self.code_of(type(x))
        return name if code is None else (name, code)


def _frozen(x: Any) -> bool:
    """Whether a model, dataclass or builtin-subclass instance is immutable."""
    if isinstance(x, BaseModel):
        return bool(x.model_config.get("frozen"))
    if dataclasses.is_dataclass(x):
        return bool(x.__dataclass_params__.frozen)  # type: ignore[attr-defined]
    return not isinstance(x, tuple(_MUTABLE))


def _call(method: Callable[..., Any], name: str, **kwargs: Any) -> Any:
    try:
        return method(**kwargs)
    except Exception as exc:  # pydantic raises several types for unserialisable content
        raise Unhashable(f"cannot serialise {name}: {exc}") from None


def content_hash(obj: Any) -> str:
    """sha256 of a type-tagged, order-insensitive encoding, stable across processes ((1, "1",
    True, [1], (1,)) all differ). Raises Unhashable for values without one."""
    try:
        canon = Canon().value(obj)
    except RecursionError:
        raise Unhashable("value is nested too deeply") from None
    return digest("batchjson:content:1", canon)
