"""Small display objects for the magics: plain text in a terminal, a table in Jupyter."""

from __future__ import annotations

import html
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ..result import money


def describe_tasks(task_ids: Sequence[str], width: int = 60) -> str:
    """One task by its id; several as a count with the first and last, so rows stay apart."""
    if len(task_ids) == 1:
        return clip(task_ids[0], width)
    return clip(f"{len(task_ids)}: {task_ids[0]} .. {task_ids[-1]}", width * 2)


def short_error(error: Mapping[str, Any], width: int = 90) -> str:
    """The part of an error a reader needs first: for identity, the field and both values."""
    if error.get("type") == "identity" and "field" in error and "got" in error:
        text = (f"identity: {error['field']} {error['got']!r}, requested "
                f"{error.get('expected')!r}")
    else:
        text = f"{error.get('type')}: {error.get('message')}"
    return clip(text, width)


def clip(text: Any, width: int = 60) -> str:
    """One line of at most ``width`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


class TextView(ABC):
    """Text in a terminal (repr and IPython's pretty printer); subclasses add the HTML."""

    @abstractmethod
    def as_text(self) -> str:
        """The plain-text rendering."""

    def __repr__(self) -> str:
        return self.as_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.as_text())


class Table(TextView):
    """A titled table; ``details`` are (label, text) blocks shown verbatim under it."""

    def __init__(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                 empty: str = "(none)", notes: Sequence[str] = (),
                 details: Sequence[tuple[str, str]] = ()) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows = [["" if v is None else str(v) for v in row] for row in rows]
        self.empty = empty
        self.notes = list(notes)
        self.details = list(details)

    def __len__(self) -> int:
        return len(self.rows)

    def as_text(self) -> str:
        lines = [self.title]
        if not self.rows:
            lines.append(f"  {self.empty}")
        else:
            widths = [max(len(c), *(len(r[i]) for r in self.rows))
                      for i, c in enumerate(self.columns)]
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(self.columns, widths,
                                                                       strict=True)).rstrip())
            lines.append("  " + "  ".join("-" * w for w in widths))
            for row in self.rows:
                lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths,
                                                                         strict=True)).rstrip())
        lines += [f"  {note}" for note in self.notes]
        for label, text in self.details:
            lines += ["", f"{label}:", text]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th style='text-align:left'>{esc(c)}</th>" for c in self.columns)
        if self.rows:
            body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(v)}</td>"
                                            for v in row) + "</tr>" for row in self.rows)
        else:
            body = f"<tr><td colspan='{len(self.columns)}'><i>{esc(self.empty)}</i></td></tr>"
        notes = "".join(f"<div style='color:#666'>{esc(n)}</div>" for n in self.notes)
        details = "".join(f"<details><summary>{esc(label)}</summary><pre>{esc(text)}</pre>"
                          "</details>" for label, text in self.details)
        return (f"<div><b>{esc(self.title)}</b><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{notes}{details}</div>")


class StatusView(TextView):
    """``%batch_status``: what is still owed and what has been spent, from the ledger."""

    def __init__(self, summary: Mapping[str, Any], *, ledger: str, provider: str,
                 owed: Sequence[Any] = (), limit: int = 8) -> None:
        self.summary = dict(summary)
        self.ledger = ledger
        self.provider = provider
        self.owed = list(owed)
        self.limit = limit

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def _lines(self) -> list[tuple[str, str]]:
        s = self.summary
        per = s["cost_per_usable_result"]
        rows = [
            ("unresolved", f"{s['unresolved_batches']} batch revision(s), "
                           f"{s['unresolved_requests']} request(s), {s['unresolved_items']} "
                           "item(s)"),
            ("minimum exact retry calls", str(s["minimum_exact_retry_calls"])),
            ("superseded", f"{len(s['superseded'])} revision(s)"),
            ("calls", f"{s['calls']} ({s['accepted_returns']} accepted, "
                      f"{s['rejected_returns']} rejected, {s['provider_errors']} provider "
                      "error(s))"),
            ("tokens", str(s["tokens"])),
            ("cost so far", money(s["cost"])),
            ("usable results", str(s["usable_results"])),
            ("cost per usable result", "n/a" if per is None else money(per)),
        ]
        for sup in s["superseded"][: self.limit]:
            rows.append(("  superseded", f"{sup['batch']} rev {sup['revision']} -> rev "
                                         f"{sup['superseded_by']} ({sup['reason']})"))
        for u in self.owed[: self.limit]:
            rows.append(("  owed", f"{u.batch} rev {u.revision} request {u.key[:12]}: "
                                   f"{clip(', '.join(u.task_ids), 60)}"))
        if len(self.owed) > self.limit:
            rows.append(("  owed", f"... and {len(self.owed) - self.limit} more request(s)"))
        return rows

    @property
    def title(self) -> str:
        scope = f"batch {self.summary['batch']!r}" if self.summary.get("batch") else "all batches"
        return f"batchjson status ({scope}; ledger {self.ledger}; provider {self.provider})"

    def as_text(self) -> str:
        rows = self._lines()
        width = max(len(k) for k, _ in rows)
        return "\n".join([self.title] + [f"  {k.ljust(width)}  {v}" for k, v in rows])

    def _repr_html_(self) -> str:
        esc = html.escape
        colour = "#cf222e" if self.summary["unresolved_requests"] else "#1a7f37"
        body = "".join(f"<tr><td style='text-align:left;color:#666'>{esc(k)}</td>"
                       f"<td style='text-align:left'>{esc(v)}</td></tr>" for k, v in self._lines())
        return (f"<div><span style='color:{colour}'>&#9679;</span> <b>{esc(self.title)}</b>"
                f"<table>{body}</table></div>")
