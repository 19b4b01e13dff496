"""Reading a receipts file: JSON Lines, or the JSON document ``batchjson export`` prints, every
number read as written so that one no float holds (``1e400``, ``1e-400``) is refused, naming its
line (or receipt) and field, before anything is imported."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._content.strictjson import finite_float, reject_constant
from .._errors import InvalidBatch


def refuse(path: Path, number: int, problem: str) -> InvalidBatch:
    return InvalidBatch(f"{path}, {place(number)}: {problem}; nothing was imported (fix the "
                        f"{place(number).split()[0]} and import the file again)")


class _OutOfRange(ValueError):
    """A number of the line no float holds: 1e400 (infinity) or 1e-400 (read as 0.0)."""


def _finite(text: str) -> float:
    """As a return's numbers are read: 1e400 would be infinity, and 1e-400 read as 0.0 would
    pass a maximum of -1e-400, equal an item's 0 or record a cost of nothing."""
    try:
        return finite_float(text)
    except ValueError as exc:
        raise _OutOfRange(str(exc)) from None


def _loads(text: str) -> Any:
    """Strict JSON: finite numbers only, and a nesting Python's parser can hold."""
    try:
        return json.loads(text, parse_constant=reject_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


class _Written(str):
    """A number's text as written, read so that a field holding one out of range is found."""


def _exact_to_floats(value: Any) -> tuple[str, str] | None:
    """Turn the numbers of a value read with ``parse_float=_Written`` into floats, in place
    (iteratively: a receipt may nest deep); (field, problem) of a number no float holds
    (``tasks[0].x``), else None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, where = stack.pop()
        pairs = (list(node.items()) if isinstance(node, dict) else list(enumerate(node))
                 if isinstance(node, list) else [])
        for key, child in pairs:
            at = (f"{where}.{key}" if where else str(key)) if isinstance(node, dict) \
                else f"{where}[{key}]"
            if isinstance(child, _Written):
                try:
                    node[key] = finite_float(child)
                except ValueError as exc:
                    return at, str(exc)
            elif isinstance(child, (dict, list)):
                stack.append((child, at))
    return None


class InDocument(int):
    """A receipt's number in an export's JSON document, which is said as "receipt N"."""


def place(number: int) -> str:
    return f"receipt {int(number)}" if isinstance(number, InDocument) else f"line {number}"


def document_receipts(path: Path, text: str) -> list[Any] | None:
    """The receipts of the JSON document ``batchjson export`` prints by default (``{"ledger":
    ..., "receipts": [...]}``), each checked for numbers as a line is; None for JSON Lines."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        document = json.loads(text, parse_float=_Written, parse_constant=reject_constant)
    except (ValueError, RecursionError):  # several lines of JSON, or not JSON: read as lines
        return None
    if not isinstance(document, dict) or "batch" in document or not isinstance(
            document.get("receipts"), list):
        return None
    for number, record in enumerate(document["receipts"], 1):
        bad = _exact_to_floats(record)
        if bad is not None:
            raise refuse(path, InDocument(number), f"field {bad[0]}: {bad[1]}")
    return document["receipts"]


def jsonl_lines(text: str) -> Iterable[str]:
    """JSON Lines split on newlines only: a JSON string may hold U+2028 or a form feed, which
    str.splitlines would cut through. A CR before the newline (CRLF files) is dropped."""
    for line in text.split("\n"):
        yield line[:-1] if line.endswith("\r") else line


def parsed_lines(path: Path, text: str) -> Iterable[tuple[int, Any]]:
    for number, raw_line in enumerate(jsonl_lines(text), 1):
        if not raw_line.strip():
            continue
        try:
            yield number, _loads(raw_line)
        except _OutOfRange as exc:
            where = _exact_to_floats(json.loads(raw_line, parse_float=_Written))
            raise refuse(path, number, f"field {where[0] if where else 'of the line'}: "
                          f"{exc}") from None
        except ValueError as exc:
            raise refuse(path, number, f"not JSON ({exc})") from None
