"""A run as a pipeline: check, judge with, key, find, re-judge, fit (pure steps over a frozen
:class:`RunPlan`: nothing is recorded or spent before they pass); record, send, report."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from .._content.keys import answer_source
from .._content.tasks import Request
from .._errors import BatchUnresolved
from .._money import usd
from .._providers.reply import MOST_TOKENS, GuardedProvider, provider_names
from .._replay.budget import Budget, Spender, Tally
from .._replay.jobs import JobRunner, JobsOutcome
from .._replay.plan import Outcome, Plan, cheapest_call
from .._replay.replay import Replayer
from . import batches, window
from .plan import RunPlan, Runtime, find_completed, finished, keyed
from .registry import checker_of
from .rejudge import (
    UNSEEN,
    Judging,
    clear_sourceless,
    commit_rechecks,
    earlier_candidates,
    unseen_token,
)
from .result import BatchResult, LedgerRead, ResultErrors, TaskAttempts, ThrownAway, result_values
from .spec import RunSpec, check_fit, check_rate_fit, compared_candidates

T = TypeVar("T")
COLOURS = {"resolved": "green", "pending": "yellow"}  # any other end (unresolved, stopped): red
READING_DELAY = 0.5  # seconds of reading before its count shows: a quick refusal prints only itself


def run_spec(rt: Runtime, spec: RunSpec) -> BatchResult:
    """Resolve every task of ``spec`` or say exactly what is still owed."""
    progress = Progress(spec.name, spec.progress, rt.budget, rt.tally)
    try:
        batches.forgo_ended_elsewhere(rt)
        result = _resolved(rt, spec, progress)
    except BaseException:
        progress.end(None)
        raise
    progress.end(result)
    # never unresolved while a batch job holds its requests: it is pending
    if result.status == "unresolved" and spec.on_exhausted == "raise":
        raise BatchUnresolved(result)
    return result


def _resolved(rt: Runtime, spec: RunSpec, progress: Progress) -> BatchResult:
    plan = plan_of(rt, spec, progress)
    if plan.finished is not None:  # every request accepted: nothing to record or send
        return collect_answered(rt, plan, report(rt, plan, plan.finished, Outcome()))
    calls, spender = plan_calls(rt, plan)
    revision, superseded = record_revision(rt, plan, calls)
    outcome, jobs = send(rt, plan, calls, spender, revision, progress)
    if plan.sourceless_of:  # imported requests of unknown source this run answered
        clear_sourceless(rt.ledger.store, judging_of(rt, plan), plan.owed, plan.sourceless_of,
                         plan.source)
    result = report(rt, plan, revision, outcome, superseded)
    if jobs is not None:  # pending while a job holds a request
        batches.report(result, jobs)
    elif not plan.pending:  # nothing sent: a job may hold what was accepted another way
        collect_answered(rt, plan, result)
    return result


def collect_answered(rt: Runtime, plan: RunPlan, result: BatchResult) -> BatchResult:
    """``result`` of a run that sent nothing, once the batch's ended jobs are collected: what a
    job holds may have been accepted another way meanwhile (an import, a merge), and what the
    provider ran and billed is collected all the same, as ``%batch_status`` does: each line a
    call, judged, admitting nothing twice. The jobs still running are named on ``result``."""
    store, name = rt.ledger.store, plan.spec.name
    if not any(row["batch"] == name for row in store.jobs()):
        return result
    schema = plan.content.schema  # so its jobs' lines are judged here
    rt.job_schemas.setdefault(schema.fingerprint, schema)
    result.notes.extend(batches.collect_ended(rt, name))
    result.jobs = [job for job in batches.list_jobs(rt.ledger) if job["batch"] == name]
    return result


def plan_of(rt: Runtime, spec: RunSpec, progress: Progress, *, record: bool = True) -> RunPlan:
    """The run's plan (``record=False``: an estimate's, registering and asking nothing)."""
    remembered = find_completed(rt, spec)  # a tasks file's finished run: nothing to read
    plan = (judge_with(rt, remembered, record=record) if remembered
            else planned(rt, spec, progress, record=record))
    return fitted(rt, plan, record=record)


def planned(rt: Runtime, spec: RunSpec, progress: Progress, *, record: bool = True) -> RunPlan:
    """A read run's plan: checked, judged, keyed, then found done, or surveyed on record."""
    content = spec.checked(progress.reading)  # every input check, before anything is recorded
    progress.checking()
    provider = rt.provider()  # refused here when none is configured
    plan = judge_with(rt, RunPlan(spec, content, provider, answer_source(provider)),
                      record=record)
    plan = keyed(plan, plan.version.fingerprint.digest if plan.version else "none")
    done = None if plan.blind or content.file_digest is not None else finished(
        rt.ledger, plan)  # a tasks file's run is remembered by its bytes
    if done is not None:
        return done
    judging = judging_of(rt, plan)
    return window.survey(rt.ledger.store, find_requests(rt, plan, judging), judging)


def judge_with(rt: Runtime, plan: RunPlan, *, record: bool = True) -> RunPlan:
    """The validator's version (registered, handed over, or previewed) and its checker."""
    spec, validator = plan.spec, plan.spec.validator
    handed = rt.validators.handed_over(validator, spec.validator_name, take=record)
    if validator is None:
        return plan
    version, notes = handed, plan.notes
    if handed is None and not record:
        version = rt.validators.preview(validator, name=spec.validator_name)
    elif handed is None:  # a new version says what changed (its code, a file it reads)
        definition = rt.validators.register(validator, name=spec.validator_name)
        version = definition.record
        if definition.kind == "changed":
            notes += (definition.message,)
    return replace(plan, version=version, notes=notes, checker=checker_of(
        version, spec.validator_args, rt.transport.timeout))


def judging_of(rt: Runtime, plan: RunPlan) -> Judging:
    return Judging(plan.spec.mode, plan.content.identity, plan.content.schema, plan.checker,
                   rt.loop.run)


def find_requests(rt: Runtime, plan: RunPlan, judging: Judging) -> RunPlan:
    """The revision on record; blind judging moves on to one naming what now fails."""
    store = rt.ledger.store
    while True:
        found = rt.ledger.revisions(plan.spec.name, fingerprint=plan.keys.revision)
        plan = replace(plan, existing=found[0] if found else None)
        if not plan.blind:
            return plan
        token = unseen_token(store, judging, list(window.every_request(store, plan)),
                             plan.keys.components.get(UNSEEN))
        if token is None:
            return plan
        plan = replace(plan, keys=plan.keys.with_part(UNSEEN, token))


def fitted(rt: Runtime, plan: RunPlan, *, record: bool = True) -> RunPlan:
    """What the provider cannot send as asked, said or refused; a batch run's API, checked."""
    spec, content = plan.spec, plan.content
    notes = check_fit(plan.provider, rt.ledger, spec.name, content.schema, plan.pending,
                      plan.largest, content.identity, spec.mode)
    client = None
    if spec.transport == "batch" and plan.finished is None and not record:
        batches.batch_offer(plan.provider)  # asked nothing: an estimate sends nothing
    elif spec.transport == "batch" and plan.finished is None:
        client = batches.client_for(rt, plan.provider)
        rt.job_schemas[content.schema.fingerprint] = content.schema  # for %batch_status
    return replace(plan, provider_notes=tuple(notes), client=client)


def calls_of(rt: Runtime, plan: RunPlan) -> Plan:
    spec, content = plan.spec, plan.content
    return Plan(batch_id=0, revision_id=0, mode=spec.mode,  # ids set once the revision opens
                identity=content.identity, schema=content.schema, validator=plan.checker,
                instructions=spec.instructions, keys=plan.keys,
                repairs=rt.repairs if spec.repairs is None else spec.repairs,
                replays=rt.replays if spec.replays is None else spec.replays,
                split=spec.split, source=plan.source, reask_refusals=spec.reask_refusals,
                accept=spec.accept)


def plan_calls(rt: Runtime, plan: RunPlan) -> tuple[Plan, Spender]:
    """The calls' plan; refused before spending if the budget cannot pay each pending request."""
    spec, calls = plan.spec, calls_of(rt, plan)
    live = spec.transport == "live"
    spender = Spender(spec.max_calls, rt.budget, rt.tally,
                      batches.pricing(plan.provider, batch=not live),
                      shared=rt.ledger.budget())
    if live:  # live calls are paced; a job has the batch API's own pool
        check_rate_fit(rt.pacer, calls, plan.pending, plan.provider, plan.longest)
    if spec.refuse_short_budget and live:  # a job submits the part that fits
        spender.refuse_if_short(len(plan.pending), cheapest_call(
            calls, plan.provider, spender.pricing, plan.pending))
    return calls, spender


def record_revision(rt: Runtime, plan: RunPlan, calls: Plan) -> tuple[Any, str | None]:
    """Open (or resume) the revision, its seen keys and rechecks: (revision, superseded)."""
    store, version, name = rt.ledger.store, plan.version, plan.spec.name
    doc, text = plan.content.schema.document  # so an export of it is rechecked whole
    revision, replaced = store.open_revision(  # a new revision's requests: streamed
        name, plan.keys.revision, {**plan.keys.components, doc: text},
        window.every_request(store, plan),
        strict=rt.strict, validator=None if version is None else  # already on record
        {"name": version.name, "version": version.version})
    superseded = None
    if replaced is not None:
        superseded = (f"revision {replaced.number} superseded "
                      f"({replaced.supersede_reason or 'content changed'})")
        if rt.on_note is not None and plan.pending:
            rt.on_note(f"{name}: {superseded}; revision {revision.number} runs "
                       f"{len(plan.pending)} request(s)")
    tasks, digest = plan.content.tasks, plan.content.file_digest
    if digest is not None:  # so a finished run of it resumes unread, fields as first seen
        store.task_file(digest, (plan.keys.components["tasks"], len(tasks),
                                 list(plan.content.fields)))
    if plan.existing is None or plan.pending or plan.rechecked:  # else on record already
        store.record_seen(window.seen_pairs(store, plan))
    if plan.rechecked:
        commit_rechecks(store, revision.batch_id, revision.id, list(plan.rechecked),
                        plan.source)
    calls.batch_id, calls.revision_id = revision.batch_id, revision.id
    return revision, superseded


def send(rt: Runtime, plan: RunPlan, calls: Plan, spender: Spender, revision: Any,
         progress: Progress) -> tuple[Outcome, JobsOutcome | None]:
    """The calls, and the jobs holding requests: none if the validator broke on a stored return."""
    store, outcome, jobs = rt.ledger.store, Outcome(), None
    if plan.pending and plan.broken:
        outcome.stopped = (f"the validator failed while re-judging a stored return, so no "
                           f"call was sent ({plan.broken[0]['message'][:300]}); fix the "
                           "validator and re-run")
        outcome.errors[plan.broken[0]["task_id"]] = [plan.broken[0]]
    elif plan.pending and plan.client is not None:
        jobs = _jobs(rt, calls, spender, plan, progress)
        outcome = jobs.outcome
    elif plan.pending:
        outcome, jobs = _live(rt, calls, spender, plan, progress)
        if calls.split:  # halves made during the run: remember what they saw too
            store.record_seen(window.stored_seen_pairs(store, plan, revision.id, halves=True))
    return outcome, jobs


def _live(rt: Runtime, calls: Plan, spender: Spender, plan: RunPlan,
          progress: Progress) -> tuple[Outcome, JobsOutcome | None]:
    """Live calls of what no unfinished batch job claims; the jobs claiming some, if any."""
    store, claimed, provider = rt.ledger.store, [], GuardedProvider(plan.provider)

    def unclaimed() -> Iterator[Request]:
        for pending in plan.pending.windows():
            held = store.job_holders([r.key for r in pending])
            claimed.extend(r for r in pending if r.key in held)
            yield from (r for r in pending if r.key not in held)

    def replaying() -> tuple[Outcome, Coroutine[Any, Any, Outcome]]:
        replayer = Replayer(calls, rt.ledger, provider, spender, rt.transport, rt.concurrency,
                            on_progress=progress.update, session_id=rt.session_id,
                            pacer=rt.pacer, hosts=rt.hosts, on_wait=progress.wait)
        return replayer.outcome, replayer.run(unclaimed())

    outcome = _replay(rt, plan, provider, progress, replaying)
    held = batches.held_by_jobs(store, claimed)
    if not held.jobs:
        return outcome, None
    outcome.errors.update(held.outcome.errors)
    return outcome, held


def _jobs(rt: Runtime, calls: Plan, spender: Spender, plan: RunPlan,
          progress: Progress) -> JobsOutcome:
    def submitting() -> tuple[Outcome, Coroutine[Any, Any, JobsOutcome]]:
        runner = JobRunner(calls, rt.ledger, plan.provider, plan.client, spender,
                           rt.job_reservations, session_id=rt.session_id, poll=rt.job_poll,
                           on_progress=progress.update, on_wait=progress.wait,
                           alike=AlikeJobs(rt, plan, calls))
        return runner.result.outcome, runner.run(plan.pending.windows, wait=plan.spec.wait)

    return _replay(rt, plan, plan.provider, progress, submitting)


class AlikeJobs:
    """A job of another revision that asked what this run asks (only its validator differed):
    collected by its own rules (:func:`batches.collector`), its answers re-judged by the run's."""

    def __init__(self, rt: Runtime, plan: RunPlan, calls: Plan) -> None:
        self.rt, self.plan, self.calls = rt, plan, calls
        self.judging = judging_of(rt, plan)

    def runner(self, row: Any) -> JobRunner | str:
        return batches.collector(self.rt, row)

    async def rejudge(self, requests: list[Request],
                      broken: list[dict[str, Any]]) -> list[Request]:
        store, keys, calls = self.rt.ledger.store, self.plan.keys, self.calls
        candidates = earlier_candidates(store, requests, seen_of={
            r.key: keys.seen_key(r.tasks_json) for r in requests}, sourceless_of={})
        apart = keys.apart if self.plan.spec.accept == "items" else None
        passed = await self.judging.passing(candidates, broken, apart) if candidates else []
        if passed:
            commit_rechecks(store, calls.batch_id, calls.revision_id, passed, self.plan.source)
        return [request for request, _, _ in passed]


def _replay(rt: Runtime, plan: RunPlan, provider: Any, progress: Progress,
            make: Callable[[], tuple[Outcome, Coroutine[Any, Any, T]]]) -> T:
    """``make``'s transport run on the session's loop; its progress counts resumed tasks done."""
    total = len(plan.content.tasks)

    def start() -> Coroutine[Any, Any, T]:
        outcome, driver = make()
        progress.calls(total, max(0, total - plan.pending_tasks), outcome)
        return driver

    rt.remember_provider(provider)  # the run's guard: its inner provider is kept
    return rt.loop.run(start)


def report(rt: Runtime, plan: RunPlan, revision: Any, outcome: Outcome,
           superseded: str | None = None) -> BatchResult:
    """The one reporter, of a run that sent or one found finished."""
    spec, content, total = plan.spec, plan.content, plan.total
    values, unloadable = result_values(rt.ledger.store, revision.id, content.schema)
    why = (f"no call was made for this task in this run: {outcome.stopped}"
           if outcome.stopped else "no call was made for this task in this run")
    errors = ResultErrors(outcome.errors, values, unloadable,
                          lambda: (t["task_id"] for t in content.tasks), total - len(values), why,
                          outcome.pending, outcome.pending_tasks)
    fields = (lambda: plan.remembered[1]) if plan.remembered else (lambda: content.fields)
    items = spec.mode == "items"  # what the prompt asks to copy; other task fields, if echoed
    echoed = [f for f in compared_candidates(fields, content.identity)
              if f not in content.identity] if items else []
    name, model = provider_names(plan.provider)
    thrown = None if not outcome.thrown_away else ThrownAway(
        outcome.thrown_away, sum(t in outcome.errors for t in outcome.thrown_tasks),
        outcome.thrown_cost, outcome.thrown_tokens, spec.split)
    return BatchResult(
        name=spec.name, status="resolved" if len(values) == total else "unresolved",
        values=values, errors=errors, calls=outcome.calls, tokens=outcome.tokens,
        cost=outcome.cost, revision=revision.number, total_tasks=total,
        accepted_returns=outcome.accepted_returns, rejected_returns=outcome.rejected_returns,
        partial_returns=outcome.partial_returns, provider_errors=outcome.provider_errors,
        resumed=plan.resumed, superseded=superseded,
        attempts_by_task=TaskAttempts(outcome.calls_log), repairs_made=outcome.repairs_made,
        notes=_notes(rt, plan, outcome, superseded) + ([thrown.said()] if thrown else []),
        rechecked=len(plan.rechecked),
        identity_compared=tuple(content.identity) if items else (),
        compared_if_echoed=tuple(echoed), provider=f"{name}/{model}" if model else name,
        thrown_away=thrown, read_receipts=LedgerRead(rt.ledger.attempts, spec.name),
        answer_schema=content.schema.json_schema)


def _notes(rt: Runtime, plan: RunPlan, outcome: Outcome, superseded: str | None) -> list[str]:
    """What a person should know about how the result was reached (what to change next: last)."""
    notes = [outcome.stopped] if outcome.stopped else []
    if outcome.overrun:
        notes.append(
            f"calls billed beyond their reservations: {usd(outcome.overrun)} in this run; "
            f"the session has spent {usd(rt.tally.cost)} of its "
            f"{usd(rt.budget.cost or 0.0)} cost budget (each receipt keeps its usage)")
    if outcome.odd_usage:
        notes.append(f"{outcome.odd_usage} return(s) reported a usage no call can have (not "
                     f"a whole number from 0 to {MOST_TOKENS:,} tokens): the provider's "
                     "error, recorded as unknown on its receipt (a call of unknown cost "
                     "counts against a cost budget at its worst case)")
    if outcome.taken_from_ledger:
        notes.append(f"{outcome.taken_from_ledger} request(s) were resolved by another "
                     "runner of the same content; their values come from the ledger")
    notes += [*plan.provider_notes, *plan.notes]  # how this run's calls were sent, if not as asked
    notes += [superseded] if superseded is not None else []
    if plan.blind:
        notes.append(f"the judging reads what no fingerprint can see ({'; '.join(plan.blind)}): "
                     "stored answers were re-judged under the rules as they are now, not reused "
                     "on trust")
    unknown = plan.content.schema.unknown_keywords
    if unknown:
        notes.append("schema keywords JSON Schema does not define, which no check reads: "
                     + ", ".join(unknown[:5]) + f" and {len(unknown) - 5} more"
                     * (len(unknown) > 5))
    if plan.rechecked:  # an accepted repair's answer is evidence like any other
        repaired = sum(row["kind"] == "repair" for _, row, _ in plan.rechecked)
        notes.append(f"{len(plan.rechecked)} request(s) resolved by re-judging earlier returns "
                     "under the new rules (no calls)"
                     + (f"; {repaired} of them came from repair calls" if repaired else ""))
    return notes


def wanted(progress: bool | None) -> bool:
    """``None``: on where a person watches (a terminal or a Jupyter kernel), off in pipes."""
    if progress is not None:
        return progress
    stderr = sys.stderr
    return bool(getattr(stderr, "isatty", lambda: False)()) or type(
        stderr).__module__.startswith("ipykernel")


def _bar(**options: Any) -> Any:
    """A tqdm.auto bar, without tqdm's warning that the notebook widget is missing."""
    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TqdmWarning)
        from tqdm.auto import tqdm

        return tqdm(unit="task", **options)


class Progress:
    """One run's progress; every method does nothing when it is off."""

    def __init__(self, name: str, progress: bool | None, budget: Budget, tally: Tally) -> None:
        self.name, self.budget, self.tally, self.note = name, budget, tally, ""
        self.outcome: Outcome | None = None  # the run's live counts, once its calls begin
        self.bar = _bar(desc=f"{name}: reading tasks", leave=False,
                        delay=READING_DELAY) if wanted(progress) else None

    @property
    def reading(self) -> Callable[[int], Any] | None:
        """What counts the tasks as they are read and checked (nothing to call when off)."""
        return None if self.bar is None else self.bar.update

    def checking(self) -> None:
        """Every task read: the ledger is looked at before any call."""
        bar = self.bar
        if bar is not None:
            bar.set_description_str(f"{self.name}: {bar.n:,} task(s) read, checking the ledger",
                                    refresh=bar.last_print_t >= bar.start_t + bar.delay)

    def calls(self, total: int, done: int, outcome: Outcome) -> None:
        """The calls begin, ``done`` of ``total`` tasks resolved already."""
        self.outcome = outcome
        if self.bar is not None:
            self.bar.close()  # the reading bar goes; the run's bar takes its line
            self.bar = _bar(desc=self.name, total=total, initial=done, leave=True,
                            postfix=self._counts())

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(self._counts(), refresh=False)
            self.bar.update(n)

    def wait(self, note: str) -> None:
        """What the run waits on (a rate limit, a provider's job); ``""`` when it is over."""
        self.note = note
        if self.bar is not None and self.outcome is not None:
            self.bar.set_postfix_str(self._counts())

    def end(self, result: BatchResult | None) -> None:
        """The last state, coloured by status (``None``: the run raised, shown stopped)."""
        if self.bar is not None and self.outcome is None and result is not None:
            self.calls(result.total_tasks, len(result.values), Outcome())  # nothing was sent
        bar, self.bar, self.note = self.bar, None, ""
        if bar is None or self.outcome is None:  # refused before any call: the error says why
            if bar is not None:
                bar.close()
            return
        status = "stopped" if result is None else result.status
        if result is not None:
            bar.n = len(result.values)
        bar.colour = COLOURS.get(status, "red")
        bar.set_description_str(f"{self.name} {status}", refresh=False)
        bar.set_postfix_str(self._counts(), refresh=False)
        bar.close()

    def _counts(self) -> str:
        outcome = self.outcome
        assert outcome is not None
        cost = "cost unknown" if outcome.cost is None else usd(outcome.cost)
        if self.budget.cost is not None:
            cost += f" (session {usd(self.tally.cost)} of {usd(self.budget.cost)} budget)"
        part = f"{outcome.partial_returns} in part, " if outcome.partial_returns else ""
        said = (f"returns: {outcome.accepted_returns} accepted, {part}"
                f"{outcome.rejected_returns} rejected, {cost}")
        return f"{said}; {self.note}" if self.note else said
