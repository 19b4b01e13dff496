"""What changed between two fingerprints, in words a notebook user can act on.

A fingerprint keeps its top-level parts (``global:Check``) and, a few levels down, the parts of
what they reference (``global:Check>attr:_limit``), so a message can say "global Check:
attribute _limit changed" instead of only "global Check changed".
"""

from __future__ import annotations

from typing import Any

__all__ = ["describe_changes"]

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
