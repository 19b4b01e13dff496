"""Text a terminal may be shown (what would act on it escaped), aligned, and the one table model."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Control characters (ANSI escapes, carriage returns, bells) and bidirectional overrides in a
# model's return or an imported batch name would act on the terminal instead of being read; a
# lone surrogate (half an emoji, as a JavaScript export writes it) cannot be encoded at all.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                       else f"\\u{ord(m.group()):04x}", text)


def clip(text: Any, width: int = 60) -> str:
    """One line of at most ``width`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "  ",
          right: Sequence[int] = ()) -> list[str]:
    """Aligned columns; indices in ``right`` are right-aligned (numbers)."""
    cells = [[("" if v is None else
               printable(str(v)).replace("\n", "\\n").replace("\t", "\\t")) for v in row]
             for row in rows]  # a newline in a cell would forge a row
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if i in right else v.ljust(w)
                 for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return (indent + "  ".join(parts)).rstrip()

    return [line(columns), indent + "  ".join("-" * w for w in widths), *map(line, cells)]


@dataclass(frozen=True)
class Grid:
    """A table as a terminal (:meth:`lines`) and a notebook (:meth:`html`) show it; ``notes``
    follow it: ``(None, text)`` muted, ``(label, text)`` named."""

    heading: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    notes: Sequence[tuple[str | None, str]] = ()
    empty: str = "(none)"  # said in place of rows when there are none
    bold: bool = True  # the heading set apart in HTML

    def lines(self) -> list[str]:
        body = table(self.columns, self.rows) if self.rows else [f"  {self.empty}"]
        return [self.heading, *body,
                *(text if label is None else f"  {label}: {text}" for label, text in self.notes)]

    def html(self) -> str:
        esc = html.escape
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(str(v))}</td>"
                                        for v in row) + "</tr>" for row in self.rows) or (
            f"<tr><td colspan='{len(self.columns)}'><i>{esc(self.empty)}</i></td></tr>")
        notes = "".join(f"<div style='color:#666'>{esc(text)}</div>" if label is None
                        else f"<div><code>{esc(label)}</code>: {esc(text)}</div>"
                        for label, text in self.notes)
        heading = f"<b>{esc(self.heading)}</b>" if self.bold else esc(self.heading)
        return f"<div>{heading}{html_table(self.columns, body)}{notes}</div>"


def html_table(columns: Sequence[str], body: str) -> str:
    """Left-aligned headings over ``body``, rows already rendered as ``<tr>``."""
    head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in columns)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
