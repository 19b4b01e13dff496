"""An estimate before spending: the run's own plan (``record=False``), stopped before recording;
its worst case asks the next-attempt policy about each pending request always rejected. Input
tokens are prompt characters / 4; output from the smallest answers to each call's ceiling."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from .._content.schema import largest_answer, smallest_answers
from .._content.tasks import Request
from .._errors import BudgetExceeded
from .._money import money, usd
from .._plaintext import printable
from .._providers.base import estimate_tokens
from .._providers.batch_client import WINDOW_HOURS
from .._providers.settings import call_output_cap
from .._replay.plan import Plan, first_prompt, system_prompt
from .._replay.settle import HALVE, NONE, Tried, next_attempt
from . import batches
from .plan import RunPlan, Runtime
from .run import Progress, calls_of, plan_calls, plan_of
from .spec import RunSpec, answer_floor, sent_schema

Span = tuple[Any, Any]  # (low, high): every first return accepted; every return rejected
ERROR_CHARS = 200  # what a repair prompt is taken to carry back per task of its request


@dataclass(frozen=True)
class Estimate:
    """What ``run_batch`` with the same arguments would do, nothing sent or recorded.

    ``calls``, ``input_tokens``, ``output_tokens``, ``cost_live`` and ``cost_batch`` are (low,
    high) pairs: low when every first return is accepted, high when every return is rejected for
    as long as the repairs, replays and split allow (a provider failure retried by the transport
    comes on top); None where no price or no bound is known (``notes`` say which). ``minutes``:
    the time the known rate limits take at least (None: none known, or a batch job)."""

    name: str
    transport: str
    tasks: int
    requests: int
    reused: int  # requests accepted before: taken as they are
    rejudged: int  # requests resolved by re-judging earlier returns, without a call
    to_send: int
    calls: tuple[int, int]
    input_tokens: tuple[int, int]
    output_tokens: tuple[int, int | None]
    cost_live: tuple[float | None, float | None]
    cost_batch: tuple[float | None, float | None]
    minutes: tuple[float, float] | None
    budget_suffices: bool | None  # None: no budget limits the run
    budget: str
    notes: tuple[str, ...] = ()

    def rows(self) -> list[tuple[str, str]]:
        """(what, how much) in the order a person reads them."""
        return [
            ("requests", f"{self.requests:,} for {self.tasks:,} task(s): {self.reused:,} "
             f"accepted already (reused), {self.rejudged:,} resolved by re-judging earlier "
             f"returns, {self.to_send:,} to send"),
            ("calls", f"{self.calls[0]:,} if every first return is accepted, at most "
             f"{self.calls[1]:,} if every return is rejected"),
            ("tokens", f"input {_span(self.input_tokens, '{:,}'.format)}, output "
             f"{_span(self.output_tokens, '{:,}'.format)} (estimated)"),
            ("cost", f"live {_span(self.cost_live, money)}; as a batch job "
             f"{_span(self.cost_batch, money)}"),
            ("time", _time(self.minutes, self.transport)),
            ("budget", self.budget)]

    def __str__(self) -> str:
        head = (f"estimate of batch {printable(self.name)!r} ({self.transport}): nothing was "
                "sent or recorded")
        return "\n".join([head, *(f"  {what}: {said}" for what, said in self.rows()),
                          *(f"  note: {note}" for note in self.notes)])

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))  # IPython in a terminal shows it as print() does

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td style='color:#666;padding-right:10px'>{html.escape(what)}</td>"
                       f"<td>{html.escape(said)}</td></tr>" for what, said in self.rows())
        notes = "".join(f"<div style='color:#666'>{html.escape(note)}</div>"
                        for note in self.notes)
        return (f"<div>estimate of batch <code>{html.escape(self.name)}</code> "
                f"({html.escape(self.transport)}): nothing was sent or recorded"
                f"<table>{rows}</table>{notes}</div>")


def _span(span: Span, shown: Any) -> str:
    low, high = span
    if high is None:
        return f"{shown(low)} to no known bound" if low is not None else "unknown"
    return shown(low) if low == high else f"{shown(low)} to {shown(high)}"


def _time(minutes: tuple[float, float] | None, transport: str) -> str:
    if transport == "batch":
        return f"a batch job ends within the provider's {WINDOW_HOURS}-hour window"
    if minutes is None:
        return ("no rate limit known (set rate_limits=, or the first answer's headers say): "
                "as fast as the provider answers")
    return (f"at least {_span(minutes, lambda m: f'{m:,.1f}')} minute(s) under the known rate "
            "limits")


@dataclass
class _Case:
    """The pending requests' calls and tokens when every first return is accepted, or none is."""

    calls: int = 0
    input: int = 0
    output: int | None = 0  # None: no bound
    ceilings: int = 0  # the output ceilings the calls ask for, as a limiter counts them

    def add(self, prompt: str, output: int | None, ceiling: int | None) -> None:
        self.calls += 1
        self.input += estimate_tokens(prompt)
        self.output = None if output is None or self.output is None else self.output + output
        self.ceilings += ceiling or 0


def estimate_run(rt: Runtime, spec: RunSpec) -> Estimate:
    """The estimate of ``spec``: every input check the run makes, then its plan and calls."""
    batches.forgo_ended_elsewhere(rt)  # the budget as the run would find it
    plan = plan_of(rt, spec, Progress(spec.name, False, rt.budget, rt.tally), record=False)
    pending = () if plan.finished is not None else plan.pending  # re-read a window at a time
    calls, low, high = calls_of(rt, plan), _Case(), _Case()
    system = system_prompt(calls) if pending else ""
    for request in pending:
        _request(calls, plan.provider, system, request, low, high,
                 halving=spec.transport == "live")
    live, batch = (batches.pricing(plan.provider, batch=b) for b in (False, True))
    cost_live, cost_batch = ((p.cost(low.input, low.output), p.cost(high.input, high.output))
                             for p in (live, batch))
    suffices, budget = _budget(rt, plan, low, high, cost_batch if spec.transport == "batch"
                               else cost_live)
    return Estimate(
        spec.name, spec.transport, plan.total, plan.requests, plan.resumed, len(plan.rechecked),
        len(pending), (low.calls, high.calls), (low.input, high.input), (low.output, high.output),
        cost_live, cost_batch, _minutes(rt, low, high), suffices, budget,
        _notes(rt, plan, low, high, live.priced))


def _request(calls: Plan, provider: Any, system: str, request: Request, low: _Case,
             high: _Case, *, halving: bool, depth: int = 0) -> None:
    """Every attempt the policy allows ``request`` when each return is rejected, halves too."""
    ceiling = call_output_cap(provider, calls.answer_chars(request.tasks))  # as a call asks
    most = ceiling if ceiling is not None else largest_answer(  # one token a character
        sent_schema(calls.schema, request.tasks, calls.identity, calls.mode))
    if depth == 0:  # the low case: its first call, answered at the least
        low.add(system + first_prompt(calls, request), answer_floor(smallest_answers(
            calls.schema, request.tasks, calls.identity, calls.mode), calls.mode), ceiling)
    rejected = [{"type": "validation", "task_id": t["task_id"], "message": "x" * ERROR_CHARS}
                for t in request.tasks]
    raw = "x" * min(most or 10_000, 10_000)  # what a repair prompt shows of it (cut at 4,000)
    chain: list[Tried] = []
    step = next_attempt(calls, request, chain, tried=False, depth=depth)
    while step.kind not in (HALVE, NONE):
        high.add(system + step.prompt, most, ceiling)
        chain.append(Tried(step.kind, rejected, raw))
        step = next_attempt(calls, request, chain, tried=True, depth=depth)
    if step.kind == HALVE and halving:
        for half in calls.keys.split(request):
            _request(calls, provider, system, half, low, high, halving=True, depth=depth + 1)


def _minutes(rt: Runtime, low: _Case, high: _Case) -> tuple[float, float] | None:
    """The least time the session's share of the known limits takes, low and high case."""
    pacer = rt.pacer
    rpm, tpm = pacer.requests_per_minute, pacer.tokens_per_minute
    if not rpm and not tpm:
        return None

    def minutes(case: _Case) -> float:
        tokens = case.input + case.ceilings
        return pacer.hosts * max(case.calls / rpm if rpm else 0.0, tokens / tpm if tpm else 0.0)

    return minutes(low), minutes(high)


def _budget(rt: Runtime, plan: RunPlan, low: _Case, high: _Case,
            cost: tuple[float | None, float | None]) -> tuple[bool | None, str]:
    if not low.calls:
        return True, "nothing to send"
    try:
        _, spender = plan_calls(rt, plan)  # the run's own refusal, before anything is spent
    except BudgetExceeded as refused:
        return False, f"the run would be refused: {refused}"
    calls_left, shared = spender.remaining_calls(), rt.ledger.budget()
    lefts = [rt.budget.cost - rt.tally.cost - rt.tally.reserved] if rt.budget.cost is not None \
        else []
    lefts += [shared["cost"] - shared["spent"]] if shared is not None else []
    cost_left = min(lefts) if lefts else None
    if calls_left is None and cost_left is None:
        return None, "no budget set: nothing limits the calls or the spend"
    left = ", ".join(([f"{calls_left:,} call(s)"] if calls_left is not None else [])
                     + ([usd(max(0.0, cost_left))] if cost_left is not None else []))

    def covers(calls: int, spend: float | None) -> bool:
        return ((calls_left is None or calls <= calls_left)
                and (cost_left is None or (spend is not None and spend <= cost_left)))

    if covers(high.calls, cost[1]):
        return True, f"covers the worst case ({left} left)"
    if covers(low.calls, cost[0]):
        return False, (f"covers every first call but not the worst case ({left} left): the "
                       "run stops when it is spent, the rest owed")
    return False, f"does not cover every first call ({left} left)"


def _notes(rt: Runtime, plan: RunPlan, low: _Case, high: _Case, priced: bool) -> tuple[str, ...]:
    notes = [*plan.notes, *plan.provider_notes]
    if plan.broken:
        notes.append(f"the validator failed while re-judging a stored return "
                     f"({plan.broken[0]['message'][:300]}): the run would send nothing until "
                     "it is fixed")
    if plan.blind:
        notes.append(f"the judging reads what no fingerprint can see ({'; '.join(plan.blind)}):"
                     " stored answers are re-judged on every run")
    if plan.existing is None and low.calls and rt.ledger.revisions(plan.spec.name):
        notes.append("the content differs from the batch's last run: the run opens a new "
                     "revision")
    if not priced:
        notes.append(f"no price is known for {getattr(plan.provider, 'model', None) or 'the model'}"
                     ": costs unknown (batchjson.set_prices sets one)")
    if high.output is None:
        notes.append("the schema leaves an answer's size unbounded and the provider sends no "
                     "max_tokens, so the worst case has no bound (cap strings with maxLength, "
                     "arrays with maxItems, numbers with minimum and maximum, objects with "
                     "additionalProperties: false; or set max_tokens)")
    return tuple(notes)
