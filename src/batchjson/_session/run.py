"""A run as a pipeline: check, judge with, key, re-judge, plan, record, send, report.

``run_spec(rt, spec)`` is the whole of ``Session.run``: each step is one short function over a
:class:`Run`, the record of what the run has learned so far, and nothing is recorded or spent
before the spec's inputs and the plan's budget and fit have been checked.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._acceptance.validators import droste_verdicts
from .._content.keys import Keys, answer_source
from .._content.tasks import Request
from .._errors import BatchUnresolved
from .._providers.reply import MOST_TOKENS, GuardedProvider, provider_names
from .._replay.budget import Spender, usd
from .._replay.calls import cheapest_call
from .._replay.jobs import JobRunner, JobsOutcome
from .._replay.plan import Outcome, Plan
from .._replay.replay import Replayer
from . import batches, preflight, window
from .errors import ResultErrors
from .fit import check_fit, check_rate_fit
from .registry import ValidatorVersion
from .rejudge import UNSEEN, Judging, clear_sourceless, unseen_token
from .result import BatchResult, TaskAttempts
from .resume import Completed, find_completed, remember_file
from .runtime import Runtime
from .spec import CheckedRun, RunSpec
from .values import result_values


@dataclass
class Run:
    """One run's state, handed from step to step."""

    spec: RunSpec
    content: CheckedRun
    provider: Any
    source: str  # the provider's answer source, part of every key
    version: ValidatorVersion | None = None
    checker: Callable[[Any, Mapping[str, Any]], Any] | None = None
    keys: Keys | None = None
    blind: list[str] = field(default_factory=list)  # judging no fingerprint fully sees
    existing: Any = None  # the revision of this content already on record, if any
    pending: Sequence[Request] = ()  # what calls must resolve (a window.Pending: re-read)
    owed: list[Request] = field(default_factory=list)  # when answers of unknown source exist
    counts: dict[str, int] = field(  # requests, pending ones, their tasks (window.survey)
        default_factory=lambda: dict.fromkeys(("requests", "pending", "pending_tasks"), 0))
    rechecked: list[tuple[Request, Any, dict[str, Any]]] = field(default_factory=list)
    broken: list[dict[str, Any]] = field(default_factory=list)  # a validator_error re-judging
    sourceless_of: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    superseded: str | None = None  # the revision this run's content replaced, said
    provider_notes: list[str] = field(default_factory=list)  # calls not sent as asked, why
    client: Any = None  # the provider's batch API, when the run's transport is "batch"
    jobs: JobsOutcome | None = None  # the batch jobs holding this run's requests


def run_spec(rt: Runtime, spec: RunSpec) -> BatchResult:
    """Resolve every task of ``spec`` or say exactly what is still owed."""
    finished = find_completed(rt, spec)  # a tasks file's finished run: nothing to read
    if finished is not None:
        return report_completed(rt, spec, finished)
    content = spec.checked()  # every input check, before anything is recorded or spent
    provider = rt.provider  # refused here when none is configured
    state = Run(spec, content, provider, answer_source(provider))
    judge_with(rt, state)
    judging = Judging(spec.mode, content.identity, content.schema, state.checker,
                      rt.loop.run)  # how stored answers are judged again
    compose_keys(state)
    done = finished_revision(rt, state)
    if done is not None:  # every request of this content accepted: nothing to plan or send
        return report_completed(rt, spec, done, state)
    find_requests(rt, state, judging)
    window.survey(rt, state, judging)  # earlier returns re-judged, what is owed: no call
    plan, spender = plan_calls(rt, state)
    revision = record_revision(rt, state, plan)
    outcome = send(rt, state, plan, spender, revision)
    if state.sourceless_of:  # imported requests of unknown source this run answered
        clear_sourceless(rt.ledger.store, judging, state.owed, state.sourceless_of,
                         state.source)
    result = report(rt, state, revision, outcome)
    if state.jobs is not None:  # pending while a job holds a request: never BatchUnresolved
        batches.report(result, state.jobs)
    if result.status not in ("resolved", "pending") and spec.on_exhausted == "raise":
        raise BatchUnresolved(result)
    return result


def judge_with(rt: Runtime, state: Run) -> None:
    """The validator's version (registered now, or handed over by the helper that registered
    it a moment ago) and the checker acceptance calls."""
    spec, validator = state.spec, state.spec.validator
    handed = rt.validators.handed_over(validator, spec.validator_name, take=True)
    if validator is None:
        return
    if handed is not None:
        state.version = handed
    else:  # a new version says what changed (its code, a file it reads)
        definition = rt.validators.register(validator, name=spec.validator_name)
        state.version = definition.record
        if definition.kind == "changed":
            state.notes.append(definition.message)
    state.checker = checker_of(state.version, spec.validator_args, rt.transport.timeout)


def checker_of(version: ValidatorVersion, validator_args: str | None,
               timeout: float) -> Callable[[Any, Mapping[str, Any]], Any]:
    """What acceptance calls for a validator version called as ``validator_args`` says."""
    forms = {"index": _index_form, "droste": droste_verdicts}
    checker = version.fn
    if validator_args in forms:
        checker = forms[validator_args](checker)
    return _bounded(checker, timeout)  # an async one may hang


def compose_keys(state: Run) -> None:
    """The run's keys, and what of its judging no fingerprint fully sees."""
    spec, content = state.spec, state.content
    state.keys = Keys.compose(
        content.tasks, content.schema,
        state.version.fingerprint.digest if state.version else "none", spec.pack,
        spec.instructions, content.identity, spec.mode, state.source)
    state.blind = [f"validator: {u}" for u in (state.version.fingerprint.unseen
                                               if state.version else ())
                   ] + [f"schema: {u}" for u in content.schema.unseen]


def finished_revision(rt: Runtime, state: Run) -> Completed | None:
    """The current revision of exactly this content when every request of it is accepted and
    its judging is fully fingerprinted: a resume of tasks from a list or a generator then
    builds no request and reads no key (a tasks file's run is remembered by its bytes)."""
    if state.blind or state.content.file_digest is not None:
        return None
    done = rt.ledger.store.completed_revision(state.spec.name, state.keys.revision)
    if done is None:
        return None
    revision_id, _, leaves = done
    return Completed(rt.ledger.store.revision_by_id(revision_id), leaves,
                     len(state.content.tasks), [], state.content.schema,
                     state.content.identity, state.provider, state.source)


def find_requests(rt: Runtime, state: Run, judging: Judging) -> None:
    """The run's revision when one is on record (its requests are then read from the
    ledger). Judging no fingerprint fully sees moves on to a revision naming the answers that
    no longer pass: it re-judges every accepted request of the revision, so that one step
    holds them all."""
    spec, store = state.spec, rt.ledger.store
    while True:
        state.existing = store.find_revision(spec.name, state.keys.revision)
        if not state.blind:
            return
        token = unseen_token(store, judging, list(window.every_request(store, state)),
                             state.keys.components.get(UNSEEN))
        if token is None:
            return
        state.keys = state.keys.with_part(UNSEEN, token)


def plan_calls(rt: Runtime, state: Run) -> tuple[Plan, Spender]:
    """What the calls are asked to do, refused before spending when the provider cannot do it
    or the budget cannot cover one call per pending request."""
    spec, content = state.spec, state.content
    plan = Plan(batch_id=0, revision_id=0, mode=spec.mode,  # ids set once the revision opens
                identity=content.identity, schema=content.schema, validator=state.checker,
                instructions=spec.instructions, keys=state.keys,
                repairs=rt.repairs if spec.repairs is None else spec.repairs,
                replays=rt.replays if spec.replays is None else spec.replays,
                split=spec.split, source=state.source, reask_refusals=spec.reask_refusals)
    state.provider_notes = check_fit(state.provider, rt.ledger, spec.name, content.schema,
                                     state.pending, content.identity, spec.mode)
    if spec.transport == "batch":  # refused here, before anything is recorded, if it has none
        state.client = batches.client_for(state.provider, rt.ledger.store,
                                          rt.loop.run, rt.used)
        rt.job_schemas[content.schema.fingerprint] = content.schema  # for %batch_status
    spender = Spender(spec.max_calls, rt.budget, rt.tally,
                      batches.pricing(state.provider, state.client),
                      shared=rt.ledger.store.shared_budget())
    if state.client is None:  # live calls are paced; a job has the batch API's own pool
        check_rate_fit(rt.pacer, plan, state.pending, spender.pricing.max_output_tokens)
    if spec.refuse_short_budget and state.client is None:  # a job submits the part that fits
        spender.refuse_if_short(len(state.pending), cheapest_call(
            plan, state.provider, spender.pricing, state.pending))
    return plan, spender


def record_revision(rt: Runtime, state: Run, plan: Plan) -> Any:
    """Open (or resume) the revision, with what its requests saw and the rechecked returns."""
    store, version, name = rt.ledger.store, state.version, state.spec.name
    doc, text = state.content.schema.document  # so an export of it is rechecked whole
    revision, superseded = store.open_revision(  # a new revision's requests: streamed
        name, state.keys.revision, {**state.keys.components, doc: text},
        window.every_request(store, state),
        strict=rt.strict, validator=None if version is None else  # already on record
        {"name": version.name, "version": version.version})
    if superseded is not None:
        state.superseded = (f"revision {superseded.number} superseded "
                            f"({superseded.supersede_reason or 'content changed'})")
        if rt.on_note is not None and state.pending:
            rt.on_note(f"{name}: {state.superseded}; revision {revision.number} runs "
                            f"{len(state.pending)} request(s)")
    if state.content.file_digest is not None:  # so a finished run of it resumes unread
        remember_file(store, state.content.file_digest, state.keys.components["tasks"],
                      state.content.tasks)
    if state.existing is None or state.pending or state.rechecked:  # else on record already
        store.record_seen(window.seen_pairs(store, state))
    if state.rechecked:
        store.commit_rechecks(revision.batch_id, revision.id, state.rechecked, state.source)
    plan.batch_id, plan.revision_id = revision.batch_id, revision.id
    return revision


def send(rt: Runtime, state: Run, plan: Plan, spender: Spender, revision: Any) -> Outcome:
    """The calls: none when the validator broke on a stored return (it would break on theirs)."""
    store, outcome = rt.ledger.store, Outcome()
    if state.pending and state.broken:
        outcome.stopped = (f"the validator failed while re-judging a stored return, so no "
                           f"call was sent ({state.broken[0]['message'][:300]}); fix the "
                           "validator and re-run")
        outcome.errors[state.broken[0]["task_id"]] = [state.broken[0]]
    elif state.pending and state.client is not None:
        state.jobs = _jobs(rt, plan, spender, state)
        outcome = state.jobs.outcome
    elif state.pending:
        outcome = _live(rt, plan, spender, state)
        if plan.split:  # halves made during the run: remember what they saw too
            store.record_seen(window.stored_seen_pairs(store, state, revision.id, halves=True))
    return outcome


def _live(rt: Runtime, plan: Plan, spender: Spender, state: Run) -> Outcome:
    """The live calls, of what no unfinished batch job claims (a job may still answer it),
    fed to the replay loop a window at a time."""
    store, claimed = rt.ledger.store, []

    def unclaimed() -> Iterator[Request]:
        for pending in state.pending.windows():
            held = store.job_held_keys([r.key for r in pending])
            claimed.extend(r for r in pending if r.key in held)
            yield from (r for r in pending if r.key not in held)

    outcome = _replay(rt, plan, GuardedProvider(state.provider), spender, state,
                      unclaimed())
    held, _ = batches.held_by_jobs(store, claimed)
    if held.jobs:
        state.jobs = held
        outcome.errors.update(held.outcome.errors)
    return outcome


def _jobs(rt: Runtime, plan: Plan, spender: Spender, state: Run) -> JobsOutcome:
    """Submit, poll and collect the run's batch jobs (one pass, or until they end)."""
    def drive(on_progress: Any) -> Any:
        runner = JobRunner(plan, rt.ledger, state.provider, state.client, spender,
                           rt.job_reservations, session_id=rt.session_id,
                           poll=rt.job_poll, on_progress=on_progress)
        return runner.run(state.pending.windows, wait=state.spec.wait)

    return _replay(rt, plan, state.provider, spender, state, (), drive,
                   progress=state.spec.progress if state.spec.wait else False)


def _replay(rt: Runtime, plan: Plan, provider: Any, spender: Spender, state: Run,
            pending: Iterable[Request], drive: Any = None, progress: Any = None) -> Any:
    """Run the pending requests (``drive``: as batch jobs); a progress bar counts every task
    of the batch, those resumed from the ledger already done (2000/2000 at the end, as tqdm
    users expect)."""
    name = state.spec.name
    progress = state.spec.progress if progress is None else progress
    total = len(state.content.tasks)
    bar = None
    done = max(0, total - state.counts["pending_tasks"])
    if callable(progress):  # a face's own bar (a notebook widget): progress(total, name)
        bar = progress(total, name)
        if done:
            bar.update(done)
    elif progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=done, desc=name, unit="task", leave=True)
    rt.remember_provider(provider)  # the run's guard: its inner provider is kept

    async def go() -> Any:
        if drive is not None:
            return await drive(bar.update if bar else None)
        replayer = Replayer(plan, rt.ledger, provider, spender, rt.transport,
                            rt.concurrency, on_progress=bar.update if bar else None,
                            session_id=rt.session_id, pacer=rt.pacer,
                            hosts=rt.hosts, on_wait=getattr(bar, "set_postfix_str", None))
        return await replayer.run(pending)

    try:
        return rt.loop.run(go)
    finally:
        if bar is not None:
            bar.close()


def report(rt: Runtime, state: Run, revision: Any, outcome: Outcome) -> BatchResult:
    """The result, with a note for each thing a person should know about how it was reached."""
    spec, content = state.spec, state.content
    result = _result(rt, spec.name, revision, len(content.tasks),
                     lambda: (t["task_id"] for t in content.tasks), content.schema, outcome,
                     resumed=state.counts["requests"] - state.counts["pending"]
                     - len(state.rechecked))
    result.rechecked = len(state.rechecked)
    return _described(result, state, content.tasks)


def report_completed(rt: Runtime, spec: RunSpec, done: Completed,
                     judged: Run | None = None) -> BatchResult:
    """The result of a finished revision found without building its requests: its values
    from the ledger, its validator registered as a full run registers it (``judged``: the run
    that registered it already)."""
    state = judged or Run(spec, CheckedRun(spec, [], [], done.schema, done.identity),
                          done.provider, done.source)
    if judged is None:
        judge_with(rt, state)
    state.provider_notes = check_fit(done.provider, rt.ledger, spec.name, done.schema, [],
                                     done.identity, spec.mode)
    result = _result(rt, spec.name, done.revision, done.count, tuple, done.schema,
                     Outcome(), resumed=done.leaves)
    result = _described(result, state, state.content.tasks if judged is not None else
                        [dict.fromkeys(done.fields)])
    if result.status != "resolved" and spec.on_exhausted == "raise":  # a value not loading
        raise BatchUnresolved(result)
    return result


def _described(result: BatchResult, state: Run,
               tasks: Sequence[Mapping[str, Any]]) -> BatchResult:
    """What the run compared (``tasks``: whose fields an item may echo) and its notes."""
    spec, identity = state.spec, state.content.identity
    if spec.mode == "items":  # what the prompt asks to copy; other task fields, if echoed
        result.identity_compared = tuple(identity)
        result.compared_if_echoed = tuple(f for f in preflight.compared_candidates(
            tasks, identity) if f not in identity)
    name, model = provider_names(state.provider)
    result.provider = f"{name}/{model}" if model else name
    result.notes += state.provider_notes  # how this run's calls were sent, when not as asked
    result.notes.extend(state.notes)
    if state.superseded is not None:
        result.superseded = state.superseded
        result.notes.append(state.superseded)
    if state.blind:
        result.notes.append(f"the judging reads what no fingerprint can see ("
                            f"{'; '.join(state.blind)}): stored answers were re-judged under "
                            "the rules as they are now, not reused on trust")
    unknown = state.content.schema.unknown_keywords
    if unknown:
        result.notes.append("schema keywords JSON Schema does not define, which no check reads: "
                            + ", ".join(unknown[:5]) + f" and {len(unknown) - 5} more"
                            * (len(unknown) > 5))
    if state.rechecked:  # an accepted repair's answer is evidence like any other
        repaired = sum(row["kind"] == "repair" for _, row, _ in state.rechecked)
        result.notes.append(f"{len(state.rechecked)} request(s) resolved by re-judging earlier "
                            "returns under the new rules (no calls)" + (
                                f"; {repaired} of them came from repair calls" if repaired
                                else ""))
    return result


def _result(rt: Runtime, name: str, revision: Any, total: int,
            task_ids: Callable[[], Iterable[str]],
            schema: Any, outcome: Outcome, resumed: int) -> BatchResult:
    """The result over the revision's values in the ledger; ``task_ids`` (every task in
    order, each time it is called) is read only when some task has no value."""
    values, errors = _values(rt, revision.id, total, task_ids, schema, outcome)
    result = BatchResult(
        name=name, status="resolved" if len(values) == total else "unresolved",
        values=values, errors=errors, calls=outcome.calls, tokens=outcome.tokens,
        cost=outcome.cost, revision=revision.number, total_tasks=total,
        accepted_returns=outcome.accepted_returns, rejected_returns=outcome.rejected_returns,
        provider_errors=outcome.provider_errors, resumed=resumed,
        attempts_by_task=TaskAttempts(outcome.calls_log),
        repairs_made=outcome.repairs_made)
    if outcome.stopped:
        result.notes.append(outcome.stopped)
    if outcome.overrun:
        result.notes.append(
            f"calls billed beyond their reservations: {usd(outcome.overrun)} in this run; "
            f"the session has spent {usd(rt.tally.cost)} of its "
            f"{usd(rt.budget.cost or 0.0)} cost budget (each receipt keeps its usage)")
    if outcome.odd_usage:
        result.notes.append(f"{outcome.odd_usage} return(s) reported a usage no call can have (not "
                            f"a whole number from 0 to {MOST_TOKENS:,} tokens): the provider's "
                            "error, recorded as unknown on its receipt (a call of unknown cost "
                            "counts against a cost budget at its worst case)")
    if outcome.taken_from_ledger:
        result.notes.append(f"{outcome.taken_from_ledger} request(s) were resolved by another "
                            "runner of the same content; their values come from the ledger")
    return result


def _values(rt: Runtime, revision_id: int, total: int, task_ids: Callable[[], Iterable[str]],
            schema: Any, outcome: Outcome) -> tuple[Mapping[str, Any], ResultErrors]:
    """The revision's values, read from the ledger when asked for, and an error for every
    task without one, built when read."""
    values, unloadable = result_values(rt.ledger.store, revision_id, schema)
    why = (f"no call was made for this task in this run: {outcome.stopped}"
           if outcome.stopped else "no call was made for this task in this run")
    return values, ResultErrors(outcome.errors, values, unloadable, task_ids,
                                total - len(values), why, outcome.pending,
                                outcome.pending_tasks)


def _bounded(fn: Callable[[Any, Mapping[str, Any]], Any],
             seconds: float) -> Callable[[Any, Mapping[str, Any]], Any]:
    """The validator, with an ``async def`` one bounded by the session's timeout: one that never
    returns becomes a ``validator_error`` instead of holding the run forever."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        out = fn(value, task)
        return _within(out, seconds) if inspect.isawaitable(out) else out

    return check


async def _within(awaitable: Any, seconds: float) -> Any:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise TimeoutError(f"the async validator did not return within {seconds:g}s (the "
                           "session's timeout=)") from None


def _index_form(fn: Callable[[Any, int], Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    """droste validators take (value, index); acceptance hands (value, task)."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        return fn(value, task["index"])

    return check
