"""What a run hands back: the values that passed acceptance and an account of the rest, both
read when asked for; what it shows of its answers is read in one pass of at most :data:`COUNTED`."""

from __future__ import annotations

import html
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from itertools import groupby, islice
from operator import itemgetter
from typing import Any, Literal

from .._content.tasks import SequenceView
from .._errors import ConfigError, InvalidBatch, LedgerError
from .._ledger.ledger import Ledger
from .._ledger.records import Receipt
from .._ledger.store import Store
from .._money import money
from .._plaintext import Grid, clip, printable
from .plots import Chart, batch_chart

SAMPLE = 5  # accepted values a result's display shows
COUNTED = 50_000  # accepted values read, at most, to count the fixed-set fields' values
WIDE = 40  # characters of one cell; longer text is clipped
KINDS = 8  # values of one field listed by count; the rest are summed
WHOLE = ""  # the field name of an answer that is itself one of a fixed set (mode="value")


def fixed_set_fields(schema: Mapping[str, Any]) -> tuple[str, ...]:
    """The answer's fields with a fixed set of values in schema order (``(WHOLE,)``: itself)."""
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
    return clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                                separators=(",", ":")), WIDE)


def answers_grid(items: Iterable[tuple[str, Any]], schema: Mapping[str, Any],
                 total: int) -> Grid | None:
    """The first :data:`SAMPLE` values as a table, then each fixed-set field's counts."""
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
    if not sample:
        return None
    scope = f"all {total}" if counted >= total else f"the first {counted} of {total}"
    notes: list[tuple[str | None, str]] = [(None, f"counts over {scope} accepted values:")]
    for f, counter in counts.items():
        common = counter.most_common()
        listed = ", ".join(f"{v} {n}" for v, n in common[:KINDS])
        rest = sum(n for _, n in common[KINDS:])
        notes.append((f or "value", listed + (f", {len(common) - KINDS} other value(s) "
                                              f"{rest}" if rest else "")))
    props = schema.get("properties")
    return Grid(f"accepted values (the first {len(sample)} of {total}):",
                *_sample_table(sample, tuple(props) if isinstance(props, Mapping) else ()),
                notes=notes if counts else (), bold=False)


def _sample_table(sample: list[tuple[str, Any]],
                  order: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows): task_id, then an object value's fields, the schema's first."""
    objects = all(isinstance(v, dict) for _, v in sample)
    seen = {k for _, v in sample for k in v} - {"task_id"} if objects else set()
    fields = [k for k in order if k in seen] + sorted(seen - set(order))
    rows = [[task_id, *([cell(v[f]) if f in v else "" for f in fields] if objects
                        else [cell(v)])] for task_id, v in sample]
    return ["task_id", *(fields if objects else ["value"])], rows


class LedgerRead(partial):
    """A read of the ledger a result makes when asked: a deep copy reads the same ledger."""

    def __deepcopy__(self, memo: dict[int, Any]) -> LedgerRead:
        return self


class TaskAttempts(Mapping[str, int]):
    """task_id -> calls this run made carrying it, counted on first use from the run's log."""

    def __init__(self, calls_log: Iterable[str]) -> None:
        self._log = calls_log

    @cached_property
    def _tasks(self) -> dict[str, int]:
        return dict(Counter(t for line in self._log for t in json.loads(line)))

    def __getitem__(self, task_id: str) -> int:
        return self._tasks[task_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)

    def __repr__(self) -> str:
        return repr(self._tasks)

SHOWN = 10  # failed requests a notebook shows; the rest are counted


@dataclass(frozen=True)
class ThrownAway:
    """Valid answers a run threw away with rejected pack-mates (``answers``, the times one was;
    ``unresolved``: tasks of them left without a value), their share of those returns' cost
    (None: unknown) and tokens, and whether the run split: what accepting items would save."""

    answers: int
    unresolved: int
    cost: float | None
    tokens: float
    split: bool

    def said(self, accept: str = 'accept="items"', split: str = "split=True") -> str:
        """The one-line suggestion, options spelled as the face spells them. Each answer thrown
        away and not left unresolved was asked again at about its share."""
        again = (self.answers - self.unresolved) / self.answers
        saved = (f"about {money(self.cost * again)}" if self.cost is not None
                 else f"about {self.tokens * again:,.0f} tokens")
        more = f"accepting {self.unresolved} more and " if self.unresolved else ""
        return (f"this run threw away {self.answers} valid answer(s) with a rejected pack-mate: "
                f"{accept} would have kept them, {more}saving {saved} of asking again"
                + ("" if self.split else f" (or {split}, which asks the halves apart)"))


@dataclass
class BatchResult:
    """``values`` holds only committed answers; ``errors`` says why the rest are not there."""

    name: str
    status: Literal["resolved", "unresolved", "pending"]
    values: Mapping[str, Any]  # read from the ledger on demand; dict(values) copies it
    errors: Sequence[dict[str, Any]]  # built one at a time when read; list(errors) copies it
    calls: int
    tokens: int
    cost: float | None
    revision: int
    total_tasks: int
    accepted_returns: int = 0
    rejected_returns: int = 0
    partial_returns: int = 0  # accepted in part (accept="items"): the rest asked again
    provider_errors: int = 0
    resumed: int = 0
    superseded: str | None = None
    attempts_by_task: Mapping[str, int] = field(default_factory=dict)  # calls per task
    repairs_made: int = 0
    notes: list[str] = field(default_factory=list)
    rechecked: int = 0  # requests resolved by re-judging earlier returns (no calls)
    identity_compared: tuple[str, ...] = ()  # fields every item must copy from its task
    # under the default identity, other task fields an item is held to only if it echoes them
    compared_if_echoed: tuple[str, ...] = ()
    provider: str | None = None  # provider name / model the run asked
    thrown_away: ThrownAway | None = None  # valid answers rejected with their pack-mates
    # batch transport: every job still holding a request of this batch (status "pending")
    jobs: list[dict[str, Any]] = field(default_factory=list)
    # the batch's receipts, read from the ledger when plot() asks
    read_receipts: Callable[[], Sequence[Receipt]] | None = field(default=None, repr=False,
                                                                 compare=False)
    # the answers' JSON Schema: the display's columns, and its fixed-set fields to count
    answer_schema: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def resolved(self) -> bool:
        return self.status == "resolved"

    @property
    def unresolved(self) -> list[str]:
        """task_ids with no committed answer."""
        return list(dict.fromkeys(e["task_id"] for e in self.errors
                                  if e.get("task_id") and e["task_id"] not in self.values))

    def to_jsonl(self, path: str | os.PathLike | None = None) -> str | None:
        """Every accepted value as JSON Lines (``{"task_id": ..., "value": ...}``), streamed to
        ``path``; with no path, the whole text."""
        lines = (json.dumps({"task_id": task_id, "value": value}, ensure_ascii=False) + "\n"
                 for task_id, value in plain_items(self.values))
        if path is None:
            return "".join(lines)
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(lines)
        return None

    def to_pandas(self) -> Any:
        """A pandas DataFrame of the accepted values: a ``task_id`` column, then one column per
        field of an object value (a ``value`` column for any other value). Needs pandas."""
        try:
            import pandas
        except ImportError:
            raise ConfigError("to_pandas() needs pandas: pip install pandas (or write the "
                              "values with to_jsonl(path))") from None
        rows = ({"task_id": task_id, **(v if isinstance(v, dict) else {"value": v})}
                for task_id, v in plain_items(self.values))
        return pandas.DataFrame.from_records(rows)

    def plot(self, path: str | os.PathLike[str] | None = None) -> Chart:
        """This revision's spend and accepted results over time, as a :class:`Chart` (its PNG
        written to ``path`` too). Needs ``batchjson[plots]``."""
        if self.read_receipts is None:
            raise InvalidBatch(f"batch {self.name!r}: this result was not made by a run, so it "
                               "has no receipts to draw")
        chart = batch_chart(self.read_receipts(), self.name, self.revision)
        if path is not None:
            chart.save(path)
        return chart

    def summary(self) -> dict[str, Any]:
        return {
            "batch": self.name, "revision": self.revision, "status": self.status,
            "accepted": len(self.values), "tasks": self.total_tasks,
            "accepted_returns": self.accepted_returns, "rejected_returns": self.rejected_returns,
            "partial_returns": self.partial_returns, "provider_errors": self.provider_errors,
            "calls": self.calls, "tokens": self.tokens,
            "cost": self.cost, "unresolved": self.total_tasks - len(self.values),
            "resumed": self.resumed, "rechecked": self.rechecked,
            "identity_compared": list(self.identity_compared),
            "compared_if_echoed": list(self.compared_if_echoed), "provider": self.provider,
            "jobs": list(self.jobs),
        }

    @property
    def raws(self) -> dict[str, str]:
        """Each failed request's raw return, kept once (not on every task's error)."""
        return getattr(self.errors, "raws", {})

    @property
    def failures(self) -> list[dict[str, Any]]:
        """One entry per failed request: its tasks, its own errors once, how many bystanders shared
        the rejection, and the raw return once."""
        return self._failure_groups()[0]

    def _failed_errors(self) -> Any:
        if isinstance(self.errors, ResultErrors):
            return iter(self.errors)
        return (e for e in self.errors if e.get("task_id") not in self.values)

    def _failure_groups(self, limit: int | None = None, pending: bool = True
                        ) -> tuple[list[dict[str, Any]], int]:
        """The first ``limit`` failed requests grouped, and how many failed
        (without ``pending``, not those a batch job holds)."""
        kept: dict[str, bool] = {}  # request -> shown (one bool a request)
        for e in self._failed_errors():
            key = request_of(e)
            kept[key] = kept.get(key, False) or pending or e.get("type") != "pending"
        shown = [key for key, admitted in kept.items() if admitted]
        total, shown = len(shown), set(shown[:limit] if limit is not None else shown)
        groups: dict[str, dict[str, Any]] = {}
        for e in self._failed_errors():
            key = request_of(e)
            if key in shown:
                _add(groups.setdefault(key, {"request": e.get("request"), "tasks": [],
                                             "errors": [], "bystanders": 0,
                                             "raw": self.raws.get(key)}), e)
        return list(groups.values()), total

    def failure_report(self, limit: int = 10) -> str:
        """A short account: which requests failed, why, what was spent, and how to resume."""
        missing = self.total_tasks - len(self.values)
        lines = [f"batch {self.name!r} (revision {self.revision}) is unresolved: {missing} of "
                 f"{self.total_tasks} task(s) have no accepted answer after {self.calls} call(s), "
                 f"{self.tokens} tokens, cost {money(self.cost)}.", *self._failure_lines(limit)]
        if any(e.get("type") == "validator_error" for e in self.errors):
            lines.append("A validator raised something other than ValueError or AssertionError: "
                         "fix the validator (those errors are never retried).")
        if self.thrown_away is not None:
            lines.append(self.thrown_away.said() + ".")
        lines.append("Accepted answers are committed; re-running the same batch resumes and "
                     "spends calls only on the unresolved requests.")
        return "\n".join(lines)

    def _failure_lines(self, limit: int, pending: bool = True) -> list[str]:
        lines = []
        failures, count = self._failure_groups(limit, pending)
        for f in failures:
            tasks = f["tasks"]
            what = (tasks[0] if len(tasks) == 1 else
                    f"{len(tasks)} tasks ({tasks[0]} .. {tasks[-1]})")
            lines.append(f"  request of {what}:")
            for e in f["errors"][:3]:
                lines.append(f"    {e.get('type')}: {e.get('message')}")
                lines += [f"      {line}" for line in tracebacks(e)]
            if len(f["errors"]) > 3:
                lines.append(f"    ... and {len(f['errors']) - 3} more error(s)")
            if f["bystanders"]:
                lines.append(f"    {f['bystanders']} other task(s) of this request were fine but "
                             "shared the rejected return (a return is accepted whole or not at "
                             "all)")
        if count > limit:
            lines.append(f"  ... and {count - limit} more failed request(s)")
        return lines

    def __repr__(self) -> str:
        s = self.summary()
        return (f"<BatchResult {self.name!r} rev {self.revision}: {self.status}, "
                f"{s['accepted']}/{s['tasks']} accepted, {s['rejected_returns']} rejected "
                f"return(s), "
                f"{f'{self.partial_returns} accepted in part, ' if self.partial_returns else ''}"
                f"{self.calls} call(s), {self.tokens} tokens, cost "
                f"{money(self.cost)}, {s['unresolved']} unresolved"
                f"{f', {self.resumed} request(s) resumed' if self.resumed else ''}"
                f"{f', {self.rechecked} re-judged without a call' if self.rechecked else ''}"
                + (f", identity compared: {self._compared()}" if self.identity_compared
                   else "") + ">")

    def _compared(self) -> str:
        """E.g. "task_id (and case_id if echoed)"."""
        also = (f" (and {', '.join(self.compared_if_echoed)} if echoed)"
                if self.compared_if_echoed else "")
        return ", ".join(self.identity_compared) + also

    @cached_property
    def _answers(self) -> Grid | None:
        return answers_grid(plain_items(self.values), self.answer_schema, len(self.values))

    def __str__(self) -> str:
        """What ``print(result)`` shows: the summary, failed requests first, then the answers."""
        failed = self._failure_lines(SHOWN, pending=False)
        lines = [repr(self), *(["failed requests:", *failed] if failed else []),
                 *(f"pending in job {job['id']} ({job['provider_job_id'] or job['status']}): "
                   f"{job['requests']} request(s){_submitted(job)}; re-run to collect what has "
                   "ended"
                   for job in self.jobs), *(self._answers.lines() if self._answers else ())]
        return "\n".join(map(printable, lines))

    def _repr_html_(self) -> str:
        """The notebook display: counts, what was compared, jobs, failures, answers."""
        s = self.summary()
        colour = ("#1a7f37" if self.resolved else "#9a6700" if self.status == "pending"
                  else "#cf222e")
        cells = "".join(
            f"<td style='padding:2px 10px'><b>{html.escape(str(v))}</b><br>"
            f"<span style='color:#666'>{html.escape(k)}</span></td>"
            for k, v in (("accepted", f"{s['accepted']}/{s['tasks']}"),
                         *((("returns accepted in part", self.partial_returns),)
                           if self.partial_returns else ()),
                         ("rejected returns", s["rejected_returns"]),
                         ("provider errors", s["provider_errors"]), ("calls", self.calls),
                         ("tokens", self.tokens), ("cost", money(self.cost)),
                         ("unresolved", s["unresolved"]), ("resumed requests", self.resumed)))
        compared = (f"<div style='color:#666'>identity compared: "
                    f"{html.escape(self._compared())}</div>" if self.identity_compared else "")
        if self.rechecked:
            compared += (f"<div style='color:#666'>{self.rechecked} request(s) resolved by "
                         "re-judging earlier returns, without a call</div>")
        return "".join([f"<div><div><span style='color:{colour}'>&#9679;</span> batch "
                        f"<code>{html.escape(self.name)}</code> revision {self.revision}: "
                        f"<b>{self.status}</b><table><tr>{cells}</tr></table></div>", compared,
                        _jobs_html(self.jobs), self._failures_html(),
                        self._answers.html() if self._answers else "", "</div>"])

    def _failures_html(self) -> str:
        failures, count = self._failure_groups(SHOWN, pending=False)
        if not failures:
            return ""
        rows = []
        for f in failures:
            tasks = f["tasks"]
            what = (tasks[0] if len(tasks) == 1 else
                    f"{len(tasks)} tasks: {tasks[0]} .. {tasks[-1]}")
            first = f["errors"][0] if f["errors"] else {"type": "batch_rejected",
                                                        "message": "rejected with others"}
            more = (f" (+{len(f['errors']) - 1} more)" if len(f["errors"]) > 1 else "")
            frames = "\n".join(tracebacks(first))
            rows.append(f"<li><code>{html.escape(what)}</code>: "
                        f"{html.escape(str(first.get('type')))}: "
                        f"{html.escape(str(first.get('message')))}{html.escape(more)}"
                        + (f"<pre style='margin:2px 0'>{html.escape(frames)}</pre>"
                           if frames else "") + "</li>")
        if count > SHOWN:
            rows.append(f"<li>... and {count - SHOWN} more failed request(s)</li>")
        return (f"<div>{count} failed request(s):<ul style='margin:2px 0'>"
                f"{''.join(rows)}</ul></div>")


def tracebacks(error: Mapping[str, Any]) -> list[str]:
    """The lines of the validator's own frames an error keeps (a ``validator_error``)."""
    frames = error.get("traceback")
    return frames.split("\n") if isinstance(frames, str) and frames else []


def _jobs_html(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return ""
    rows = "".join(
        f"<li>job {job['id']} <code>{html.escape(str(job['provider_job_id'] or '-'))}</code> "
        f"({html.escape(str(job['provider']))}): {html.escape(str(job['status']))}"
        f"{' / ' + html.escape(str(job['provider_status'])) if job.get('provider_status') else ''}"
        f", {job['requests']} request(s){_submitted(job)}</li>" for job in jobs)
    return (f"<div>pending in {len(jobs)} batch job(s); re-run to collect what has ended:"
            f"<ul style='margin:2px 0'>{rows}</ul></div>")


def _submitted(job: Mapping[str, Any]) -> str:
    stamp = job.get("submitted_at")
    return f", submitted {stamp[:16].replace('T', ' ')}Z" if stamp else ""


PAGE_REQUESTS = 200  # leaf requests per page read while iterating


class LedgerValues(Mapping[str, Any]):
    """task_id -> accepted value of one revision, loaded when read; ``hidden`` ids absent."""

    def __init__(self, store: Store, revision_id: int, load: Callable[[Any], Any],
                 hidden: frozenset[str] = frozenset()) -> None:
        self._store, self._revision, self._load = store, revision_id, load
        self._hidden = hidden

    @cached_property
    def _count(self) -> int:
        return self._read("value_count", revision_id=self._revision) - len(self._hidden)

    @cached_property
    def _lookup(self) -> tuple[dict[str, str], Any]:
        where, accepted = self._read("revision_lookup", self._revision)
        return {t: key for key, ids in where for t in json.loads(ids)}, accepted

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return (task_id for task_id, _ in self.stored_items())

    def __getitem__(self, task_id: str) -> Any:
        key = None if task_id in self._hidden else self._lookup[0].get(task_id)
        if key is None:
            raise KeyError(task_id)
        rows = self._read("revision_values", self._revision, task=(key, task_id))
        return self._load(json.loads(rows[-1][3]))

    def __contains__(self, task_id: object) -> bool:
        """Read without a query per task (a result's errors ask it of every failed task)."""
        if not isinstance(task_id, str) or task_id in self._hidden:
            return False
        where, accepted = self._lookup
        return where.get(task_id) in (accepted or ())

    def items(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        for task_id, text in self.stored_items():
            yield task_id, self._load(json.loads(text))

    def values(self) -> Iterator[Any]:  # type: ignore[override]
        return (value for _, value in self.items())

    def stored_items(self) -> Iterator[tuple[str, str]]:
        """(task_id, stored JSON) in task order; a page's last position waits for
        the next page (a split request's parts may go on there)."""
        after: tuple[int, int] | None = (-1, -1)
        held: list[Any] = []
        while after is not None:
            rows = self._read("revision_values", self._revision, page=(after, PAGE_REQUESTS))
            requests = list(dict.fromkeys((row[0], row[1]) for row in rows))
            after = requests[-1] if len(requests) == PAGE_REQUESTS else None
            rows, last = held + list(rows), after[0] if after is not None else None
            held = [row for row in rows if row[0] == last]
            for _, group in groupby((row for row in rows if row[0] != last), itemgetter(0)):
                yield from self._in_task_order(list(group))

    def _in_task_order(self, rows: list[Any]) -> Iterator[tuple[str, str]]:
        """One position's values, the latest accepted row winning, in its tasks' order (a
        pack's rows come in task_id order; a split request's parts in their requests')."""
        seen: dict[str, str] = {}
        for _, _, task_id, text, _ in rows:
            if task_id is not None:
                seen[task_id] = text
        tasks = json.loads(rows[0][4])
        if list(seen) != tasks:  # some not accepted, or not in order
            order = {task_id: n for n, task_id in enumerate(tasks)}
            seen = dict(sorted(seen.items(), key=lambda kv: order.get(kv[0], len(order))))
        for task_id, text in seen.items():
            if task_id not in self._hidden:
                yield task_id, text

    def __repr__(self) -> str:
        return f"<values of {len(self)} task(s), read from the ledger; dict(values) copies them>"

    def _read(self, what: str, *args: Any, **named: Any) -> Any:
        """One of the store's reads, the ledger opened again once the session closed it."""
        try:
            return getattr(self._store, what)(*args, **named)
        except LedgerError:
            where = _where(self._store)
            if where is None:  # in memory: nothing to open again (its values were copied)
                raise
            self._store = Ledger(where).store
            return getattr(self._store, what)(*args, **named)


def _where(store: Store) -> Any:
    return getattr(store, "url", None) or getattr(store, "path", None)


def result_values(store: Store, revision_id: int,
                  schema: Any) -> tuple[Mapping[str, Any], list[dict[str, Any]]]:
    """A revision's values (a dict for an in-memory ledger), and a ``stored_invalid`` error
    for each the schema no longer loads (only a pydantic model's load can fail: read once here)."""
    values, unloadable = LedgerValues(store, revision_id, schema.load), []
    for task_id, text in values.stored_items() if schema.model is not None else ():
        try:
            schema.load(json.loads(text))
        except Exception as exc:  # noqa: BLE001 - a stored value the schema no longer accepts
            unloadable.append({
                "type": "stored_invalid", "task_id": task_id,
                "message": f"the stored answer no longer loads under the schema "
                           f"({type(exc).__name__}: {str(exc)[:300]}); change the schema "
                           "back, or re-run under a schema it satisfies"})
    if unloadable:
        values = LedgerValues(store, revision_id, schema.load,
                              frozenset(e["task_id"] for e in unloadable))
    return (values if _where(store) is not None else dict(values.items())), unloadable


def plain_items(values: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(task_id, value as plain JSON data) in task order, building no model instance."""
    if isinstance(values, LedgerValues):
        for task_id, text in values.stored_items():
            yield task_id, json.loads(text)
        return
    for task_id, value in values.items():
        dump = getattr(value, "model_dump", None)
        yield task_id, dump(mode="json") if callable(dump) else value


REPR_ERRORS = 20  # errors a repr shows


class ResultErrors(SequenceView):
    """Every task's errors, each a fresh dict when read: failed, held by a job, unloadable,
    then never attempted (``task_ids`` read only for those)."""

    def __init__(self, failed: Mapping[str, list[dict[str, Any]]], accepted: Any,
                 extra: list[dict[str, Any]], task_ids: Callable[[], Iterable[str]],
                 missing: int, not_attempted: str, pending: Sequence[str] = (),
                 pending_tasks: int = 0) -> None:
        self._failed, self._accepted, self._extra = failed, accepted, extra
        self._task_ids, self._missing, self._why = task_ids, missing, not_attempted
        self._pending, self._pending_tasks = pending, pending_tasks
        # failed yet accepted by the run's end (another runner's answer): read now, so the
        # errors stay those of the run's end
        self._answered = {t for t in failed if t in accepted}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for task_id, errs in self._failed_items():
            for e in errs:
                yield {**{k: v for k, v in e.items() if k != "raw"}, "task_id": task_id}
        yield from self._pending_errors()
        yield from (dict(e) for e in self._extra)
        if self._unattempted:
            named = {e["task_id"] for e in self._extra}
            named.update(e["task_id"] for e in self._pending_errors())
            for task_id in self._task_ids():
                if (task_id not in self._failed and task_id not in named
                        and task_id not in self._accepted):
                    yield {"type": "not_attempted", "task_id": task_id, "message": self._why}

    def _pending_errors(self) -> Iterator[dict[str, Any]]:
        for text in self._pending:
            held = json.loads(text)
            for task_id in held["task_ids"]:
                yield {"type": "pending", "task_id": task_id, "request": held["request"],
                       "message": f"submitted in {held['where']}; re-run to collect what has "
                       "ended"}

    def _failed_items(self) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        answered = self._answered
        return ((t, errs) for t, errs in self._failed.items() if t not in answered)

    @cached_property
    def _unattempted(self) -> int:
        failed = sum(1 for _ in self._failed_items())
        return max(0, self._missing - failed - self._pending_tasks
                   - len({e["task_id"] for e in self._extra}))

    @cached_property
    def _len(self) -> int:
        return (sum(len(errs) for _, errs in self._failed_items()) + len(self._extra)
                + self._pending_tasks + self._unattempted)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            if (index.step or 1) > 0 and (index.start or 0) >= 0 and (
                    index.stop is None or index.stop >= 0):
                return list(islice(self, index.start, index.stop, index.step))
            return list(self)[index]
        if index < 0:
            index += len(self)
        found = next(islice(self, index, None), None) if index >= 0 else None
        if found is None:
            raise IndexError("error index out of range")
        return found

    def __repr__(self) -> str:
        """As a list, up to :data:`REPR_ERRORS` of them; beyond, those and a count of the rest."""
        first = list(islice(self, REPR_ERRORS + 1))
        if len(first) <= REPR_ERRORS:
            return repr(first)
        return (repr(first[:REPR_ERRORS])[:-1] + f", ... and {len(self) - REPR_ERRORS} more; "
                "list(errors) copies them]")

    @cached_property
    def raws(self) -> dict[str, str]:
        raws: dict[str, str] = {}
        for _, errs in self._failed_items():
            for e in errs:
                if e.get("raw") is not None:
                    raws.setdefault(request_of(e), e["raw"])
        return raws


def _add(group: dict[str, Any], e: Mapping[str, Any]) -> None:
    """One error into its request's group: tasks once, bystanders counted, each message once."""
    task_id = e.get("task_id")
    if task_id is not None and (not group["tasks"] or group["tasks"][-1] != task_id):
        group["tasks"].append(task_id)
    if e.get("type") == "batch_rejected":
        group["bystanders"] += 1
        return
    what = (e.get("type"), e.get("message"))
    if all((x.get("type"), x.get("message")) != what for x in group["errors"]):
        group["errors"].append({k: v for k, v in e.items() if k != "request"})


def request_of(error: Mapping[str, Any]) -> str:
    if error.get("request"):
        return str(error["request"])
    if error.get("type") == "not_attempted":
        return "not_attempted"
    return f"{error.get('type')}:{error.get('task_id')}:{error.get('message')}"
