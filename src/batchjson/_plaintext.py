"""What a terminal may be shown of text: every character that would act on it escaped, and
columns aligned. Below the session, so a result prints its answers as the faces print theirs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

# Control characters (ANSI escapes, carriage returns, bells) and bidirectional overrides in a
# model's return or an imported batch name would act on the terminal instead of being read; a
# lone surrogate (half an emoji, as a JavaScript export writes it) cannot be encoded at all.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256
                       else f"\\u{ord(m.group()):04x}", text)


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
