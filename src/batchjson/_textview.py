"""Plain-text renderings both faces print: aligned tables, money as money, no reprs."""

from __future__ import annotations

import itertools
import math
import shlex
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .core import money, printable, table, tracebacks, usd


def wrapped(text: str, indent: str, width: int = 100) -> list[str]:
    return textwrap.wrap(printable(" ".join(str(text).split())), width, initial_indent=indent,
                         subsequent_indent=" " * len(indent) + "  ", break_long_words=False,
                         break_on_hyphens=False) or [indent]


DEFAULT_LEDGER = ".batchjson/ledger.sqlite"  # the CLI's and the notebooks' default


# (figure, its column's heading, what "no" it is when zero; None: not said)
OPTIONAL_COLUMNS = (("partial_returns", "partial", None),
                    ("provider_errors", "provider err", "provider errors"),
                    ("abandoned", "abandoned", "abandoned calls"),
                    ("in_flight", "in flight", "calls in flight"), ("pending", "pending", None))


def status_lines(summary: Mapping[str, Any], ledger: str, me: str = "batchjson") -> list[str]:
    """``batchjson status``: one row per batch and a total; unknown costs shown apart."""
    total = summary["total"]
    # Columns that are zero for every batch say nothing: they are left out (and said below), so
    # the table fits a terminal; --json always carries every figure.
    optional = [(k, h) for k, h, _ in OPTIONAL_COLUMNS if total[k]]
    cached = bool(total["cached_tokens"])
    columns = ["batch", "tasks", "usable", "calls", "accepted", "rejected",
               *(h for _, h in optional), "tokens in/out" + ("/cached" if cached else ""),
               "cost", "cost/usable"]
    rows = []
    for e in [*summary["batches"], {**total, "batch": "total"}]:
        tokens = f"{e['input_tokens']}/{e['output_tokens']}" + (
            f"/{e['cached_tokens']}" if cached else "")
        rows.append([e["batch"], e["tasks"], e["usable_results"], e["calls"],
                     e["accepted_returns"], e["rejected_returns"],
                     *(e[k] for k, _ in optional), tokens, *_cost_cells(e)])
    lines = [f"ledger {ledger}", *table(columns, rows, right=range(1, 6 + len(optional)))]
    none = [said for k, _, said in OPTIONAL_COLUMNS if said and not total[k]]
    if none:
        lines.append("  no " + ", no ".join(none))
    unknown, unpriced = total["unknown_cost_calls"], total["unpriced_calls"]
    if unknown and unpriced == unknown:
        lines += wrapped(f"{unknown} call(s) have no recorded cost and their models have no "
                         "price in batchjson's table, so their cost is unknown (not zero)", "  ")
    elif unknown:
        also = (f"; {unpriced} more are for models with no price and add nothing to it"
                if unpriced else "")
        lines += wrapped(f"{unknown} call(s) have no recorded cost (killed, abandoned, or "
                         f"imported without cost): an estimated "
                         f"{money(total['unknown_cost_lower_bound'])} more, pricing their "
                         f"prompts (a token per 4 characters) at the input rate{also}; '+' and "
                         "'≥' mark figures that include that estimate", "  ")
    jobs = summary.get("jobs", ())  # unfinished provider batch jobs: neither failed nor unknown
    if total["pending"] or jobs:
        lines += wrapped("pending: " + pending_said(total["pending"], total["pending_cost"],
                                                    len(jobs)), "  ")
        for job in jobs:
            lines += wrapped(job_progress(job), "    ")
    owed = summary.get("unresolved_requests", 0)
    if owed:
        lines.append(f"  still owed: {owed} request(s), {summary['unresolved_items']} item(s); "
                     f"at least {summary['minimum_exact_retry_calls']} call(s) to finish")
    if summary.get("refused_requests"):
        lines += wrapped(f"refused: {summary['refused_requests']} owed request(s) the model "
                         "refused to answer; a refusal is not asked again unless the run says "
                         "so (reask_refusals=True, or --reask-refusals)", "  ")
    if summary.get("cut_off_requests"):
        lines += wrapped(f"cut off: {summary['cut_off_requests']} owed request(s) whose answer "
                         "was cut off at the provider's output limit and is not asked again "
                         "under it: raise max_tokens, pack fewer tasks, or pass split=True", "  ")
    for sup in summary.get("superseded", []):
        lines.append(f"  superseded: {sup['batch']} revision {sup['revision']} -> "
                     f"{sup['superseded_by']} ({sup['reason']})")
    for f in summary.get("forgotten", []):
        lines += wrapped(forgotten_line(f), "  forgotten: ")
    return lines + _status_next(summary, ledger, me)


def pending_said(calls: int, cost: float, jobs: int) -> str:
    """Calls held by unfinished provider batch jobs, their cost estimated at the batch price."""
    priced = (f"an estimated {money(cost)} at the batch price when they end (their prompts; "
              "the answers add their output)" if cost else "their cost is known when they end")
    return f"{calls} call(s) in {jobs} unfinished batch job(s), {priced}"


def job_progress(job: Mapping[str, Any]) -> str:
    """One pending job: what it is, submitted when, its provider's progress, its expected end."""
    said = (f"job {job['id']} of {job['batch']!r} ({job['provider_job_id'] or 'no provider id'}, "
            f"{job['status']}, {job['requests']} request(s))")
    if "ends_by" not in job:  # listed without asking its provider
        return said
    done, by = job["progress"], job["ends_by"][:16].replace("T", " ") + "Z"
    when = {"rate": f"should end about {by} at its rate so far (the provider's window: "
                    f"{job['window_hours']} h)",
            "window": f"ends by {by}, when the provider's {job['window_hours']} h window closes",
            "ended": "has ended at the provider: re-run its batch to collect it"}
    return (f"{said}: submitted {job['submitted_at'][:16].replace('T', ' ')}Z; "
            + (f"{done['ended']}/{done['total']} ended at the provider" if done else
               "progress unknown (its provider could not be asked)")
            + f"; {when[job['ends_from']]}")


def forgotten_line(f: Mapping[str, Any]) -> str:
    """One line for status: what was forgotten, by whom, when, and whether it still stands."""
    revs = ", ".join(map(str, f["revisions"]))
    state = "" if f["in_effect"] else "; owed again since later work on it reopened it"
    return (f"{f['batch']} revision(s) {revs}: {f['requests']} request(s), {f['items']} item(s) "
            f"no longer owed, forgotten by {f['by']} via {f['via']} at {f['at'][:19]}Z{state}")


def forget_message(name: str, record: Mapping[str, Any] | None,
                   spend: Mapping[str, Any]) -> str:
    """What a face says after forgetting (the CLI and the magic say the same)."""
    if record is None:
        return f"batch {name!r} owes nothing, so nothing was forgotten"
    revs = ", ".join(map(str, record["revisions"]))
    return (f"forgot batch {name!r}: revision(s) {revs} no longer owe {record['requests']} "
            f"request(s) ({record['items']} item(s)); recorded as forgotten by {record['by']} "
            f"at {record['at'][:19]}Z. Its {spend['calls']} call(s) and their cost "
            f"({money(spend['cost'])}) stay in the account, and later work on {name!r} (a run, "
            "a merge) owes again." + (
                f" {spend['in_flight_calls']} of its call(s) are in flight (a run going on, or "
                "one that died): forgetting does not stop a run, and what it does from now on "
                "owes again; stop it first to leave the batch forgotten."
                if spend.get("in_flight_calls") else ""))


def _status_next(summary: Mapping[str, Any], ledger: str, me: str) -> list[str]:
    """What to run next for the batch most needing a look (a re-run only if it owes)."""
    batches, owing = summary["batches"], set(summary.get("owing_batches", ()))
    if not batches:
        return ["", "the ledger holds no batches yet: run one (batchjson demo shows how)"]
    flag = "" if ledger == DEFAULT_LEDGER else f" --ledger {shlex.quote(ledger)}"
    worst = max(batches, key=lambda e: (e["batch"] in owing, e["unresolved_tasks"],
                                        e["rejected_returns"]))
    name = shlex.quote(worst["batch"]).replace("\n", "\\n")  # as typed in a shell
    hints = [(f"{me} receipts {name} --failed{flag}", "why returns were rejected")]
    if worst["batch"] in owing:
        hints.insert(0, (f"re-run batch {worst['batch']!r}",
                         "accepted requests are never paid again"))
    if summary["total"]["pending"] or summary.get("jobs"):
        hints.insert(0, (f"{me} jobs{flag}", "the batch jobs still pending"))
    else:
        hints.append((f"{me} values {name} --csv{flag}", "the accepted answers"))
    if worst["accepted_returns"] + worst["rejected_returns"]:  # advice needs judged returns
        hints.append((f"{me} advise {name}{flag}", "the cheapest pack size"))
    width = max(len(c) for c, _ in hints) + 2
    return ["", "next:", *(f"  {c.ljust(width)}{why}" for c, why in hints)]


def _cost_cells(e: Mapping[str, Any]) -> tuple[str, str]:
    """(cost, cost per usable result) as printed: exact, a lower bound, or unknown."""
    per = e["cost_per_usable_result"]
    if e["cost_is_lower_bound"] and not e["cost_at_least"]:
        return "unknown", "unknown" if e["usable_results"] else "n/a"
    mark = "+" if e["cost_is_lower_bound"] else ""
    return (money(e["cost_at_least"]) + mark,
            "n/a" if per is None else ("≥" if mark else "") + money(per))


def receipt_cost(cost: float | None, status: str, sent_at: str | None) -> str:
    """A receipt's cost as shown: a call cancelled before it was sent cost nothing."""
    if cost is None and status == "cancelled" and sent_at is None:
        return "$0.00 (not sent)"
    return money(cost)


def answered_by(provider: str | None, model: str | None) -> str:
    """Who answered: ``provider/model`` (an imported or re-judged receipt says so by its kind)."""
    provider = provider or "?"
    return f"{provider}/{model}" if model and model != provider else provider


def receipt_rows(attempts: Sequence[Any], *, failed: bool = False,
                 raw: bool = False) -> list[dict[str, Any]]:
    """A batch's attempts numbered 1..N in call order, as ``receipts --json`` prints them."""
    return [{"number": number, **{k: getattr(r, k) for k in RECEIPT_FIELDS},
             "task_ids": list(r.task_ids), "raw": r.raw if raw else None}
            for number, r in enumerate(attempts, 1) if not failed or r.status != "accepted"]


RECEIPT_FIELDS = ("revision", "kind", "status", "errors", "input_tokens", "output_tokens",
                  "cached_tokens", "cost", "provider", "model", "source", "started_at", "sent_at",
                  "finished_at")


def receipt_lines(name: str, receipts: Sequence[Mapping[str, Any]],
                  failed: bool = False) -> list[str]:
    if not receipts:
        return [f"no failed receipts for batch {name!r}: every attempt was accepted" if failed
                else f"no receipts for batch {name!r}"]
    rows = [[r["number"], r["revision"], r["kind"], r["status"],
             answered_by(r.get("provider"), r.get("model")), len(r["task_ids"]),
             *("-" if r[k] is None else r[k] for k in ("input_tokens", "output_tokens")),
             receipt_cost(r["cost"], r["status"], r.get("sent_at"))]
            for r in receipts]
    head = table(["#", "rev", "kind", "status", "model", "tasks", "in", "out", "cost"], rows,
                 right=(0, 1, 5, 6, 7))
    lines = head[:2]
    for line, r in zip(head[2:], receipts, strict=True):
        lines.append(line)
        for e in r["errors"][:5]:
            lines += wrapped(describe_error(e), "      - ") + frame_lines(e, " " * 10)
        if len(r["errors"]) > 5:
            lines.append(f"      ... and {len(r['errors']) - 5} more error(s)")
        if r["raw"] is not None:
            lines += ["      raw return:",
                      *("        " + printable(x) for x in r["raw"].split("\n"))]
    return lines


def frame_lines(e: Mapping[str, Any], indent: str) -> list[str]:
    """The validator's own frames a ``validator_error`` keeps, shown (never obeyed)."""
    return [indent + printable(line) for line in tracebacks(e)]


def describe_error(e: Mapping[str, Any]) -> str:
    if e.get("type") == "identity" and "field" in e and "got" in e:
        return (f"identity: {e['field']} is {e['got']!r}, the request has {e.get('expected')!r} "
                f"(task {e.get('task_id')!r})")
    return f"{e.get('type')}: {e.get('message')}"


def import_lines(report: Mapping[str, Any]) -> list[str]:
    lines = [f"imported {report['source']}: {report['lines']} receipt(s): "
             f"{report['admitted']} admitted ({report['items_admitted']} item(s)), "
             + (f"{report['duplicate']} already accepted here (values kept), "
                if report.get("duplicate") else "")
             + f"{report['diagnostic']} kept as diagnostic, {report['rejected']} rejected, "
             f"{report['unverified']} unverified, {report['recorded']} recorded, "
             f"{report['skipped']} skipped"]
    # Lines that went as expected are grouped by outcome and reason; the others (kept as
    # diagnostic, rejected, unverified, duplicate) are shown one by one, up to DETAILED.
    grouped: dict[tuple[str, str], list[int]] = {}
    detailed = []
    for r in report["receipts"]:
        if r["outcome"] in ("admitted", "skipped", "recorded"):
            reason = ("already imported" if r["reason"].startswith("already imported")
                      else r["reason"])
            grouped.setdefault((r["outcome"], reason), []).append(r["line"])
        else:
            detailed.append(r)
    unit = report.get("numbered", "line")  # an export's JSON document numbers its receipts
    for (outcome, reason), numbers in grouped.items():
        ranges = line_ranges(numbers).replace("line", unit)
        lines += wrapped(f"{outcome.upper()}: {len(numbers)} {unit}(s) ({ranges})"
                         + (f": {reason}" if reason else ""), "  ")
    for r in detailed[:DETAILED]:
        lines.append(f"  {unit} {r['line']}: batch {r['batch']!r}, {r['items']} item(s), claimed "
                     f"{r['claimed_status']!r}: {r['outcome'].upper()}")
        if r["reason"]:
            lines += wrapped(r["reason"], "      ")
        for e in r["errors"][:10]:
            lines += wrapped(describe_error({"type": "identity", **e}) if "field" in e
                             else describe_error(e), "      - ")
        if len(r["errors"]) > 10:
            lines.append(f"      ... and {len(r['errors']) - 10} more")
    if len(detailed) > DETAILED:
        lines.append(f"  ... and {len(detailed) - DETAILED} more {unit}(s) not admitted "
                     "(--json lists every line)")
    return lines + revision_lines(report.get("revisions", []))


def revision_lines(revisions: Sequence[Mapping[str, Any]]) -> list[str]:
    """Which revision of each batch is current, when an import's receipts went elsewhere."""
    by_batch: dict[str, list[Mapping[str, Any]]] = {}
    for r in revisions:
        by_batch.setdefault(r["batch"], []).append(r)
    lines = []
    for batch, kept in by_batch.items():
        if len(kept) == 1 and kept[0]["current"]:
            continue
        lines.append(f"  batch {batch!r}: revision {kept[0]['current_revision']} is current "
                     "(values and status show it)")
        for r in kept:
            said = (f"revision {r['revision']}: {line_ranges(r['lines'])}, "
                    f"{r['admitted_items']} item(s) admitted, "
                    + ("current" if r["current"] else r["reason"] or "not current"))
            lines += wrapped(said, "      ")
    return lines


DETAILED = 20


def line_ranges(numbers: Sequence[int]) -> str:
    """1, 2, 3, 5, 7, 8 -> "lines 1-3, 5, 7-8"."""
    runs = [[n for _, n in run] for _, run in  # consecutive numbers keep n - i
            itertools.groupby(enumerate(sorted(numbers)), lambda pair: pair[1] - pair[0])]
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return ("line " if len(numbers) == 1 else "lines ") + text


def advice_lines(advice: Mapping[str, Any]) -> list[str]:
    """The advice as text: the fit, the candidates near the marked packs, the verdict."""
    f, priced = advice["fit"], advice["priced"]
    unit = "cost" if priced else "tokens"
    lines = [f"pack-size advice for batch {advice['batch']!r} ({advice['tasks']} tasks, "
             f"repairs {advice['repairs']}, replays {advice['replays']}; current pack "
             f"{advice['current_pack']})",
             f"  fitted from {f['returns']} judged return(s): per item, identity fault rate "
             f"{f['identity_fault_rate']:.4f} (rejects the return in every mode),",
             f"  schema or validator fault rate {f['item_fault_rate']:.4f}; whole-return fault "
             f"rate {f['call_fault_rate']:.4f}; {f['shared_input']:.0f} shared + "
             f"{f['input_per_task']:.1f} per-task input tokens",
             f"  {unit} per usable result, with the middle {advice['level']:.0%} of "
             f"{advice['resamples']} bootstrap resamples of the returns:"]
    shown = _advice_rows(advice)
    rows = [[c["pack"], c["mode"], f"{c['calls']:.1f}",
             f"{c['usable_results']:.1f}", _per_usable(c, priced),
             _span(c["interval"], priced),
             ", ".join(k for k in ("current", "cheapest", "recommended") if advice[k] == c)]
            for c in shown]
    lines += table(["pack", "mode", "calls", "usable", f"{unit}/usable", "interval", ""],
                   rows, right=(0, 2, 3, 4))
    hidden = len(advice["candidates"]) - len(shown)
    if hidden:
        lines.append(f"  ({hidden} other candidate(s): the chart and the advice's candidates "
                     "have every one)")
    lines += _modes_compared(advice, priced)
    lines += wrapped(advice["verdict"], "")
    if advice.get("warning"):
        lines += wrapped(advice["warning"], "warning: ")
    return lines


def _modes_compared(advice: Mapping[str, Any], priced: bool) -> list[str]:
    """One line a marked pack (current, recommended) comparing its modes."""
    packs = dict.fromkeys(c["pack"] for c in (advice["current"], advice["recommended"]) if c)
    lines = []
    for pack in packs:
        modes = [c for c in advice["candidates"] if c["pack"] == pack]
        if len(modes) > 1:
            lines.append(f"  at pack {pack}, {'cost' if priced else 'tokens'} per usable result: "
                         + ", ".join(f"{c['mode']} {_per_usable(c, priced)}" for c in modes))
    return lines


def _advice_rows(advice: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Per pack its cheapest mode, for sizes next to the marked packs (and those)."""
    best: dict[int, Mapping[str, Any]] = {}
    for c in advice["candidates"]:  # the first of equally cheap modes
        best[c["pack"]] = min(best.get(c["pack"], c), c, key=_cost_of)
    sizes = sorted(best)
    marked = [advice[k] for k in ("current", "cheapest", "recommended") if advice[k]]
    near: set[int] = set()
    for m in marked:
        i = sizes.index(m["pack"])
        near.update(sizes[max(0, i - 1):i + 2])
    rows = [best[k] for k in near]
    rows += [m for m in marked if m not in rows]
    return sorted(rows, key=lambda c: (c["pack"], c["mode"]))


def _cost_of(option: Mapping[str, Any]) -> float:
    per = option["cost_per_usable_result"]
    if per is None:
        per = option["tokens_per_usable_result"]
    return math.inf if per is None else per


def _per_usable(option: Mapping[str, Any], priced: bool) -> str:
    per = option["cost_per_usable_result" if priced else "tokens_per_usable_result"]
    return "n/a" if per is None else money(per) if priced else f"{per:.1f}"


def _span(interval: Sequence[float | None] | None, priced: bool) -> str:
    """An interval as text: "$0.000150 - $0.000160", tokens as numbers, "-" with none."""
    if not interval:
        return "-"
    return " - ".join("unbounded" if v is None else money(v) if priced else f"{v:.1f}"
                      for v in interval)


def budget_line(budget: Mapping[str, Any] | None) -> str:
    """What ``batchjson budget`` says of the ledger's own cost budget."""
    if budget is None:
        return ("this ledger has no cost budget of its own; set one that every runner on it "
                "holds together with: batchjson budget --cost USD")
    return (f"ledger cost budget {usd(budget['cost'])}: {usd(budget['spent'])} spent, "
            f"{usd(budget['reserved'])} held by calls in flight, {usd(budget['left'])} left "
            f"(set by {budget['set_by']} at {budget['set_at'][:19]}Z)")


def job_lines(jobs: Sequence[Mapping[str, Any]], *, every: bool = False) -> list[str]:
    """What ``batchjson jobs`` prints: a row per job, and what to do with an uncertain one."""
    if not jobs:
        return ["no batch jobs" if every else "no open batch jobs"]
    rows = [(j["id"], j["provider"], j["provider_job_id"] or "-", j["batch"], j["status"]
             + (f" ({j['provider_status']})" if j.get("provider_status") else ""),
             j["requests"], " ".join(f"{k}={v}" for k, v in (j.get("counts") or {}).items()
                                     if v) or "-", _age(j["created_at"]),
             usd(j["reserved"] or 0.0)) for j in jobs]
    lines = table(("job", "provider", "provider id", "batch", "status", "requests", "counts",
                   "age", "reserved"), rows, indent="")
    if any(j["status"] == "uncertain" for j in jobs):
        lines.append("an uncertain job may exist at the provider and be billed, but its id was "
                     "never recorded; its requests stay claimed. Check the provider's console, "
                     "then `batchjson cancel JOB` releases them.")
    return lines


def cancel_line(job: Mapping[str, Any]) -> str:
    """What ``batchjson cancel`` says it did."""
    if job.get("cancel_requested"):
        return (f"job {job['id']} is still being created by its runner: it cancels it at the "
                "provider as soon as it is created (nothing is released before; `batchjson "
                "jobs` shows it), and the next run you start owes its requests; if its runner "
                "has stopped, the job turns uncertain once its lease runs out: cancel it then")
    if job["status"] == "cancelled":
        return (f"job {job['id']} released: its {job.get('released', 0)} request(s) are owed "
                "again (their receipts stay, as possibly billed)")
    return (f"job {job['id']} ({job['provider_job_id']}) is {job['provider_status']} at the "
            "provider; the next run of its batch collects what ended and owes the rest again")


def _age(stamp: str) -> str:
    """How long ago an ISO 8601 UTC time was: ``42s``, ``7m``, ``3h``, ``2d``."""
    try:
        seconds = (datetime.now(UTC) - datetime.fromisoformat(stamp)).total_seconds()
    except ValueError:
        return stamp[:19]
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"
