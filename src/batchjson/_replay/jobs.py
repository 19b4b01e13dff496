"""The batch transport: a run's pending requests as provider batch jobs, each recorded before
upload, its lines settled by the same step (``settle.py``) as a live return. Lines join receipts by
``custom_id`` only: an unknown, missing or duplicated id is named, never admitted."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, islice, takewhile
from typing import Any, Protocol

from .._checks import is_amount
from .._content.keys import Keys
from .._content.tasks import Request
from .._errors import LedgerError, ProviderError
from .._ledger import Ledger
from .._ledger.records import now
from .._ledger.store_calls import Owner
from .._ledger.store_jobs import OPEN_STATES
from .._providers.base import Call, Reply, estimate_tokens, input_bound
from .._providers.batch_client import NOT_UTF8, Upload
from .._providers.reply import received
from .._providers.settings import declared_output_cap
from .._sources import TRUNCATED
from .budget import Spender
from .groupcommit import committed
from .plan import Outcome, Plan, make_call, system_prompt
from .settle import (
    HALVE,
    NONE,
    Attempt,
    Settle,
    Tried,
    fail,
    next_attempt,
    rest_tried,
    usage_of,
)

WINDOW = 1000  # requests read from the ledger, or output lines judged, together


class Alike(Protocol):
    """What a run's session does for it with a job that asked what the run asks under other
    rules (another validator's revision): collect it by its own, then re-judge on its answers."""

    def runner(self, row: Mapping[str, Any]) -> JobRunner | str:
        """A runner collecting job ``row`` by its revision's rules, or why none can here."""

    async def rejudge(self, requests: Sequence[Request],
                      broken: list[dict[str, Any]]) -> list[Request]:
        """Of ``requests``, those a stored answer passes now, committed as rechecks; a
        validator crash ends it, added to ``broken``."""


Windows = Callable[[], Iterable[Sequence[Request]]]  # a run's pending requests, anew each call
Owed = tuple[Request, str, str]  # a request, and the kind and prompt of its next attempt

RECORD_CREATED_WAITS = (0.1, 0.5, 1.0, 2.0)  # waits before a job id is written again


@dataclass
class JobsOutcome:
    """The run's counters, and every job still holding one of its requests."""

    outcome: Outcome
    jobs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    submitted: int = 0


class JobRunner(Settle):
    """Submits, polls and collects the jobs of one run of one batch revision."""

    splits = False

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, client: Any,
                 spender: Spender, reservations: dict[int, float], *, session_id: str,
                 poll: float = 1.0, on_progress: Callable[[int], None] | None = None,
                 on_wait: Callable[[str], Any] | None = None,
                 alike: Alike | None = None) -> None:
        super().__init__(plan, ledger.store, provider, spender, Outcome())
        self.revisions = ledger.revisions
        # a job asking what this run asks under other rules: a runner judging by its own, or why
        # this kernel has none (its validator is not registered here); and the re-judging of
        # this run's requests on stored answers, once such a job is collected
        self.alike = alike
        self.rejudge_owed = False  # such a job was collected: re-judge before any submission
        self.own_rules: dict[int, bool] = {}  # revision id -> its requests keyed as this run's
        self.charges: list[tuple[Any, ...]] | None = None  # a collection's, until it commits
        self.held_alike: dict[str, int] = {}  # request key -> the job of other rules holding it
        self.job_rows: dict[int, Any] = {}  # the jobs it met, as first read
        self.client, self.session_id, self.poll = client, session_id, poll
        self.where = ledger.where  # named by an error that must lead a person to the ledger
        self.reservations = reservations  # attempt id -> worst case this session reserved
        self.on_progress, self.on_wait = on_progress, on_wait  # on_wait: it waits on jobs
        self.result = JobsOutcome(self.outcome)
        self.chunk = client.max_requests  # lines per job; halved after token_limit_exceeded
        self.watched: set[int] = set()  # ids of the unfinished jobs holding a request of it
        self.unreadable: set[int] = set()
        self.stopped: set[int] = set()  # jobs a person cancelled while this run ran
        self.cancelled_before: set[int] = set()  # ... and those asked to cancel before it
        self.short = False  # a submission stopped short: the next pass looks at every request
        self.given_up: set[str] = set()  # requests this run reported given up (Settle.give_up)
        self.judged: set[str] = set()  # requests this run judged a return of
        self.repairs: dict[int, int] = {}  # repair lines of each job recorded, until it is sent
        self.unfunded: dict[str, str] = {}  # requests the budget could not send now: why
        self._system = system_prompt(plan)

    async def run(self, windows: Windows, *, wait: bool) -> JobsOutcome:
        """Submit, poll and collect; ``windows()`` gives the pending requests anew each call."""
        self.windows = windows
        # what was on record when the run began: which receipts are this run's chain (_chain)
        at_start = self.store.jobs()
        self.open_at_start = {row["id"] for row in at_start}
        self.cancelled_before = {row["id"] for row in at_start
                                 if "cancel_requested_at" in detail_of(row)}
        # the revision's own jobs too: what one holds may be accepted another way meanwhile (an
        # import, a merge), and what the provider ran is collected all the same
        self.watched.update(row["id"] for row in at_start if row["revision_id"] ==
                            self.plan.revision_id and row["protocol"] == self.client.protocol)
        self.watermark = self.store.last_attempt_id()
        writer = Owner.start(self.session_id)
        try:
            rescan = True  # look at every request: the first pass, or one cut short
            while True:
                if rescan:
                    rescan = await self._submit_over(windows(), writer)
                ended = await self._collect_ended()
                if self.rejudge_owed:  # its answers first: what they resolve is not asked,
                    await self._rejudge(windows())  # what they leave is submitted now
                    rescan = True
                    continue
                if ended:  # follow-ups of what they held
                    rescan = await self._submit_over(self._held_by(ended), writer) or rescan
                running = [row for row in self._open_rows() if row["status"] in (
                    "open", "recording") and row["id"] not in self.unreadable]
                if not wait or not running:
                    break
                if self.on_wait is not None:
                    self.on_wait(f"waiting on {len(running)} provider batch job(s)")
                await asyncio.sleep(self.poll)
        finally:
            writer.stop()
        self._unresolved()
        return self.result

    async def collect(self, keys: list[str]) -> JobsOutcome:
        """Only collect the ended jobs holding ``keys`` (``%batch_status``): nothing is sent."""
        self.watched.update(self.store.job_holders(keys).values())
        await self._collect_ended()
        self.result.jobs = [job_view(row) for row in self._open_rows()]
        return self.result

    def _owed(self, window: Sequence[Request]) -> list[Owed]:
        """Each request of ``window`` neither accepted nor held by a job, while allowed."""
        holders, done, history = self.store.job_window(
            [r.key for r in window] + [r.parent_key for r in window if r.parent_key is not None],
            self.plan.revision_id)
        self.watched.update(holders.values())
        self.held_alike.update((key, job) for key, job in holders.items()
                               if not self._keyed_here(self._job_row(job)))
        free = [r for r in window if r.key not in done
                and self.held_alike.get(r.key) not in self.stopped]  # owed to the next run
        tried, stopped, parted = self.store.attempts_so_far([r.key for r in free])
        if parted:  # accepted in part before (another revision, a batch): its parts instead
            free = self._apart(free, parted)
        cut = {key for key, stops in stopped.items() if TRUNCATED in stops}
        owed = []
        for request in free:
            rows = self._chain(request, _receipts(request, history))
            if rows and rows[-1]["job_id"] in self.stopped:  # owed to the next run
                continue
            past = self._tried(request, rows)
            step = next_attempt(self.plan, request, past, tried=request.key in tried,
                                cut_off=request.key in cut)
            if step.kind not in (HALVE, NONE):
                owed.append((request, step.kind, step.prompt))
            else:  # jobs never halve: a HALVE gives up too
                self.give_up(request, step, past)
                self.given_up.add(request.key)
        return owed

    def _apart(self, window: Sequence[Request], parted: Mapping[str, list[str]]
               ) -> list[Request]:
        """``window``, each request accepted in part before replaced by its parts still owed."""
        out: list[Request] = []
        for request in window:
            if request.key not in parted:
                out.append(request)
                continue
            parts = self.plan.keys.apart(request, parted[request.key])
            self.store.record_split(self.plan.revision_id, request, parts)
            holders, done, _ = self.store.job_window([p.key for p in parts],
                                                     self.plan.revision_id)
            self.watched.update(holders.values())  # the rest, sent in a job meanwhile
            out += [p for p in parts if p.key not in done]
        return out

    def _chain(self, request: Request, rows: Sequence[Mapping[str, Any]]
               ) -> Sequence[Mapping[str, Any]]:
        """This run's chain of a request's job receipts: those since its allowance was used up
        before the run began, by receipts of no job open then (a resumed run's own), else all."""
        settled = [r for r in rows if r["id"] <= self.watermark
                   and r["job_id"] not in self.open_at_start]
        if settled and next_attempt(self.plan, request, self._tried(request, settled),
                                    tried=True).kind in (HALVE, NONE):
            return [r for r in rows if r["id"] > settled[-1]["id"]]
        return rows

    @staticmethod
    def _tried(request: Request, rows: Sequence[Mapping[str, Any]]) -> list[Tried]:
        """Receipts ``rows`` as the chain :func:`next_attempt` reads."""
        return [rest_tried(r["kind"], r["raw"], request, json.loads(r["errors"]))
                if r["status"] == "partial" else
                Tried(r["kind"], json.loads(r["errors"] or "[]"), r["raw"]) for r in rows]

    async def _submit_over(self, windows: Iterable[Sequence[Request]], writer: Owner) -> bool:
        """Submit what ``windows`` owe, holding one job's worth at a time: whether it stopped short
        (the budget, a failed upload), so that the next pass looks at every request again."""
        owed: list[Owed] = []
        self.short = False
        for window in chain(windows, [None]):  # None: the windows ended, the rest goes too
            if window is not None:
                owed += self._owed(window)
            while owed and not self.halted and (window is None or len(owed) >= self.chunk):
                sent, unsent = await self._submit(owed[:self.chunk], writer)
                if not sent:
                    return True
                owed = unsent + owed[self.chunk:]
        return self.short

    def _held_by(self, jobs: Sequence[int]) -> Iterator[list[Request]]:
        """The requests the ended ``jobs`` held, read a window of one job's keys at a time."""
        for job_id in jobs:
            keys = [line["request_key"] for line in self.store.job_lines(job_id)]
            for start in range(0, len(keys), WINDOW):
                yield list(self.store.requests_by_keys(keys[start:start + WINDOW],
                                                       self.plan.revision_id).values())

    async def _submit(self, owed: list[Owed], writer: Owner) -> tuple[bool, list[Owed]]:
        """Record one job, then upload and create it: whether more may be sent, and the
        requests past the provider's upload ceiling, for the next job."""
        with closing(Upload(*self.client.frame)) as body:  # none: a ConfigError, unrecorded
            counts = self.store.attempts_so_far([r.key for r, _, _ in owed])[0]
            calls = [make_call(self.plan, self._system, r, kind, prompt, counts.get(r.key, 0))
                     for r, kind, prompt in owed]
            fit = self.client.lines_that_fit(calls)
            owed, unsent, calls = owed[:fit], owed[fit:], calls[:fit]
            reserved = self._reserve(calls)
            if not reserved:
                return False, []
            held = len(reserved)
            job = self._record(body, owed[:held], calls[:held], reserved, writer)
            del calls  # the upload is on disk while it is sent
            if job is None:  # none of them was free: more may be sent
                return True, unsent
            return await self._send(body, *job), unsent

    def _reserve(self, calls: list[Call]) -> list[float]:
        """The worst case of each of ``calls`` the budget holds, from the first."""
        bounds = [input_bound(self.provider, c) if self.spender.costed else 0 for c in calls]
        reserved = list(takewhile(lambda worst: worst is not None, (
            self.spender.reserve(bound, alone=False) for bound in bounds)))
        if len(reserved) < len(calls):
            self.short = True
            self.unfunded.update((c.request_key, self.spender.shortfall(bound)) for c, bound in
                                 zip(calls[len(reserved):], bounds[len(reserved):], strict=True))
            self.result.notes.append(
                f"{len(calls) - len(reserved)} request(s) were not submitted: the budget "
                f"holds the worst case of {len(reserved)} of {len(calls)}; raise it and re-run")
        return reserved

    def _record(self, body: Upload, owed: list[Owed], calls: list[Call], reserved: list[float],
                writer: Owner) -> tuple[int, str, list[int]] | None:
        """Record a job of ``owed``, its lines into ``body``: its id, uid and receipts, if any."""
        plan, store = self.plan, self.store
        uid = uuid.uuid4().hex
        job_id, written = store.open_job(
            uid=uid, protocol=self.client.protocol, batch_id=plan.batch_id,
            revision_id=plan.revision_id, model=getattr(self.provider, "model", None),
            endpoint=self.client.endpoint, provider=getattr(self.provider, "name", None),
            source=plan.source, writer=writer, shared=self.spender.shared is not None,
            plan=plan_facts(plan), lines=[
                (r, kind, self.client.line("", c)[1], worst,
                 estimate_tokens(self._system + c.prompt))
                for (r, kind, _), c, worst in zip(owed, calls, reserved, strict=True)])
        by_key = {w["request_key"]: w for w in written}
        if len(written) < len(owed):  # the jobs that took them are watched too
            self.short = True
            self.watched.update(store.job_holders(
                [r.key for r, _, _ in owed if r.key not in by_key]).values())
            self.result.notes.append(
                f"{len(owed) - len(written)} request(s) were not submitted: accepted or "
                "claimed by another runner meanwhile, or past the ledger's own cost budget")
        for (request, _, _), call, worst in zip(owed, calls, reserved, strict=True):
            mine = by_key.get(request.key)
            if mine is None:  # nothing is sent for it
                self.spender.release(worst)
                continue
            self.unfunded.pop(request.key, None)  # sent after all: its shortfall is past
            self.reservations[mine["attempt_id"]] = worst
            body.add(json.dumps(self.client.line(mine["custom_id"], call)[0],
                                separators=(",", ":")))  # to its file
        if job_id is None:
            return None
        self.watched.add(job_id)
        self.repairs[job_id] = sum(kind == "repair" for r, kind, _ in owed if r.key in by_key)
        return job_id, uid, [w["attempt_id"] for w in written]

    async def _send(self, body: Upload, job_id: int, uid: str, attempts: list[int]) -> bool:
        """Upload and create a recorded job. A failure before the provider could have created
        it cancels the job's receipts (never sent); any other leaves the job uncertain."""
        try:
            file_id = await self._renewing(job_id, self.client.upload(body))
        except ProviderError as exc:
            self._unsent(job_id, attempts, f"the input file could not be uploaded ({exc})")
            return False
        now_row = self._row(job_id)
        if now_row["status"] == "cancelled" or "cancel_requested_at" in detail_of(now_row):
            self.stopped.add(job_id)  # nothing created: its requests wait for the next run
            self._unsent(job_id, attempts, "a person cancelled it before it was created")
            return False
        try:
            batch = await self._renewing(job_id, self.client.create(
                file_id, {"batchjson_job": uid}))
        except ProviderError as exc:
            if exc.refused:
                self._unsent(job_id, attempts, f"the provider refused the job ({exc})")
            else:
                self.store.note_job(job_id, {"why": f"creating the job failed without an answer "
                                             f"({exc}); it may exist and be billed"},
                                    uncertain=True)
            return False
        self.outcome.repairs_made += self.repairs.pop(job_id, 0)  # sent: the job exists
        if await self._record_created(job_id, str(batch["id"]), {
                "input_file_id": file_id, "provider_status": batch.get("status")}):
            await self._cancel_asked(self._row(job_id))  # asked for meanwhile
        else:
            self.result.submitted += body.lines
        return True

    async def _record_created(self, job_id: int, provider_job_id: str,
                              detail: Mapping[str, Any]) -> bool:
        """The provider's id for a job it created and bills: the one record that cannot be
        made again later, so a failing write (a full disk) is tried again for a while, and if it
        never lands the error names the id, for a person to cancel or collect it."""
        for wait in (*RECORD_CREATED_WAITS, None):
            try:
                return self.store.job_submitted(job_id, provider_job_id, detail)
            except LedgerError as exc:
                failure = exc
            if wait is None:
                break
            await asyncio.sleep(wait)
        raise LedgerError(
            f"the provider created batch job {provider_job_id} (billed), but its id could not be "
            "recorded; free the ledger's disk and run again, or cancel the job at the provider "
            "by that id", path=self.where, cause=failure.cause or failure) from failure

    async def _renewing(self, job_id: int, awaitable: Any) -> Any:
        """``awaitable``, the job's lease renewed meanwhile (no other host takes it for lost)."""
        async def renew() -> None:
            while True:
                await asyncio.sleep(self.store.lease_seconds / 3)
                self.store.renew_job(job_id)

        renewer = asyncio.ensure_future(renew())
        try:
            return await awaitable
        finally:
            renewer.cancel()

    def _unsent(self, job_id: int, attempts: list[int], why: str) -> None:
        for attempt_id in attempts:
            worst = self.reservations.pop(attempt_id, None)
            if worst is not None:
                self.spender.release(worst)
        self.store.cancel_job(job_id, why, sent=False)
        self.watched.discard(job_id)  # never sent: owed again at the next pass's look
        self.result.notes.append(f"job {job_id} was not submitted: {why}")

    def _unresolved(self) -> None:
        """The jobs still holding a request of the run, and each request neither accepted nor
        held by a job: why the budget left it unsent, else the errors of its last receipt."""
        store, out, revision = self.store, self.outcome, self.plan.revision_id
        jobs = {row["id"]: row for row in store.jobs()}
        for window in self.windows():  # as leaves: a request may be split meanwhile
            window = list(store.requests_by_keys([r.key for r in window], revision).values())
            holders, _, history = store.job_window([r.key for r in window] + [
                r.parent_key for r in window if r.parent_key is not None], revision)
            self.watched.update(holders.values())
            for request in window:
                rows = _receipts(request, history)
                if request.key in holders:  # pending: their errors are built when read
                    job = jobs.get(holders[request.key])
                    where = (f"job {job['id']} ({job['provider_job_id'] or 'no provider id'}, "
                             f"{job['status']})" if job else "a batch job")
                    out.pending.append(json.dumps({"request": request.key, "where": where,
                                                   "task_ids": list(request.task_ids)}))
                    out.pending_tasks += len(request.task_ids)
                elif request.key in self.unfunded:
                    self.out_of_budget(request, self.unfunded[request.key])
                elif rows and request.key not in self.given_up and (
                        not self.halted or self.judged & {request.key, request.parent_key}):
                    last = self._tried(request, rows[-1:])[0]  # halted: as live
                    fail(out, request, list(last.errors), last.raw)
        self.result.jobs = [job_view(row) for row in self._open_rows()]

    def _row(self, job_id: int) -> Any:
        return self.store.jobs(job=str(job_id))[0]

    def _open_rows(self) -> list[Any]:
        """The watched jobs still unfinished (those that ended are no longer watched)."""
        rows = [row for row in self.store.jobs() if row["id"] in self.watched]
        self.watched = {row["id"] for row in rows}
        return rows

    async def _collect_ended(self) -> list[int]:
        """Poll the watched jobs, collecting those that ended: the ids of all no longer open."""
        for row in self.store.jobs(lost=True):
            if row["id"] not in self.watched or row["protocol"] != self.client.protocol:
                continue
            if row["status"] == "uncertain" and row["provider_job_id"] is None:
                row = await self._recover(row)
            if row["status"] != "open":
                continue
            if "cancel_requested_at" in detail_of(row):
                await self._cancel_asked(row)
                row = self._row(row["id"])  # what it recorded
            try:
                batch = await self.client.poll(row["provider_job_id"])
                status = self.client.status(batch)
                note = {"provider_status": status, "counts": self.client.counts(batch)}
                if status not in self.client.running:
                    if self._keyed_here(row):
                        await self._collect(row, batch, {**detail_of(row), **note})
                    else:
                        await self._collect_alike(row)
                    continue
            except ProviderError as exc:  # the job stays open: the next run looks again
                final = not exc.retryable and exc.refused
                if final:  # asking again will not help: no wait for it (see JobRunner.run)
                    self.unreadable.add(row["id"])
                self.result.notes.append(f"{named(row)} could not be read this time: {exc}" + (
                    "; the wait for it ends, and it stays open for a later run or %batch_status "
                    "to collect" if final else ""))
                continue
            self.store.note_job(row["id"], note)
        gone = sorted(self.watched - {row["id"] for row in self._open_rows()})
        if self.alike is not None and any(not self._keyed_here(self._job_row(job_id))
                                          for job_id in gone):
            self.rejudge_owed = True  # its answers are on record, whoever collected them
        for job_id in gone:
            if job_id not in self.cancelled_before and (
                    self._row(job_id)["status"] == "cancelled"):
                self.stopped.add(job_id)
                self.result.notes.append(
                    f"job {job_id} was cancelled while this run watched it: none of its "
                    "requests is sent again by this run; the next run you start owes them")
        return [job_id for job_id in gone if job_id not in self.stopped]

    def _job_row(self, job_id: int) -> Any:
        """Job ``job_id`` as first read (what it was recorded for does not change)."""
        if job_id not in self.job_rows:
            self.job_rows[job_id] = self._row(job_id)
        return self.job_rows[job_id]

    def _keyed_here(self, row: Mapping[str, Any]) -> bool:
        """Whether job ``row``'s requests were keyed by this run's rules (its revision's, or one
        differing only in its tasks), so that this run judges its lines."""
        revision_id = row["revision_id"]
        if revision_id not in self.own_rules:
            [revision] = self.revisions(revision_id=revision_id)
            self.own_rules[revision_id] = (revision_id == self.plan.revision_id or Keys(
                revision.components).content == self.plan.keys.content)
        return self.own_rules[revision_id]

    async def _collect_alike(self, row: Mapping[str, Any]) -> None:
        """An ended job that asked what this run asks under other rules (another validator):
        collected by its own, as ``%batch_status`` would; its answers are then re-judged here."""
        if self.alike is None:  # a collection of given jobs (%batch_status): each by its own
            return
        runner = self.alike.runner(row)
        if isinstance(runner, str):
            if row["id"] not in self.unreadable:
                self.unreadable.add(row["id"])  # no wait for it: it stays open
                self.result.notes.append(
                    f"{named(row)} asked what this run asks, under another revision's rules, "
                    f"and was not collected here: {runner}; its requests are not sent again "
                    f"while it is open: re-run its cell to collect it, or `batchjson cancel "
                    f"{row['id']}` to send them again")
            return
        runner.watched = {row["id"]}
        await runner._collect_ended()
        self.result.notes += [n for n in runner.result.notes if n not in self.result.notes]
        self.unreadable |= runner.unreadable & {row["id"]}  # no wait for it either
        if runner.outcome.overrun:  # a line billed beyond its reservation: the budget stops
            self.outcome.overrun += runner.outcome.overrun
            self.outcome.stopped = self.outcome.stopped or runner.spender.stopped
        if self._row(row["id"])["status"] not in OPEN_STATES:  # else looked at again later
            self.result.notes.append(f"{named(row)} asked what this run asks, under another "
                                     "revision's rules: collected by those")

    async def _rejudge(self, windows: Iterable[Sequence[Request]]) -> None:
        """This run's requests that no job holds, none accepted and none answered in part,
        re-judged on the answers on record (a job of other rules just ended, collected here or
        elsewhere): what passes is accepted, free. A validator crash stops the run, as it does
        at planning: nothing more is sent."""
        assert self.alike is not None  # only a run given one watches such a job
        self.rejudge_owed, resolved, broken = False, 0, []
        for window in windows:
            _, done, _ = self.store.job_window([r.key for r in window], self.plan.revision_id)
            free = [r for r in window if r.key not in done]
            parted = self.store.attempts_so_far([r.key for r in free])[2]  # its parts are owed
            for request in await self.alike.rejudge(
                    [r for r in free if r.key not in parted], broken):
                resolved += 1
                if self.on_progress is not None:
                    self.on_progress(len(request.tasks))
            if broken:
                self._broken(broken[0])
                break
        if resolved:
            self.result.notes.append(f"{resolved} request(s) resolved by re-judging the "
                                     "answers of a job of another revision (no calls)")

    def _broken(self, crash: Mapping[str, Any]) -> None:
        """The validator crashed on a stored answer: the run sends nothing more."""
        self.halted = self.halted or (
            f"the validator failed while re-judging a stored return, so no further call was "
            f"sent ({str(crash['message'])[:300]}); fix the validator and re-run")
        self.outcome.stopped = self.outcome.stopped or self.halted
        self.outcome.errors[crash["task_id"]] = [dict(crash)]

    async def _cancel_asked(self, row: Mapping[str, Any]) -> None:
        """A job a person asked to cancel while its writer was creating it (or released
        meanwhile) is cancelled at the provider once its id is known, and that is recorded."""
        detail = detail_of(row)
        if row["id"] not in self.cancelled_before:
            self.stopped.add(row["id"])
        if "cancel_sent_at" in detail:
            return
        try:
            batch = await self.client.cancel(row["provider_job_id"])
        except ProviderError as exc:
            self.result.notes.append(f"{named(row)} was cancelled by a person while it was "
                                     "created, but the provider could not be asked to cancel "
                                     f"it: {exc}")
            return
        self.store.note_job(row["id"], {"cancel_sent_at": now(),
                                        "provider_status": self.client.status(batch)})
        self.result.notes.append(f"{named(row)} was cancelled at the provider, as a person "
                                 "asked while it was being created")

    async def _recover(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        """An uncertain job found at the provider by its creation uid is recorded open."""
        try:
            batch = await created_batch(self.client, row)
        except ProviderError as exc:
            self.result.notes.append(f"job {row['id']} is uncertain and the provider's jobs "
                                     f"could not be listed to find it this time: {exc}")
            return row
        if batch is None:
            return row
        self.store.job_submitted(row["id"], str(batch["id"]), {
            "input_file_id": batch.get("input_file_id"),
            "provider_status": batch.get("status"),
            "recovered": "found at the provider by the uid it was created with"})
        self.result.notes.append(f"job {row['id']} was uncertain (its runner stopped before "
                                 f"recording the provider's id): found as {batch['id']} by "
                                 "its uid, and polled as any open job")
        return self._row(row["id"])

    async def _collect(self, row: Mapping[str, Any], batch: Mapping[str, Any],
                       detail: dict[str, Any]) -> None:
        """Settle every receipt of an ended job; complete them and it in one transaction."""
        lines = {line["custom_id"]: line for line in self.store.job_lines(row["id"])}
        self.judged.update(line["request_key"] for line in lines.values())
        whole = self.client.whole_failure(batch)
        outs = await self.client.results(batch) if whole is None else ()
        if whole is not None:
            detail["failed"] = whole
            self.result.notes.append(f"{named(row)} failed as a whole: {whole}")
            if self.client.too_large(batch):
                self.chunk = max(1, min(self.chunk, len(lines)) // 2)
        writes, popped = [], {}  # the session's reservations of its lines, taken here
        self.charges, tally = [], self.outcome.tally()
        try:
            for attempt, got in self._lines(row, lines, outs, detail):
                if attempt.reserved is not None:
                    popped[attempt.id] = attempt.reserved
                self.outcome.calls += 1
                verdict, write = await self.settle(attempt, got)
                done = verdict and attempt.request and (verdict.accepted or verdict.partial)
                if done and self.on_progress:
                    self.on_progress(len(verdict.stored if verdict.partial
                                         else attempt.request.tasks))
                writes.append(write)
            store, status = self.store, detail["provider_status"]
            recorded = [False]

            def end(tx: Any) -> None:
                recorded[0] = store.end_job(tx, row["id"], "cancelled" if status == "cancelled"
                                            else "ended", detail)
                for write in writes if recorded[0] else ():
                    write(tx)

            committed(store, end)
        except BaseException:  # nothing recorded: the next collection settles them, once
            self.reservations.update(popped)
            raise
        finally:
            charges, self.charges = self.charges, None
        if not recorded[0]:  # another runner recorded the job's lines: its result counts them
            self.outcome.restore(tally)
        for reserved, cost, usage in charges:
            if recorded[0]:
                super().charge(reserved, cost, usage)
            elif reserved is not None:  # recorded and charged by the runner that ended it first
                self.spender.forgo(reserved)

    def charge(self, reserved: float | None, cost: float | None,
               usage: Mapping[str, Any]) -> None:
        """While a job is collected, its lines are charged once its transaction has committed."""
        if self.charges is not None:
            self.charges.append((reserved, cost, usage))
        else:
            super().charge(reserved, cost, usage)

    def _lines(self, row: Mapping[str, Any], lines: Mapping[str, Mapping[str, Any]],
               outs: Iterable[Any], detail: dict[str, Any]
               ) -> Iterator[tuple[Attempt, Reply | ProviderError]]:
        """Each receipt of an ended job with what came back for it, joined by custom_id only, read
        twice a line at a time: once to count ids (one that comes back twice is admitted in
        neither copy), then a window at a time."""
        where, cap = named(row), declared_output_cap(self.provider)
        came: dict[str, int] = {}
        unknown: list[str] = []
        for out in outs:
            cid = self.client.line_id(out)
            if cid in lines:
                came[cid] = came.get(cid, 0) + 1
            else:
                unknown.append(str(cid)[:80])
        billed = self._billed(outs, lines, {c for c, n in came.items() if n > 1}, cap) if (
            unknown or len(came) < sum(came.values())) else {}
        if unknown:
            extra = billed.pop(None, {})
            detail["unknown_custom_ids"], detail["unknown_usage"] = unknown[:20], extra
            self.result.notes.append(
                f"{where} returned {len(unknown)} line(s) with a custom_id it was never sent "
                f"({', '.join(unknown[:3])}); none was admitted{_paid(extra)}")
        def attempt(line: Mapping[str, Any], request: Request | None = None) -> Attempt:
            return Attempt(line["attempt_id"], self.reservations.pop(line["attempt_id"], None),
                           line["reserved"], request)
        garbled = 0
        once = (out for out in outs if came.get(self.client.line_id(out)) == 1)
        for part in iter(lambda: list(islice(once, WINDOW)), []):
            cids = [self.client.line_id(out) for out in part]
            requests = self.store.requests_by_keys([lines[c]["request_key"] for c in cids])
            for cid, out in zip(cids, part, strict=True):
                line = lines[cid]
                got = self.client.outcome(out, bool(line["wrapped"]))
                if NOT_UTF8 in out:  # refused; the usage of the reply it brought is kept
                    garbled += 1
                    usage = {} if isinstance(got, ProviderError) else usage_of(got)
                    got = ProviderError(f"its output line is not valid UTF-8 (byte "
                                        f"{out[NOT_UTF8]}): refused, never read as an answer",
                                        usage=usage, retryable=True)
                yield attempt(line, requests[line["request_key"]]), (
                    got if isinstance(got, ProviderError) else received(got, cap))
        if garbled:
            self.result.notes.append(
                f"{where} returned {garbled} line(s) that are not valid UTF-8: refused as "
                "provider errors, never read as answers")
        for cid, line in lines.items():
            if came.get(cid) != 1:
                yield attempt(line), _lost(cid, came.get(cid, 0), detail.get("failed"),
                                           detail["provider_status"], billed.get(cid, {}))

    def _billed(self, outs: Iterable[Any], lines: Mapping[str, Mapping[str, Any]],
                copied: set[str], cap: int | None) -> dict[str | None, dict[str, Any]]:
        """The usage of every copy of a line that came back more than once (by its id), and of
        every line with an id it was never sent (under None): admitted or not, each was billed."""
        billed: dict[str | None, dict[str, Any]] = {}
        for out in outs:
            cid = self.client.line_id(out)
            if cid in lines and cid not in copied or not isinstance(out, dict):
                continue
            line = lines.get(cid)
            try:
                got = self.client.outcome(out, bool(line and line["wrapped"]))
                usage = (got.usage if isinstance(got, ProviderError)
                         else usage_of(received(got, cap)))
            except Exception:  # noqa: BLE001 - a line read only for its usage: unknown
                usage = {}
            key = cid if line else None
            billed[key] = _summed(billed.get(key, {}), usage)
        return billed


def _receipts(request: Request, history: Mapping[str, list[Any]]) -> list[Any]:
    """``request``'s job receipts in ``history``: its own, or if it has none and is the rest of
    a partial return, those of the request it was split from (ending with that return)."""
    parent = history.get(request.parent_key or "", [])
    return history.get(request.key) or (parent if parent and parent[-1]["status"] == "partial"
                                        else [])


def job_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A job as a result, ``batchjson jobs`` and the notebook show it."""
    detail = detail_of(row)
    return {"id": row["id"], "provider": row["protocol"], **{key: row[key] for key in (
        "provider_job_id", "status", "batch", "requests", "reserved", "created_at",
        "submitted_at")}, **{key: detail.get(key) for key in ("provider_status", "counts", "why")}}


def plan_facts(plan: Plan) -> dict[str, Any]:
    """What judging a job's lines needs beside its revision, for a kernel that did not run it."""
    try:
        schema = json.loads(json.dumps(plan.schema.json_schema))
    except (TypeError, ValueError):
        schema = None
    return {"schema": schema, "mode": plan.mode, "identity": list(plan.identity),
            "accept": plan.accept}


def unix(stamp: str) -> float:
    """Seconds since the epoch of a ledger time (ISO 8601 UTC)."""
    moment = datetime.fromisoformat(stamp)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _lost(custom_id: str, came: int, whole: str | None, status: str,
          usage: Mapping[str, Any]) -> ProviderError:
    """Why a receipt got no answer to admit: its line came back ``came`` times (not once), each
    copy billed (``usage``: theirs summed)."""
    if came:
        why = (f"custom_id {custom_id} came back {came} times in one job's output; none of "
               f"its lines was admitted{_paid(usage)}")
    elif whole is not None:
        why = f"the job failed as a whole before any line ran: {whole}"
    elif status in ("expired", "cancelled", "canceled"):
        why = f"the job {status} before this request was answered"
    else:
        why = f"custom_id {custom_id} is missing from the output of a {status} job"
    return ProviderError(why, retryable=True, usage=dict(usage), never_ran=not came and (
        whole is not None or status in ("expired", "cancelled", "canceled")))


_SUMMED = ("input_tokens", "output_tokens", "cached_tokens", "cost")


def _summed(total: Mapping[str, Any], usage: Mapping[str, Any]) -> dict[str, Any]:
    """Two lines' usage as one: the counts each says, added (a copy that says none, an error
    line's, adds nothing; unknown while no copy said one)."""
    summed = {}
    for key in _SUMMED:
        known = [n for n in (total.get(key), usage.get(key)) if is_amount(n)]
        summed[key] = sum(known) if known else None
    return summed


def _paid(usage: Mapping[str, Any]) -> str:
    """What a note adds about lines billed and not admitted: their tokens, when known."""
    if usage.get("input_tokens") is None and usage.get("output_tokens") is None:
        return ""
    return (f"; billed {usage.get('input_tokens')} input and {usage.get('output_tokens')} "
            "output tokens for them")


async def created_batch(client: Any, row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The batch an uncertain job made, found by the uid it was created with (listed back to an
    hour before the job was recorded: clocks differ), or None."""
    return await client.find(row["uid"], unix(row["created_at"]) - 3600)


def named(row: Mapping[str, Any]) -> str:
    return f"job {row['id']} ({row['provider_job_id']})"


def detail_of(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return dict(json.loads(row["detail"] or "{}"))
    except (TypeError, ValueError):
        return {}
