"""Define-once validator registry keyed by content: a re-run cell's new function gets back the
first object with its fingerprint (never with a partial one: its logic may differ unseen)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .._acceptance.judge import droste_verdicts
from .._errors import ValidatorChanged
from .._fingerprint.fingerprint import (
    Fingerprint,
    describe_changes,
    fingerprint_function,
    unwrap_callable,
)
from .._ledger.records import now
from .spec import check_text, check_verdicts

__all__ = ["Definition", "ValidatorRegistry", "ValidatorVersion"]


@dataclass
class ValidatorVersion:
    """One distinct content of a named validator; ``fn`` is the object handed back on reuse."""

    name: str
    version: int
    fingerprint: Fingerprint
    fn: Callable[..., Any]
    defined_at: str
    where: str


def _default_name(fn: Any) -> str:
    try:
        if isinstance(fn, functools.partial):
            return f"partial({_default_name(fn.func)})"
        name = getattr(fn, "__qualname__", None)
    except Exception:  # an object that raises when read is named by its class
        name = None
    return name if isinstance(name, str) and name else type(fn).__qualname__


def _where(fn: Any) -> str:
    """Best-effort "file:line" of the definition, for messages and the ledger."""
    try:
        target = unwrap_callable(fn)
        code = getattr(target, "__code__", None)
        if code is None and callable(target):
            code = getattr(type(target).__call__, "__code__", None)
    except Exception:  # an object that raises when read
        return "<unknown>"
    if not isinstance(code, types.CodeType):
        return "<unknown>"
    filename = code.co_filename
    if not filename.startswith("<"):
        filename = os.path.basename(filename)
    return f"{filename}:{code.co_firstlineno}"


Kind = Literal["registered", "unchanged", "reused", "changed"]


@dataclass(frozen=True)
class Definition:
    """What one definition did: ``kind``, ``fn`` (the object to use from now on), ``message``."""

    name: str
    version: int
    fingerprint: Fingerprint
    kind: Kind
    message: str
    fn: Callable[..., Any] = field(repr=False)
    record: ValidatorVersion = field(repr=False, compare=False)
    changes: tuple[str, ...] = ()


def _notes(fingerprint: Fingerprint) -> str:
    notes = ""
    if fingerprint.by_identity:
        notes += f"; compared by identity: {', '.join(fingerprint.by_identity)}"
    if fingerprint.partial:
        notes += (f"; partial fingerprint, cannot see: {', '.join(fingerprint.unseen)} "
                  "(using the object just defined)")
    return notes


class ValidatorRegistry:
    """Named validators, each a list of content versions; ``define`` is idempotent by content. A
    strict registry refuses new content for a name while requests under its current version are
    unresolved, so open evidence cannot be answered by different logic."""

    def __init__(
        self,
        *,
        strict: bool = False,
        unresolved_under: Callable[[str], int] | None = None,
        numbering: Callable[[ValidatorVersion], int] | None = None,
    ) -> None:
        self.strict = strict
        self.unresolved_under = unresolved_under
        self.numbering = numbering  # the ledger's numbering, stable across kernel restarts
        self._lock = threading.RLock()
        self._versions: dict[str, list[ValidatorVersion]] = {}
        self._current: dict[str, ValidatorVersion] = {}
        self._handed = threading.local()  # see version_of(hand_over=True)

    def define(self, fn: Callable[..., Any] | None = None, *,
               name: str | None = None) -> Any:
        """Register ``fn`` and return the first object registered with its fingerprint (unless
        that is partial); also a decorator, ``@define`` or ``@define(name="x")``."""
        if fn is None:
            return lambda f: self.register(f, name=name).fn
        return self.register(fn, name=name).fn

    def version_of(self, fn: Callable[..., Any], name: str | None = None, *,
                   hand_over: bool = False) -> ValidatorVersion:
        """Like ``define``, but return the version record. ``hand_over``: a helper registering
        ``fn`` on its way to a run; the next run on this thread takes this record by the object
        instead of fingerprinting again (any other registration, and every run, ends it)."""
        record = self.register(fn, name=name).record
        self._handed.record = record if hand_over else None
        return record

    def handed_over(self, fn: Any, name: str | None = None, *,
                    take: bool = False) -> ValidatorVersion | None:
        """The record :meth:`version_of` handed over for this very object (and ``name``, if
        given) on this thread, else None; ``take`` ends the hand-over either way."""
        record = getattr(self._handed, "record", None)
        if take:
            self._handed.record = None
        if record is None or record.fn is not fn or name not in (None, record.name):
            return None
        return record

    def register(self, fn: Callable[..., Any], *, name: str | None = None) -> Definition:
        """Register ``fn`` under ``name`` and say what happened (a :class:`Definition`)."""
        self._handed.record = None
        name, fingerprint = self._named(fn, name)
        with self._lock:
            history = self._versions.get(name, [])
            current = self._current.get(name)
            match = next((v for v in history if v.fingerprint.digest == fingerprint.digest), None)
            if match is not None:
                return self._reuse(name, match, current, fn, fingerprint)
            changes = self._refuse_if_strict(name, current, fingerprint)
            record = ValidatorVersion(name, len(history) + 1, fingerprint, fn, now(), _where(fn))
            if self.numbering is not None:
                record.version = self.numbering(record)
            self._versions.setdefault(name, []).append(record)
            self._current[name] = record
            if current is None:
                kind: Kind = "registered"
                message = (f"validator {name!r} registered (version {record.version}, "
                           f"{fingerprint.short})")
            else:
                kind = "changed"
                message = (f"validator {name!r} changed ({', '.join(changes)}): now version "
                           f"{record.version}")
            return Definition(name, record.version, fingerprint, kind,
                              message + _notes(fingerprint), fn, record, changes)

    def preview(self, fn: Callable[..., Any], *, name: str | None = None) -> ValidatorVersion:
        """The version ``fn`` would be (known, else version 0), nothing registered."""
        name, fingerprint = self._named(fn, name)
        with self._lock:
            match = next((v for v in self._versions.get(name, ())
                          if v.fingerprint.digest == fingerprint.digest), None)
            if match is not None:  # a partial fingerprint judges with the object just given
                return replace(match, fn=fn, fingerprint=fingerprint) if fingerprint.partial \
                    else match
            self._refuse_if_strict(name, self._current.get(name), fingerprint)
        return ValidatorVersion(name, 0, fingerprint, fn, now(), _where(fn))

    def _named(self, fn: Callable[..., Any], name: str | None) -> tuple[str, Fingerprint]:
        check_verdicts(fn)  # never a validator: refused before its version is recorded
        fingerprint = fingerprint_function(fn)  # outside the lock: pure, possibly slow
        if name is None:  # the name this very object was defined under (one validator), if any
            with self._lock:
                name = next((v.name for history in self._versions.values() for v in history
                             if v.fn is fn), None) or _default_name(fn)
            if name.endswith("<lambda>"):  # lambdas share one name: tell them apart by content
                name = f"{name}#{fingerprint.short}"
        check_text("a validator name", name, "validator(check, name='label_check')",
                   required=True)  # a ledger keeps it: valid Unicode, no control character
        return name, fingerprint

    def _refuse_if_strict(self, name: str, current: ValidatorVersion | None,
                          fingerprint: Fingerprint) -> tuple[str, ...]:
        """What changed since ``current``; refused when strict and owed."""
        changes = tuple(describe_changes(current.fingerprint, fingerprint)) if current else ()
        if current is not None and self.strict and self.unresolved_under is not None:
            unresolved = int(self.unresolved_under(current.fingerprint.digest))
            if unresolved > 0:
                raise ValidatorChanged(name, current.fingerprint.digest, fingerprint.digest,
                                       list(changes), unresolved)
        return changes

    def _reuse(self, name: str, match: ValidatorVersion, current: ValidatorVersion | None,
               fn: Callable[..., Any], fingerprint: Fingerprint) -> Definition:
        """A known version's object, or (partial fingerprint) the new one in its place."""
        if fingerprint.partial:
            match.fn, match.fingerprint = fn, fingerprint
        if current is match:
            kind: Kind = "unchanged"
            message = f"validator {name!r} unchanged: reusing version {match.version}"
        else:
            kind = "reused"
            message = (f"validator {name!r} matches version {match.version}: reusing it "
                       f"(was version {current.version if current else '?'})")
        self._current[name] = match
        return Definition(name, match.version, fingerprint, kind, message + _notes(fingerprint),
                          match.fn, match)

    def current(self, name: str) -> ValidatorVersion | None:
        """The version most recently defined (or re-selected) under ``name``."""
        with self._lock:
            return self._current.get(name)

    def versions(self, name: str) -> list[ValidatorVersion]:
        """Every version of ``name``, oldest first."""
        with self._lock:
            return list(self._versions.get(name, ()))

    def __iter__(self) -> Iterator[ValidatorVersion]:
        with self._lock:
            return iter(list(self._current.values()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._current)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._current

    def __repr__(self) -> str:
        with self._lock:
            names = ", ".join(f"{v.name} v{v.version}" for v in self._current.values())
        return f"ValidatorRegistry(strict={self.strict}, [{names}])"


def checker_of(version: ValidatorVersion, validator_args: str | None,
               timeout: float) -> Callable[[Any, Mapping[str, Any]], Any]:
    form = {"index": _index_form, "droste": droste_verdicts}.get(validator_args or "")
    return _bounded(version.fn if form is None else form(version.fn), timeout)  # async may hang


def _bounded(fn: Callable[[Any, Mapping[str, Any]], Any],
             seconds: float) -> Callable[[Any, Mapping[str, Any]], Any]:
    """An ``async def`` validator bounded by the session's timeout, never holding a run forever."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        out = fn(value, task)
        return _within(out, seconds) if inspect.isawaitable(out) else out

    return check


async def _within(awaitable: Any, seconds: float) -> Any:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise TimeoutError(f"the async validator did not return within {seconds:g}s (the "
                           "session's timeout=)") from None


def _index_form(fn: Callable[[Any, int], Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        return fn(value, task["index"])

    return check
