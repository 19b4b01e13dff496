"""Strings for generated answers: one that a JSON Schema ``pattern`` matches, or a ``format``.

A pattern is read with Python's own regular-expression parser and walked: literals, classes,
repeats, alternatives, groups and back-references are produced; anchors and look-arounds add
nothing, and every string made is checked with ``re.search`` (how JSON Schema applies a
pattern), so a look-around the walk cannot honour ends in :class:`NoString`, never in a string
that does not match. Everything is drawn from the ``random.Random`` given, so a seed decides it.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Sequence
from typing import Any

try:  # Python 3.11+: the parser behind ``re``
    from re import _constants as sre  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - older layouts
    import sre_constants as sre  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

# Characters a negated class or "." may yield: printable ASCII, letters first (a model's text).
_POOL = string.ascii_lowercase + string.ascii_uppercase + string.digits + "-_ .,:;/@#+=!?*'\""
_CATEGORY = {
    sre.CATEGORY_DIGIT: string.digits, sre.CATEGORY_NOT_DIGIT: string.ascii_lowercase,
    sre.CATEGORY_WORD: string.ascii_lowercase + string.digits,
    sre.CATEGORY_NOT_WORD: " -.,", sre.CATEGORY_SPACE: " ",
    sre.CATEGORY_NOT_SPACE: string.ascii_lowercase,
}
# How far past its minimum a repeat is stretched, tried in turn until the length fits.
_STRETCH = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


class NoString(Exception):
    """No string was found that satisfies the keyword; the message says why."""


def pattern_string(pattern: str, rng: random.Random, *, minimal: bool, min_length: int = 0,
                   max_length: int | None = None) -> str:
    """A string ``re.search(pattern, s)`` finds a match in, of a length within the bounds.

    ``minimal`` takes the fewest repeats and the shortest alternative (the smallest answer);
    otherwise repeats and choices are drawn from ``rng``. Raises NoString when none is found.
    """
    try:
        tree = sre_parse.parse(pattern)
        compiled = re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise NoString(f"{pattern!r} is not a regular expression Python can read ({exc})"
                       ) from None
    tried = 0
    for stretch in (None, *_STRETCH):
        if stretch is None and minimal:
            continue
        walker = _Walker(rng, 0 if stretch is None and minimal else stretch)
        try:
            text = walker.walk(tree)
        except _Unsupported as exc:
            raise NoString(f"{pattern!r} uses {exc}, which the generator cannot produce"
                           ) from None
        tried += 1
        if len(text) < min_length and stretch is not None and stretch < _STRETCH[-1]:
            continue
        if max_length is not None and len(text) > max_length:
            break  # stretching only makes it longer
        if len(text) >= min_length and compiled.search(text):
            return text
    bounds = _bounds(min_length, max_length)
    raise NoString(f"no string of {tried} tried matches {pattern!r}{bounds}")


def _bounds(min_length: int, max_length: int | None) -> str:
    if not min_length and max_length is None:
        return ""
    if max_length is None:
        return f" with at least {min_length} characters"
    return f" with {min_length} to {max_length} characters"


class _Unsupported(Exception):
    pass


class _Walker:
    """One walk over a parsed pattern. ``stretch`` None draws repeat counts from ``rng``;
    a number takes each repeat's minimum plus that many (bounded by its maximum)."""

    def __init__(self, rng: random.Random, stretch: int | None) -> None:
        self.rng, self.stretch = rng, stretch
        self.groups: dict[int, str] = {}

    def walk(self, items: Sequence[tuple[Any, Any]]) -> str:
        return "".join(self.one(op, arg) for op, arg in items)

    def one(self, op: Any, arg: Any) -> str:
        if op is sre.LITERAL:
            return chr(arg)
        if op is sre.NOT_LITERAL:
            return next(c for c in _POOL if ord(c) != arg)
        if op is sre.ANY:
            return self.rng.choice(string.ascii_lowercase)
        if op is sre.IN:
            return self.member(arg)
        if op is sre.BRANCH:
            return self.branch(arg[1])
        if op is sre.SUBPATTERN:
            group, sub = arg[0], arg[-1]
            text = self.walk(sub)
            if group is not None:
                self.groups[group] = text
            return text
        if op in _REPEATS:
            return self.repeat(*arg)
        if op is sre.GROUPREF:
            return self.groups.get(arg, "")
        if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
            return ""  # anchors add nothing; look-arounds are checked by re.search after
        if op is getattr(sre, "ATOMIC_GROUP", None):
            return self.walk(arg)
        raise _Unsupported(str(op).lower().replace("_", " "))

    def repeat(self, low: int, high: int, sub: Any) -> str:
        if self.stretch is None:
            count = self.rng.randint(low, min(high, low + 3))
        else:
            count = min(high, low + self.stretch)
        return "".join(self.walk(sub) for _ in range(count))

    def branch(self, alternatives: Sequence[Any]) -> str:
        if self.stretch is None:
            return self.walk(self.rng.choice(alternatives))
        texts = [self.walk(alt) for alt in alternatives]  # the shortest is the smallest answer
        return min(texts, key=len)

    def member(self, items: Sequence[tuple[Any, Any]]) -> str:
        """A character of a class ``[...]``: drawn from what it lists, or, negated, from the
        printable pool minus what it lists."""
        if items and items[0][0] is sre.NEGATE:
            allowed = [c for c in _POOL if not _in_class(c, items[1:])]
            if not allowed:
                raise _Unsupported("a negated class that excludes every printable character")
            return allowed[0] if self.stretch is not None else self.rng.choice(allowed)
        choices: list[Callable[[], str]] = []
        for op, arg in items:
            if op is sre.LITERAL:
                choices.append(lambda arg=arg: chr(arg))
            elif op is sre.RANGE:
                choices.append(lambda arg=arg: _in_range(self.rng, *arg))
            elif op is sre.CATEGORY:
                choices.append(lambda arg=arg: self.rng.choice(_CATEGORY[arg]))
            else:
                raise _Unsupported(f"{str(op).lower()} inside a character class")
        pick = choices[0] if self.stretch is not None else self.rng.choice(choices)
        return pick()


_REPEATS = tuple(op for op in (sre.MAX_REPEAT, sre.MIN_REPEAT,
                               getattr(sre, "POSSESSIVE_REPEAT", None)) if op is not None)


def _in_range(rng: random.Random, low: int, high: int) -> str:
    """A character of ``low-high``, a printable ASCII one when the range has any."""
    printable = [c for c in _POOL if low <= ord(c) <= high]
    return rng.choice(printable) if printable else chr(rng.randint(low, high))


def _in_class(char: str, items: Sequence[tuple[Any, Any]]) -> bool:
    code = ord(char)
    for op, arg in items:
        if op is sre.LITERAL and code == arg:
            return True
        if op is sre.RANGE and arg[0] <= code <= arg[1]:
            return True
        if op is sre.CATEGORY and _IS[arg](char):
            return True
    return False


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


_IS: dict[Any, Callable[[str], bool]] = {
    sre.CATEGORY_DIGIT: str.isdigit, sre.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
    sre.CATEGORY_WORD: _word, sre.CATEGORY_NOT_WORD: lambda c: not _word(c),
    sre.CATEGORY_SPACE: str.isspace, sre.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
}


# -- formats -----------------------------------------------------------------------------------
def format_string(name: str, rng: random.Random, *, minimal: bool) -> str | None:
    """A value of JSON Schema ``format`` ``name`` (and pydantic's formats), or None for a
    format this generator does not know (the value is then an ordinary string)."""
    n = 0 if minimal else rng.randint(1, 9999)
    day = 1 if minimal else rng.randint(1, 28)
    month = 1 if minimal else rng.randint(1, 12)
    clock = "00:00:00" if minimal else f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
    made = {
        "date-time": f"2024-{month:02d}-{day:02d}T{clock}Z",
        "date": f"2024-{month:02d}-{day:02d}", "time": f"{clock}Z",
        "duration": f"P{max(n % 30, 1)}D", "email": f"user{n}@example.com",
        "idn-email": f"user{n}@example.com", "hostname": f"host{n}.example.com",
        "idn-hostname": f"host{n}.example.com", "ipv4": f"192.0.2.{n % 256}",
        "ipv6": f"2001:db8::{n % 65536:x}", "uri": f"https://example.com/{n}",
        "iri": f"https://example.com/{n}", "uri-reference": f"/items/{n}",
        "iri-reference": f"/items/{n}", "uri-template": "https://example.com/{id}",
        "json-pointer": f"/items/{n}", "relative-json-pointer": f"0/items/{n}",
        "regex": "^[a-z]+$", "uuid": _uuid(rng, minimal), "multi-host-uri":
        f"https://example.com/{n}", "json-string": "{}", "binary": f"bytes{n}",
        "password": f"secret{n}", "path": f"data/file{n}.txt",
    }
    return made.get(name)


def _uuid(rng: random.Random, minimal: bool) -> str:
    bits = 0 if minimal else rng.getrandbits(128)
    text = f"{bits:032x}"
    text = text[:12] + "4" + text[13:16] + "8" + text[17:]  # version 4, RFC 4122 variant
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def plain_string(rng: random.Random, *, minimal: bool, min_length: int,
                 max_length: int | None) -> str:
    """Letters, between the bounds: the fewest allowed when ``minimal``."""
    if minimal:
        length = min_length
    else:
        high = max(min_length, 12) if max_length is None else max_length
        length = rng.randint(min_length, max(min_length, min(high, min_length + 10)))
        length = max(length, min(3, high))
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
