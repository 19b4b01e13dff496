"""The batch transport: a run's pending requests as provider batch jobs, judged line by line by
the same acceptance and committed through the same store methods as a live return.

A run's requests come as a stream of windows, read again from the run's source each time (its
checked tasks' texts, or the ledger's pages): the runner holds about one job's requests at a
time, plus a few numbers a job. The first pass streams them once, submitting what is owed
(first calls, and the follow-ups the run's repairs and replays allow) a job at a time, each
recorded before upload, and learns which jobs hold the rest. Every pass then polls those jobs
and collects the ones that ended (lines joined by ``custom_id`` only: an unknown, missing or
duplicated id is named and never admitted; an error line is a provider error, never an
answer), and submits the follow-ups of the requests they held, read from the ledger.
``wait=False`` returns after one pass with the jobs still open; ``wait=True`` passes until
every job ended.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._acceptance import judge as acceptance
from .._content.tasks import Request, render_repair_prompt
from .._errors import ProviderError
from .._ledger import Ledger
from .._ledger.claims import Owner
from .._providers.base import estimate_tokens, input_bound
from .._providers.upload import Upload
from .._sources import REFUSED, TRUNCATED
from .budget import Spender, reserve_lines
from .calls import first_prompt, make_call
from .job_collect import WINDOW, Collection, detail_of
from .plan import Outcome, Plan, system_prompt

Windows = Callable[[], Iterable[Sequence[Request]]]  # a run's pending requests, anew each call


@dataclass
class JobsOutcome:
    """What the batch transport did in this run: the run's counters, and every job still
    holding one of its requests (open, being recorded, or uncertain)."""

    outcome: Outcome
    jobs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    submitted: int = 0


class JobRunner(Collection):
    """Submits, polls and collects the jobs of one run of one batch revision."""

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, client: Any,
                 spender: Spender, reservations: dict[int, float], *, session_id: str,
                 poll: float = 1.0, on_progress: Callable[[int], None] | None = None) -> None:
        self.plan, self.store, self.provider, self.client = plan, ledger.store, provider, client
        self.spender = spender
        self.reservations = reservations  # attempt id -> worst case this session reserved
        self.session_id = session_id
        self.poll = poll
        self.on_progress = on_progress
        self.result = JobsOutcome(Outcome())
        self.chunk = client.max_requests  # lines per job; halved after token_limit_exceeded
        self.watched: set[int] = set()  # ids of the unfinished jobs holding a request of it
        self.short = False  # a submission stopped short: the next pass looks at every request
        self._system = system_prompt(plan)

    async def run(self, windows: Windows, *, wait: bool) -> JobsOutcome:
        """Submit, poll and collect: ``windows()`` gives the run's pending requests anew, a
        window at a time, each time it is called."""
        self.windows = windows
        # what was on record when the run began: which of a request's receipts are this
        # run's own chain (see _chain)
        self.open_at_start = {row["id"] for row in self.store.jobs()}
        self.watermark = self.store.last_attempt_id()
        writer = Owner.start(self.session_id)
        try:
            rescan = True  # look at every request: the first pass, or one cut short
            while True:
                if rescan:
                    rescan = await self._submit_over(windows(), writer)
                ended = await self._collect_ended()
                if ended:  # follow-ups of what they held
                    rescan = await self._submit_over(self._held_by(ended), writer) or rescan
                running = [row for row in self._open_rows()
                           if row["status"] in ("open", "recording")]
                if not wait or not running:
                    break
                await asyncio.sleep(self.poll)
        finally:
            writer.stop()
        self._unresolved()
        return self.result

    async def collect(self, keys: list[str]) -> JobsOutcome:
        """Only collect the ended jobs holding ``keys`` (``%batch_status``): nothing is
        submitted, and a request's own content comes from the ledger."""
        self.watched.update(self.store.job_holders(keys).values())
        await self._collect_ended()
        self.result.jobs = [job_view(row) for row in self._open_rows()]
        return self.result

    # -- submission ----------------------------------------------------------------------------
    def _owed(self, window: Sequence[Request]) -> list[tuple[Request, str, str]]:
        """What to send now of ``window``: each request neither accepted nor held by a job
        (the jobs holding the rest are watched), with the kind and prompt of its next attempt,
        while its allowance lasts."""
        store = self.store
        keys = [r.key for r in window]
        holders = store.job_holders(keys)
        self.watched.update(holders.values())
        done = store.accepted_keys(keys) | holders.keys()
        free = [r for r in window if r.key not in done]
        history = store.job_history([r.key for r in free], self.plan.revision_id)
        tried = store.attempt_counts([r.key for r in free])
        owed = []
        for request in free:
            rows = self._chain(request, history.get(request.key, []))
            step = self._next(request, rows, request.key in tried)
            if step is not None:
                owed.append((request, *step))
        return owed

    def _chain(self, request: Request, rows: Sequence[Mapping[str, Any]]
               ) -> Sequence[Mapping[str, Any]]:
        """This run's chain of a request's job receipts: all of them, unless its allowance
        was used up before the run began by receipts of no job open then: those since (a
        job open then, of a run this one resumes, belongs to the chain that run began)."""
        settled = [r for r in rows if r["id"] <= self.watermark
                   and r["job_id"] not in self.open_at_start]
        if settled and self._next(request, settled, True) is None:
            return [r for r in rows if r["id"] > settled[-1]["id"]]
        return rows

    def _next(self, request: Request, rows: Sequence[Mapping[str, Any]], tried: bool
              ) -> tuple[str, str] | None:
        """The next attempt of ``request`` after its job receipts ``rows`` (this chain's;
        ``tried``: it has receipts of any kind), or None when its repairs and replays are
        spent (or its validator crashed)."""
        prompt = first_prompt(self.plan, request)
        if not rows:
            return ("replay" if tried else "initial"), prompt
        last = rows[-1]
        errors = json.loads(last["errors"] or "[]")
        kinds = {e.get("type") for e in errors}
        # as the live loop decides: a cut-off answer would be cut off again, a refusal is
        # re-asked only when the run says so, a validator crash and a 4xx never are
        if TRUNCATED in kinds or "validator_error" in kinds or (
                REFUSED in kinds and not self.plan.reask_refusals) or any(
                e.get("retryable") is False for e in errors):
            return None
        raw = last["raw"]
        repairs = sum(r["kind"] == "repair" for r in rows)
        replays = sum(r["kind"] == "replay" for r in rows[1:])
        if (last["status"] == "rejected" and isinstance(raw, str) and kinds
                and kinds <= acceptance.REPAIRABLE and repairs < self.plan.repairs):
            return "repair", render_repair_prompt(prompt, raw, errors)
        if replays < self.plan.replays:
            return "replay", prompt
        return None

    async def _submit_over(self, windows: Iterable[Sequence[Request]], writer: Owner) -> bool:
        """Submit what the requests of ``windows`` owe, a job's worth at a time, holding no
        more than that: whether it stopped short (the budget, a failed upload), so that the
        next pass looks at every request again."""
        owed: list[tuple[Request, str, str]] = []
        self.short = False
        for window in windows:
            owed += self._owed(window)
            while len(owed) >= self.chunk:
                sent, owed = await self._submit_part(owed, writer)
                if not sent:
                    return True
        while owed:
            sent, owed = await self._submit_part(owed, writer)
            if not sent:
                return True
        return self.short

    async def _submit_part(self, owed: list[tuple[Request, str, str]], writer: Owner
                           ) -> tuple[bool, list[tuple[Request, str, str]]]:
        part, rest = owed[:self.chunk], owed[self.chunk:]
        sent, unsent = await self._submit(part, writer)
        return sent, unsent + rest

    def _held_by(self, jobs: Sequence[int]) -> Iterator[list[Request]]:
        """The requests of this run's revision that the ended ``jobs`` held, read from the
        ledger a window at a time, one job's keys at a time."""
        for job_id in jobs:
            keys = self.store.job_keys(job_id)
            for start in range(0, len(keys), WINDOW):
                yield list(self.store.requests_by_keys(keys[start:start + WINDOW],
                                                       self.plan.revision_id).values())

    async def _submit(self, owed: list[tuple[Request, str, str]], writer: Owner
                      ) -> tuple[bool, list[tuple[Request, str, str]]]:
        """Record one job, then upload and create it: whether more may be sent, and the
        requests past the provider's upload ceiling, for the next job."""
        body = self.client.spool()  # on disk; none to be had: a ConfigError, nothing recorded
        try:
            return await self._submit_into(body, owed, writer)
        finally:
            body.close()

    async def _submit_into(self, body: Upload, owed: list[tuple[Request, str, str]],
                           writer: Owner) -> tuple[bool, list[tuple[Request, str, str]]]:
        plan, store = self.plan, self.store
        counts = store.attempt_counts([r.key for r, _, _ in owed])
        calls = [make_call(plan, self._system, r, kind, prompt, counts.get(r.key, 0))
                 for r, kind, prompt in owed]
        fit = self.client.lines_that_fit(calls)
        owed, unsent, calls = owed[:fit], owed[fit:], calls[:fit]
        bounds = ([input_bound(self.provider, c) for c in calls] if self.spender.costed
                  else [0] * len(calls))
        reserved = reserve_lines(self.spender, bounds)
        if len(reserved) < len(calls):
            self.short = True
            self.result.notes.append(
                f"{len(calls) - len(reserved)} request(s) were not submitted: the budget "
                f"holds the worst case of {len(reserved)} of {len(calls)}; raise it and re-run")
        if not reserved:
            return False, []
        calls, owed = calls[:len(reserved)], owed[:len(reserved)]
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
            self.reservations[mine["attempt_id"]] = worst
            body.add(self.client.line_text(mine["custom_id"], call))  # to its file
        del calls  # the upload is on disk while it is sent
        if job_id is None:
            return True, unsent
        self.watched.add(job_id)
        return (await self._send(job_id, uid, body, [w["attempt_id"] for w in written]),
                unsent)

    async def _send(self, job_id: int, uid: str, body: Upload,
                    attempts: list[int]) -> bool:
        """Upload and create a recorded job. A failure before the provider could have created
        it cancels the job's receipts (never sent); any other leaves the job uncertain."""
        store = self.store
        try:
            file_id = await self._renewing(job_id, self.client.upload(body))
        except ProviderError as exc:
            self._unsent(job_id, attempts, f"the input file could not be uploaded ({exc})")
            return False
        try:
            batch = await self._renewing(job_id, self.client.create(
                file_id, {"batchjson_job": uid}))
        except ProviderError as exc:
            if exc.status is not None and 400 <= exc.status < 500:
                self._unsent(job_id, attempts, f"the provider refused the job ({exc})")
            else:
                store.job_uncertain(job_id, f"creating the job failed without an answer "
                                    f"({exc}); it may exist and be billed")
            return False
        store.job_submitted(job_id, str(batch["id"]), {"input_file_id": file_id,
                                                        "provider_status": batch.get("status")})
        self.result.submitted += body.lines
        return True

    async def _renewing(self, job_id: int, awaitable: Any) -> Any:
        """``awaitable``, the job's lease renewed every third of it meanwhile (a large upload
        outlasts a lease): a runner on another host takes the job for uncertain only once
        this one stopped renewing."""
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
        held by a job: the errors of its last receipt; read a window at a time."""
        store, out = self.store, self.result.outcome
        jobs: dict[int, dict[str, Any]] = {}
        for window in self.windows():
            holders = store.job_holders([r.key for r in window])
            self.watched.update(holders.values())
            if holders and not jobs:
                jobs = {row["id"]: job_view(row) for row in store.jobs()}
            done = store.accepted_keys([r.key for r in window]) | holders.keys()
            history = store.job_history([r.key for r in window if r.key not in done],
                                        self.plan.revision_id)
            for request in window:
                if request.key in holders:
                    _pending(out, request, jobs.get(holders[request.key]))
                elif request.key in history:
                    _failed(out, request, history[request.key][-1])
        self.result.jobs = [job_view(row) for row in self._open_rows()]

def job_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A job as a result, ``batchjson jobs`` and the notebook show it."""
    detail = detail_of(row)
    return {"id": row["id"], "provider": row["protocol"], "provider_job_id":
            row["provider_job_id"], "status": row["status"], "batch": row["batch"],
            "requests": row["requests"], "reserved": row["reserved"],
            "created_at": row["created_at"], "provider_status": detail.get("provider_status"),
            "counts": detail.get("counts"), "why": detail.get("why")}


def plan_facts(plan: Plan) -> dict[str, Any]:
    """What judging a job's lines needs beside its revision, kept on the job row so a kernel
    that did not run the cell can collect it: the answer schema (None when it is no JSON),
    mode and identity fields."""
    try:
        schema = json.loads(json.dumps(plan.schema.json_schema))
    except (TypeError, ValueError):
        schema = None
    return {"schema": schema, "mode": plan.mode, "identity": list(plan.identity)}


def _pending(out: Outcome, request: Request, job: Mapping[str, Any] | None) -> None:
    """The tasks of a request a job holds, told as pending (their errors built when read)."""
    where = (f"job {job['id']} ({job['provider_job_id'] or 'no provider id'}, "
             f"{job['status']})" if job else "a batch job")
    out.pending.append(json.dumps({"request": request.key, "where": where,
                                   "task_ids": list(request.task_ids)}))
    out.pending_tasks += len(request.task_ids)


def _failed(out: Outcome, request: Request, last: Mapping[str, Any]) -> None:
    errors = json.loads(last["errors"] or "[]")
    for task_id in request.task_ids:
        out.errors[task_id] = [{**e, "task_id": task_id, "request": request.key}
                               for e in errors if e.get("task_id") in (None, task_id)] or [{
            "type": "batch_rejected", "task_id": task_id, "request": request.key,
            "message": "another item of the same request failed"}]
