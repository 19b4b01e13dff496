"""Small display objects for the magics: plain text in a terminal, a table in Jupyter."""

from __future__ import annotations

import html
import textwrap
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from .._textview import (
    answered_by,
    describe_error,
    forgotten_line,
    frame_lines,
    job_progress,
    pending_said,
    printable,
    receipt_cost,
)
from ..core import Grid, clip, html_table, money


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
    """A titled table, or its ``empty`` line when it has no rows."""

    def __init__(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                 empty: str = "(none)") -> None:
        self.rows = [["" if v is None else str(v) for v in row] for row in rows]
        self.grid = Grid(title, list(columns), self.rows, empty=empty)

    def __len__(self) -> int:
        return len(self.rows)

    def as_text(self) -> str:
        return "\n".join(self.grid.lines())

    def _repr_html_(self) -> str:
        return self.grid.html()


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
        jobs = s.get("jobs", ())
        if jobs or s.get("pending_calls"):
            rows[1:1] = [("pending", pending_said(s["pending_calls"], s["pending_cost"],
                                                  len(jobs)) + "; re-run their cells to "
                          "collect what has ended, `batchjson jobs` lists them"),
                         *(("  batch job", job_progress(j)) for j in jobs)]
        if s["abandoned_calls"] or s["in_flight_calls"] or s["cancelled_calls"]:
            rows.insert(4, ("calls not completed", f"{s['abandoned_calls']} abandoned, "
                            f"{s['in_flight_calls']} in flight, {s['cancelled_calls']} "
                            "cancelled"))
        if s["unknown_cost_calls"]:
            unpriced, bound = s["unpriced_unknown_calls"], s["cost_lower_bound_unknown"]
            text = f"{s['unknown_cost_calls']} call(s) with no recorded cost"
            if unpriced:
                text += f", {unpriced} of them for a model with no price"
            if bound:
                text += (f": an estimated {money(bound)} more (prompts at the input rate, a "
                         "token per 4 characters)")
            rows.append(("cost unknown", text))
            if per is not None and bound:  # the cost per usable result counts that estimate
                rows.append(("  counting that", f"about {money(per)} per usable result"))
        rows.extend(("  batch job", said) for said in s.get("collected", ()))
        for sup in s["superseded"][: self.limit]:
            rows.append(("  superseded", f"{sup['batch']} rev {sup['revision']} -> rev "
                                         f"{sup['superseded_by']} ({sup['reason']})"))
        for f in s.get("forgotten", [])[-self.limit:]:
            rows.append(("  forgotten", forgotten_line(f)))
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
        s = self.summary  # amber while every request owed is held by a pending job
        held = sum(j["requests"] for j in s.get("jobs", ()))
        colour = ("#1a7f37" if not s["unresolved_requests"] else "#9a6700"
                  if s["unresolved_requests"] <= held else "#cf222e")
        body = "".join(f"<tr><td style='text-align:left;color:#666'>{esc(k)}</td>"
                       f"<td style='text-align:left'>{esc(v)}</td></tr>" for k, v in self._lines())
        return (f"<div><span style='color:{colour}'>&#9679;</span> <b>{esc(self.title)}</b>"
                f"<table>{body}</table></div>")


class ReceiptsView(TextView):
    """``%batch_receipts``: one page of receipts, numbered 1..N per batch, errors wrapped whole
    rather than cut mid-word; the footer says how to see the next page."""

    def __init__(self, title: str, rows: Sequence[Mapping[str, Any]], *, page: int,
                 per_page: int, total: int, next_hint: str | None, width: int = 100) -> None:
        """``rows`` are ``_textview.receipt_rows``, the rows ``batchjson receipts`` prints."""
        self.title, self.rows, self.page, self.per_page = title, list(rows), page, per_page
        self.total, self.next_hint, self.width = total, next_hint, width

    def __len__(self) -> int:
        return len(self.rows)

    def _footer(self) -> str:
        first = (self.page - 1) * self.per_page + 1
        pages = max(1, -(-self.total // self.per_page))
        shown = f"receipts {first}-{first + len(self.rows) - 1} of {self.total}" if self.rows \
            else f"no receipts on page {self.page} ({self.total} in all)"
        more = f"; next page: {self.next_hint}" if self.next_hint else ""
        return f"page {self.page} of {pages}: {shown}{more}"

    def as_text(self) -> str:
        lines = [self.title]
        if not self.total:
            return "\n".join([self.title, "  (none recorded)"])
        for r in map(_cells, self.rows):
            lines.append(f"  #{r['number']:<4} rev {r['revision']:<3} {r['kind']:<8} "
                         f"{r['status']:<15} {r['model']}  {r['tasks']}  {r['tokens']} tokens  "
                         f"{r['cost']}")
            for e, frames in zip(r["errors"], r["frames"], strict=True):
                lines += textwrap.wrap(e, self.width, initial_indent="        - ",
                                       subsequent_indent="          ", break_long_words=False,
                                       break_on_hyphens=False)
                lines += [f"            {line}" for line in frames]
            if r["more_errors"]:
                lines.append(f"        ... and {r['more_errors']} more error(s)")
            if r["raw"] is not None:
                # the model's text may carry terminal escapes: shown, never obeyed
                lines += ["        raw: " + printable(line) for line in r["raw"].split("\n")]
        lines.append("  " + self._footer())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        body = []
        for r in map(_cells, self.rows):
            errors = "".join(f"<li>{esc(e)}" + (f"<pre style='margin:0'>{esc(chr(10).join(f))}"
                                                 "</pre>" if f else "") + "</li>"
                             for e, f in zip(r["errors"], r["frames"], strict=True))
            if r["more_errors"]:
                errors += f"<li>... and {r['more_errors']} more error(s)</li>"
            raw = (f"<details><summary>raw return</summary><pre style='white-space:pre-wrap'>"
                   f"{esc(r['raw'])}</pre></details>" if r["raw"] else "")
            cells = "".join(f"<td style='text-align:left;vertical-align:top'>{esc(str(r[k]))}"
                            "</td>" for k in ("number", "revision", "kind", "status", "model",
                                              "tasks", "tokens", "cost"))
            body.append(f"<tr>{cells}<td style='text-align:left;white-space:normal;"
                        f"max-width:40em'><ul style='margin:0;padding-left:1.2em'>{errors}</ul>"
                        f"{raw}</td></tr>")
        columns = ("#", "rev", "kind", "status", "model", "tasks", "tokens", "cost", "errors")
        table = (html_table(columns, "".join(body)) if self.rows
                 else "<div><i>(none recorded)</i></div>")
        return (f"<div><b>{esc(self.title)}</b>{table}<div style='color:#666'>"
                f"{esc(self._footer())}</div></div>")


def _cells(row: Mapping[str, Any], errors_shown: int = 3) -> dict[str, Any]:
    """A receipt row as the notebook shows it: who answered, its tasks (one by its id, several
    counted with the first and last, so rows stay apart), identity errors naming field and
    values, messages whole (wrapping is the renderer's job)."""
    errors, tasks = row["errors"], row["task_ids"]
    return {**row, "model": answered_by(row["provider"], row["model"]),
            "tasks": clip(tasks[0]) if len(tasks) == 1 else
            clip(f"{len(tasks)}: {tasks[0]} .. {tasks[-1]}", 120),
            "tokens": (row["input_tokens"] or 0) + (row["output_tokens"] or 0),
            "cost": receipt_cost(row["cost"], row["status"], row["sent_at"]),
            "errors": [" ".join(describe_error(e).split()) for e in errors[:errors_shown]],
            "frames": [frame_lines(e, "") for e in errors[:errors_shown]],
            "more_errors": max(0, len(errors) - errors_shown)}


class TextLines(TextView):
    """Lines of ``_textview`` text over the data they render (``view[key]`` reads it), such as
    ``%batch_advise``'s advice."""

    def __init__(self, data: Mapping[str, Any], lines: Sequence[str]) -> None:
        self.data, self.lines = dict(data), list(lines)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def as_text(self) -> str:
        return "\n".join(self.lines)
