"""Content fingerprints of validators, answer sources and data: the same in any process, never
by object identity (docs/design.md, "Why content keys")."""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .. import _canon as canon
from .._canon import Unhashable, canonical_json, content_hash
from .walker import JUDGING, SOURCE, Node, Policy, Walker

__all__ = ["Fingerprint", "Unhashable", "canonical_json", "content_hash", "describe_changes",
           "fingerprint_callable", "fingerprint_function", "model_fingerprint",
           "unwrap_callable"]

_digest = canon.digest


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
    if callable(obj) or not _is_data(obj):
        try:
            node = walker.node(obj)
        except Exception:  # an object that raises when read (a hostile __getattribute__)
            walker = Walker(policy)
            parts = (("self", walker.by_identity(obj, "")),)
            node = Node(_digest("batchjson:fp:1", ["opaque", list(parts)]), parts, ("",),
                        (), ())
    else:  # a plain value: by content (for a source, immutable content only)
        parts = (("value", walker.ref(obj, "value")),)
        node = Node(_digest("batchjson:fp:1", ["value", list(parts)]), parts,
                    tuple(walker.identity), tuple(walker.unseen), tuple(walker.details))
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
