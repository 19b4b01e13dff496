"""What a result shows of its answers: the first few accepted values as a table, and for each
field with a fixed set of values (an enum, a const, a boolean) how often each value came back,
read in one pass that stops at :data:`COUNTED` values (saying so)."""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._plaintext import table

SAMPLE = 5  # accepted values a result's display shows
COUNTED = 50_000  # accepted values read, at most, to count the fixed-set fields' values
WIDE = 40  # characters of one cell; longer text is clipped
KINDS = 8  # values of one field listed by count; the rest are summed
WHOLE = ""  # the field name of an answer that is itself one of a fixed set (mode="value")


def fixed_set_fields(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The answer's fields whose schema allows a fixed set of values, in schema order;
    ``(WHOLE,)`` when the answer itself is one. A pydantic enum (``$ref``) and an optional one
    (``anyOf`` with null) count."""
    defs = schema.get("$defs") or schema.get("definitions") or {}

    def fixed(node: Any) -> bool:
        if isinstance(node, Mapping) and isinstance(node.get("$ref"), str):
            node = defs.get(node["$ref"].rsplit("/", 1)[-1])
        if not isinstance(node, Mapping):
            return False
        branches = [b for b in node.get("anyOf") or node.get("oneOf") or ()
                    if not (isinstance(b, Mapping) and b.get("type") == "null")]
        if branches:
            return all(fixed(b) for b in branches)
        types = node.get("type")
        kinds = set(types) - {"null"} if isinstance(types, list) else {types}
        return "enum" in node or "const" in node or kinds == {"boolean"}

    if fixed(schema):
        return (WHOLE,)
    props = schema.get("properties")
    return tuple(k for k, v in props.items() if fixed(v)) if isinstance(props, Mapping) else ()


def cell(value: Any) -> str:
    """One value as a table cell: text as it is, anything else as compact JSON, clipped."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           separators=(",", ":"))
    text = " ".join(text.split())
    return text if len(text) <= WIDE else text[: WIDE - 3] + "..."


@dataclass
class Answers:
    """The first :data:`SAMPLE` accepted values, and each fixed-set field's values counted over
    the first ``counted`` of ``total``."""

    sample: list[tuple[str, Any]]
    counts: dict[str, Counter[str]]
    counted: int
    total: int
    order: tuple[str, ...] = ()  # the schema's fields, the sample's first columns

    @classmethod
    def read(cls, items: Iterable[tuple[str, Any]], schema: Mapping[str, Any],
             total: int) -> Answers:
        fields = fixed_set_fields(schema)
        sample: list[tuple[str, Any]] = []
        counts: dict[str, Counter[str]] = {f: Counter() for f in fields}
        counted = 0
        for task_id, value in items:
            if len(sample) < SAMPLE:
                sample.append((task_id, value))
            if counted == COUNTED or (not fields and len(sample) == SAMPLE):
                break
            counted += 1
            for f in fields:
                item = value if isinstance(value, dict) else {}
                counts[f][cell(value if f == WHOLE else item.get(f, "(absent)"))] += 1
        props = schema.get("properties")
        return cls(sample, counts, counted, total,
                   tuple(props) if isinstance(props, Mapping) else ())

    def _table(self) -> tuple[list[str], list[list[str]]]:
        """(columns, rows) of the sample: task_id, then each field of an object value (the
        schema's first, in its order; nested values as compact JSON), or the value itself. An
        answer's own ``task_id`` is its row's (identity checked), so it is one column."""
        objects = all(isinstance(v, dict) for _, v in self.sample)
        seen = {k for _, v in self.sample for k in v} - {"task_id"} if objects else set()
        fields = [k for k in self.order if k in seen] + sorted(seen - set(self.order))
        rows = [[task_id, *([cell(v[f]) if f in v else "" for f in fields] if objects
                            else [cell(v)])] for task_id, v in self.sample]
        return ["task_id", *(fields if objects else ["value"])], rows

    def _heading(self) -> str:
        return f"accepted values (the first {len(self.sample)} of {self.total})"

    def _tallies(self) -> list[tuple[str, str]]:
        out = []
        for f, counter in self.counts.items():
            common = counter.most_common()
            listed = ", ".join(f"{v} {n}" for v, n in common[:KINDS])
            rest = sum(n for _, n in common[KINDS:])
            out.append((f or "value", listed + (f", {len(common) - KINDS} other value(s) "
                                                f"{rest}" if rest else "")))
        return out

    def _counted(self) -> str:
        scope = (f"all {self.total}" if self.counted >= self.total
                 else f"the first {self.counted} of {self.total}")
        return f"counts over {scope} accepted values"

    def lines(self) -> list[str]:
        """The plain-text rendering (columns aligned, nothing that acts on a terminal)."""
        if not self.sample:
            return []
        columns, rows = self._table()
        out = [self._heading() + ":", *table(columns, rows)]
        if self.counts:
            out.append(self._counted() + ":")
            out += [f"  {f}: {text}" for f, text in self._tallies()]
        return out

    def html(self) -> str:
        if not self.sample:
            return ""
        esc = html.escape
        columns, rows = self._table()
        head = "".join(f"<th style='text-align:left'>{esc(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(c)}</td>"
                                        for c in row) + "</tr>" for row in rows)
        counts = "".join(f"<div><code>{esc(f)}</code>: {esc(text)}</div>"
                         for f, text in self._tallies())
        if counts:
            counts = f"<div style='color:#666'>{esc(self._counted())}:</div>{counts}"
        return (f"<div>{esc(self._heading())}:<table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{counts}</div>")
