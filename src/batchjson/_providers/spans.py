"""The exact text of one value inside a JSON document, so ``raw`` is what the model sent: an
embedded answer (a tool call's ``input``) re-serialised would change spacing, key order, numbers and
escapes; slicing the body keeps the model's own bytes."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

_SPACE = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def value_span(text: str, path: Sequence[str | int]) -> tuple[int, int] | None:
    """``(start, end)`` of the value at ``path`` in the JSON ``text``, or ``None`` when it is not
    there; a key named twice resolves to its last occurrence, as ``json.loads`` does."""
    try:
        return _find(text, _skip(text, 0), list(path))
    except (ValueError, IndexError, RecursionError):
        return None


def _skip(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def _end(text: str, pos: int) -> int:
    """End of the value starting at ``pos`` (the C scanner, without building a copy we keep)."""
    return _decoder.raw_decode(text, pos)[1]


def _find(text: str, pos: int, path: list[str | int]) -> tuple[int, int] | None:
    if not path:
        return pos, _end(text, pos)
    want, rest = path[0], path[1:]
    if not (text[pos] == "{" and isinstance(want, str)
            or text[pos] == "[" and isinstance(want, int)):
        return None
    # the last of a key named twice wins, as in json.loads
    starts = [start for key, start in _children(text, pos) if key == want]
    return _find(text, starts[-1], rest) if starts else None


def _children(text: str, pos: int) -> list[tuple[str | int, int]]:
    """(key, value start) of each member of the object at ``pos``, or (index, start) of each
    element of the array there."""
    out: list[tuple[str | int, int]] = []
    close = "}" if text[pos] == "{" else "]"
    pos = _skip(text, pos + 1)
    if text[pos] == close:
        return out
    while True:
        key: str | int = len(out)
        if close == "}":
            key, pos = json.decoder.scanstring(text, pos + 1)  # type: ignore[attr-defined]
            pos = _skip(text, pos)
            if text[pos] != ":":
                raise ValueError("expected ':'")
            pos = _skip(text, pos + 1)
        out.append((key, pos))
        pos = _skip(text, _end(text, pos))
        if text[pos] == close:
            return out
        if text[pos] != ",":
            raise ValueError(f"expected ',' or '{close}'")
        pos = _skip(text, pos + 1)
