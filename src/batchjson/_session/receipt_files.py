"""Reading a receipts file: JSON Lines, or the JSON document ``batchjson export`` prints, every
number read as written (by ``_content/strictjson.py``) so that one no float holds (``1e400``,
``1e-400``) is refused, naming its line (or receipt) and field, before anything is imported."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._content.strictjson import finite_numbers, parse_as_written
from .._errors import InvalidBatch


def refuse(path: Path, number: int, problem: str) -> InvalidBatch:
    return InvalidBatch(f"{path}, {place(number)}: {problem}; nothing was imported (fix the "
                        f"{place(number).split()[0]} and import the file again)")


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
        document = parse_as_written(text)
    except ValueError:  # several lines of JSON, or not JSON: read as lines
        return None
    if not isinstance(document, dict) or "batch" in document or not isinstance(
            document.get("receipts"), list):
        return None
    for number, record in enumerate(document["receipts"], 1):
        bad = finite_numbers(record)
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
            record = parse_as_written(raw_line)
        except ValueError as exc:
            raise refuse(path, number, f"not JSON ({exc})") from None
        bad = finite_numbers(record)
        if bad is not None:
            raise refuse(path, number, f"field {bad[0]}: {bad[1]}")
        yield number, record
