"""What ``%config BatchJson.<setting> = value`` accepts, and how a refusal is said.

IPython's ``%config`` logs whatever a configurable raises and lets the cell succeed, and
traitlets deep-copies every config value. Here a provider object is kept as given, and a refused
setting fails the cell with a ``UsageError`` naming the setting, the value and what is allowed,
with the previous value still in force.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from copy import deepcopy
from typing import Any

from IPython.core.error import UsageError
from traitlets import Bool, Int, TraitError, TraitType
from traitlets.config.loader import LazyConfigValue

from .._providers.masking import masked, public_url
from .display import clip

MEANING = {"model": "a model name (a string)", "ledger": "a file path (a string) or ':memory:'"}


class Refused(TraitError):
    """A value a setting's own check refused; its message says why."""


class NotApplied(TraitError):
    """A valid setting the live session could not take; the old value was put back."""


class AsGiven:
    """A config value traitlets will not deep-copy, so ``%config BatchJson.provider = obj``
    configures ``obj`` itself (a provider may hold a connection pool, a lock or a counter)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __deepcopy__(self, memo: Any) -> AsGiven:
        return self

    def __repr__(self) -> str:
        return repr(self.value)


def shield(config: Any) -> None:
    """Wrap an object-valued ``BatchJson.provider`` in a config in place (idempotent)."""
    if not isinstance(config, dict) or "BatchJson" not in config:
        return
    section = config["BatchJson"]
    if isinstance(section, dict) and "provider" in section:
        value = section["provider"]
        if value is not None and not isinstance(value, (str, AsGiven, LazyConfigValue)):
            section["provider"] = AsGiven(value)


def shown(name: str, value: Any) -> str:
    """A setting's value for a message; a string given as provider or model may be a pasted
    key, so only its first characters are shown, and a ledger URL's password is masked."""
    if name in ("provider", "model") and isinstance(value, str):
        return masked(value)
    return kept(name, value)


def kept(name: str, value: Any) -> str:
    """A value a setting holds (so already accepted) for a message; a ledger URL's password
    is masked all the same."""
    if name == "ledger" and isinstance(value, str):
        value = public_url(value)
    return clip(repr(value), 80)


def allowed(name: str, trait: TraitType[Any, Any]) -> str:
    """What setting ``name`` accepts, read from its trait."""
    if isinstance(trait, Bool):
        text = "True or False"
    elif isinstance(trait, Int):
        text = f"a whole number >= {trait.min}"
    else:
        text = MEANING[name]
    return text + " or None" if trait.allow_none else text


def refused(name: str, value: Any, old: Any, trait: TraitType[Any, Any],
            exc: TraitError) -> str:
    """The message for a value the trait refused (the provider's validator says why itself)."""
    why = (str(exc) if name == "provider" or isinstance(exc, Refused)
           else f"it must be {allowed(name, trait)}")
    return (f"BatchJson.{name} = {shown(name, value)} is refused: {why}. "
            f"BatchJson.{name} stays {kept(name, old)}")


def guarded(magics: Any, builtin: Callable[[str], Any]) -> Callable[[str], Any]:
    """IPython's ``%config``, except that a BatchJson setting it refuses fails the cell.

    It runs with ``magics.refusals`` collecting what ``BatchJson.update_config`` refused, takes
    the refused setting back out of the other configurables' copies of the config (the
    shell's is read again by a later ``%load_ext``) and raises the first as a UsageError."""
    @functools.wraps(builtin)
    def config(line: str) -> Any:
        shell = magics.shell
        holders = [c for c in (shell, *shell.configurables)
                   if c is not magics and hasattr(c, "config")]
        before = [deepcopy(c.config.get("BatchJson")) for c in holders]
        magics.refusals = []
        try:
            answer = builtin(line)
        finally:
            refusals, magics.refusals = magics.refusals, None
        if not refusals:
            return answer
        for holder, section in zip(holders, before, strict=True):
            if section is None:
                holder.config.pop("BatchJson", None)
            else:
                holder.config["BatchJson"] = section
        raise UsageError(refusals[0])

    return config
