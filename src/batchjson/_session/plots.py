"""Charts as PNG: the pack-size advice, a batch's spend and accepted results over time. matplotlib
is imported when one is drawn, and never pyplot: drawing never changes a notebook's state."""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .._errors import ConfigError, InvalidBatch
from .._ledger.records import Receipt


class Chart:
    """A drawn chart: its PNG bytes, shown inline by IPython, written by :meth:`save`."""

    def __init__(self, png: bytes, title: str) -> None:
        self.png, self.title = png, title

    def _repr_png_(self) -> bytes:
        return self.png

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the PNG to ``path``."""
        with open(path, "wb") as out:
            out.write(self.png)

    def __repr__(self) -> str:
        return f"<chart: {self.title}; .save(path) writes its PNG>"


def _figure() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("install batchjson[plots] (matplotlib) to see the chart") from None
    return Figure(figsize=(7, 3.6), dpi=100)


def _drawn(fig: Any, title: str) -> Chart:
    out = io.BytesIO()
    fig.savefig(out, format="png", bbox_inches="tight")
    return Chart(out.getvalue(), title)


# the advice's modes as the chart draws them: (mode, line, x nudge, legend)
SERIES = (("whole", "o-", 1.0, "whole return"), ("split", "s--", 1.04, "with split=True"),
          ("items", "^:", 0.96, 'with accept="items"'))


def advice_chart(advice: Mapping[str, Any]) -> Chart:
    """Cost (or tokens) per usable result against pack size, a line a mode, with intervals."""
    priced = advice["priced"]
    key = "cost_per_usable_result" if priced else "tokens_per_usable_result"
    fig = _figure()
    ax = fig.add_subplot()
    for mode, shape, nudge, label in SERIES:  # nudged, so the bars stand apart
        shown = [c for c in advice["candidates"] if c["mode"] == mode and c[key] is not None]
        if not shown:
            continue
        x, y = [c["pack"] * nudge for c in shown], [c[key] for c in shown]
        bounds = [c["interval"] or [c[key], c[key]] for c in shown]
        below = [v - (lo if lo is not None else v) for v, (lo, _) in zip(y, bounds, strict=True)]
        above = [(hi if hi is not None else v) - v for v, (_, hi) in zip(y, bounds, strict=True)]
        ax.errorbar(x, y, yerr=[below, above], fmt=shape, capsize=3, markersize=4, label=label)
    if advice["current_pack"]:
        ax.axvline(advice["current_pack"], color="grey", linestyle=":",
                   label=f"current pack {advice['current_pack']}")
    best = advice["recommended"]
    if best[key] is not None:
        ax.plot([best["pack"]], [best[key]], "*", color="#1a7f37", markersize=16,
                label=f"recommended: pack {best['pack']}, {best['mode']}")
    marked = [advice[k] for k in ("current", "cheapest", "recommended") if advice[k]]
    marked += [c for c in advice["candidates"] if c["pack"] == advice["current_pack"]]  # modes
    tops = [(m["interval"] or [None, m[key]])[1] or m[key] for m in marked]
    if tops and all(t is not None for t in tops) and max(tops) > 0:  # what matters fills it
        ax.set_ylim(0, 1.6 * max(tops))
    ax.set_xscale("log")
    packs = sorted({c["pack"] for c in advice["candidates"]})
    ax.set_xticks(packs, [str(k) for k in packs], minor=False)
    ax.minorticks_off()
    ax.set_xlabel("pack size (tasks per request)")
    ax.set_ylabel("cost per usable result ($)" if priced else "tokens per usable result")
    ax.legend(fontsize="small")
    ax.set_title(textwrap.fill(advice["verdict"], 90), fontsize="small")
    return _drawn(fig, f"pack-size advice for batch {advice['batch']!r}")


def batch_chart(receipts: Sequence[Receipt], name: str, revision: int | None = None) -> Chart:
    """Batch ``name``'s spend and accepted results over its receipts' finishing times."""
    which = f"batch {name!r}" + (f" revision {revision}" if revision is not None else "")
    title = f"{which}: spend and accepted results over time"
    done = sorted(((when, r) for r in receipts if revision in (None, r.revision)
                   and (when := _when(r.finished_at))), key=lambda pair: pair[0])
    if not done:
        raise InvalidBatch(f"{title}: no call has finished yet, so there is nothing to draw")
    start = min(_when(done[0][1].started_at) or done[0][0], done[0][0])
    priced = any(r.cost is not None for _, r in done)
    seconds, spent, accepted = [0.0], [0.0], [0]
    seen: set[str] = set()
    for when, r in done:
        seconds.append((when - start).total_seconds())
        spent.append(spent[-1] + ((r.cost or 0.0) if priced else r.tokens))
        if r.status == "accepted":
            seen.update(r.task_ids)
        accepted.append(len(seen))
    scale, unit = next((s, u) for s, u in ((3600, "h"), (60, "min"), (1, "s"))
                       if seconds[-1] >= 2 * s or s == 1)
    elapsed = [s / scale for s in seconds]
    fig = _figure()
    ax = fig.add_subplot()
    ax.step(elapsed, spent, where="post", color="#0969da")
    ax.set_ylabel("spent ($)" if priced else "tokens", color="#0969da")
    ax.set_xlabel(f"time since {start:%Y-%m-%d %H:%M:%S} UTC ({unit})")
    ax.set_ylim(bottom=0)
    twin = ax.twinx()
    twin.step(elapsed, accepted, where="post", color="#1a7f37")
    twin.set_ylabel("accepted results", color="#1a7f37")
    twin.set_ylim(bottom=0)
    ax.set_title(title, fontsize="small")
    return _drawn(fig, title)


def _when(stamp: str | None) -> datetime | None:
    """A receipt's time in UTC; None for none or a form that is not ISO 8601."""
    try:
        when = datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        return None
    return when if when is None or when.tzinfo else when.replace(tzinfo=UTC)
