"""The batch transport: a run's pending requests as provider batch jobs, judged line by line by
the same acceptance and committed through the same store methods as a live return.

One pass: poll every unfinished job holding a request of the run and collect those that ended
(lines joined by ``custom_id`` only: an unknown, missing or duplicated id is named and never
admitted; an error line is a provider error, never an answer); then submit what is still owed
(first calls, and the follow-ups the run's repairs and replays allow) as one job, recorded
before upload. ``wait=False`` returns after one pass with the jobs still open; ``wait=True``
passes until every job ended.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .._acceptance import judge as acceptance
from .._content.tasks import Request, render_repair_prompt
from .._errors import ProviderError
from .._ledger import Ledger
from .._ledger.claims import Owner
from .._providers.base import estimate_tokens, input_bound
from .._providers.reply import REFUSED, TRUNCATED, received
from .._providers.settings import declared_output_cap
from .budget import Spender, charge_line, charge_of, reserve_lines
from .calls import _usage, first_prompt, make_call
from .plan import Outcome, Plan, system_prompt


@dataclass
class JobsOutcome:
    """What the batch transport did in this run: the run's counters, and every job still
    holding one of its requests (open, being recorded, or uncertain)."""

    outcome: Outcome
    jobs: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    submitted: int = 0


class JobRunner:
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
        self._system = system_prompt(plan)

    async def run(self, requests: Sequence[Request], *, wait: bool) -> JobsOutcome:
        self.requests = {r.key: r for r in requests}
        keys = list(self.requests)
        self.tried = set(self.store.attempt_counts(keys))
        # A request whose allowance a past run used up starts a new chain in this run.
        history = self.store.job_history(keys, self.plan.revision_id)
        self.since = {key: rows[-1]["id"] for key, rows in history.items()
                      if self._next(self.requests[key], rows) is None
                      and rows[-1]["status"] != "in_flight"}
        writer = Owner.start(self.session_id)
        try:
            while True:
                await self._collect_ended(keys)
                await self._submit_owed(keys, writer)
                self.result.jobs = [job_view(r, self.store.job_keys(r["id"]))
                                    for r in self.store.jobs_holding(keys)]
                running = [j for j in self.result.jobs if j["status"] in ("open", "recording")]
                if not wait or not running:
                    break
                await asyncio.sleep(self.poll)
        finally:
            writer.stop()
        self._unresolved(keys)
        return self.result

    async def collect(self, keys: list[str]) -> JobsOutcome:
        """Only collect the ended jobs holding ``keys`` (``%batch_status``): nothing is
        submitted, and a request's own content comes from the ledger."""
        self.requests = {}
        await self._collect_ended(keys)
        self.result.jobs = [job_view(r, self.store.job_keys(r["id"]))
                            for r in self.store.jobs_holding(keys)]
        return self.result

    # -- collection ----------------------------------------------------------------------------
    async def _collect_ended(self, keys: list[str]) -> None:
        self.store.lost_recordings()
        for row in self.store.jobs_holding(keys):
            if row["protocol"] != self.client.protocol:
                continue
            if row["status"] == "uncertain" and row["provider_job_id"] is None:
                row = await self._recover(row)
            if row["status"] != "open":
                continue
            try:
                batch = await self.client.poll(row["provider_job_id"])
                status = self.client.status(batch)
                if status not in self.client.running:
                    await self._collect(row, batch)
                    continue
            except ProviderError as exc:  # the job stays open: the next run looks again
                self.result.notes.append(f"job {row['id']} ({row['provider_job_id']}) could "
                                         f"not be read this time: {exc}")
                continue
            self.store.job_detail(row["id"], {**_detail(row), "provider_status": status,
                                              "counts": self.client.counts(batch)})

    async def _recover(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        """An uncertain job found at the provider by the uid it was created with (OpenAI keeps
        it as the batch's metadata) is recorded open under the id found, and polled as any
        open job; else it stays uncertain."""
        try:  # listed back to an hour before it was recorded (clocks differ)
            batch = await self.client.find(row["uid"], unix(row["created_at"]) - 3600)
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
        return self.store.jobs(job=str(row["id"]))[0]

    async def _collect(self, row: Mapping[str, Any], batch: Mapping[str, Any]) -> None:
        """Join the job's lines to its receipts by custom_id, judge each, and complete every
        receipt and the job in one transaction."""
        lines = {line["custom_id"]: line for line in self.store.job_lines(row["id"])}
        whole = self.client.whole_failure(batch)
        found: dict[str, list[Any]] = {}
        unknown: list[str] = []
        if whole is None:
            for out in await self.client.results(batch):
                cid = self.client.line_id(out)
                if cid in lines:
                    found.setdefault(cid, []).append(out)
                else:
                    unknown.append(str(cid)[:80])
        elif self.client.too_large(batch):
            self.chunk = max(1, min(self.chunk, len(lines)) // 2)
        status = self.client.status(batch)
        writes = []
        for cid, line in lines.items():
            writes.append(await self._judge_line(line, found.get(cid, []), whole, status))
        detail = {**_detail(row), "provider_status": status, "counts": self.client.counts(batch)}
        if unknown:
            detail["unknown_custom_ids"] = unknown
            self.result.notes.append(
                f"job {row['id']} ({row['provider_job_id']}) returned {len(unknown)} line(s) "
                f"with a custom_id it was never sent ({', '.join(unknown[:3])}); none was "
                "admitted")
        if whole is not None:
            detail["failed"] = whole
            self.result.notes.append(f"job {row['id']} ({row['provider_job_id']}) failed as a "
                                     f"whole: {whole}")
        store = self.store
        with store.call_transaction() as tx:
            if store.end_job(tx, row["id"], "cancelled" if status == "cancelled" else "ended",
                             detail):
                for write in writes:
                    write(tx)

    async def _judge_line(self, line: Mapping[str, Any], outs: list[Any], whole: str | None,
                          status: str) -> Callable[[Any], None]:
        """The write completing one receipt, from the lines the provider returned for it."""
        store, out = self.store, self.result.outcome
        attempt_id, key = line["attempt_id"], line["request_key"]
        request = self.requests.get(key) or self.store.request_by_key(key)
        reserved = self.reservations.pop(attempt_id, None)
        out.calls += 1
        if len(outs) == 1:
            got = self.client.outcome(outs[0], bool(line["wrapped"]))
        elif outs:
            got = ProviderError(f"custom_id {line['custom_id']} came back {len(outs)} times in "
                                "one job's output; none of its lines was admitted",
                                retryable=True)
        elif whole is not None:
            got = ProviderError(f"the job failed as a whole before any line ran: {whole}",
                                retryable=True)
        elif status in ("expired", "cancelled", "canceled"):
            got = ProviderError(f"the job {status} before this request was answered",
                                retryable=True)
        else:
            got = ProviderError(f"custom_id {line['custom_id']} is missing from the output of "
                                f"a {status} job", retryable=True)
        shared = self.spender.shared is not None  # the ledger's own budget settles too
        if isinstance(got, ProviderError):
            charge_line(self.spender, reserved, 0.0)  # a line without an answer is not billed
            out.provider_errors += 1
            errors = [{"type": "provider_error", "task_id": None, "status": got.status,
                       "retryable": got.retryable,
                       "message": f"provider failed{_http(got)}: {got}"}]
            return lambda tx: store.finish_call(tx, attempt_id, "provider_error", errors, None,
                                                got.usage or {}, charge=0.0 if shared else None)
        reply = received(got, declared_output_cap(self.provider))
        cost = reply.cost if reply.cost is not None else self.spender.pricing.cost(
            reply.input_tokens, reply.output_tokens)
        charge_line(self.spender, reserved, cost)
        charged_ledger = charge_of(line["reserved"], cost) if shared else None
        out.input_tokens += reply.input_tokens or 0
        out.output_tokens += reply.output_tokens or 0
        out.cost = None if out.cost is None or cost is None else out.cost + cost
        usage = _usage(reply)
        plan = self.plan
        verdict = await acceptance.judge(reply, request.tasks, mode=plan.mode,
                                         identity=plan.identity, schema=plan.schema,
                                         validator=plan.validator)
        if verdict.accepted:
            out.accepted_returns += 1
            if self.on_progress is not None:
                self.on_progress(len(request.tasks))
            return lambda tx: store.accept_call(tx, attempt_id, plan.batch_id, key,
                                                verdict.stored, reply.text, usage,
                                                charge=charged_ledger)
        out.rejected_returns += 1
        return lambda tx: store.finish_call(tx, attempt_id, "rejected", verdict.errors,
                                            reply.text, usage, charge=charged_ledger)

    # -- submission ----------------------------------------------------------------------------
    def _owed(self, keys: list[str]) -> list[tuple[Request, str, str]]:
        """What to send now: each request neither accepted nor held by a job, with the kind
        and prompt of its next attempt, while its allowance lasts."""
        store = self.store
        done = store.accepted_keys(keys) | store.job_held_keys(keys)
        free = [k for k in keys if k not in done]
        history = store.job_history(free, self.plan.revision_id)
        owed = []
        for key in free:
            rows = [r for r in history.get(key, []) if r["id"] > self.since.get(key, 0)]
            step = self._next(self.requests[key], rows)
            if step is not None:
                owed.append((self.requests[key], *step))
        return owed

    def _next(self, request: Request, rows: Sequence[Mapping[str, Any]]
              ) -> tuple[str, str] | None:
        """The next attempt of ``request`` after its job receipts ``rows`` (this chain's),
        or None when its repairs and replays are spent (or its validator crashed)."""
        prompt = first_prompt(self.plan, request)
        if not rows:
            return ("replay" if request.key in self.tried else "initial"), prompt
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

    async def _submit_owed(self, keys: list[str], writer: Owner) -> None:
        owed = self._owed(keys)
        while owed:
            part, owed = owed[:self.chunk], owed[self.chunk:]
            sent, unsent = await self._submit(part, writer)
            owed = unsent + owed
            if not sent:
                break

    async def _submit(self, owed: list[tuple[Request, str, str]], writer: Owner
                      ) -> tuple[bool, list[tuple[Request, str, str]]]:
        """Record one job, then upload and create it: whether more may be sent, and the
        requests past the provider's upload ceiling, for the next job."""
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
        body = []
        if len(written) < len(owed):
            self.result.notes.append(
                f"{len(owed) - len(written)} request(s) were not submitted: accepted or "
                "claimed by another runner meanwhile, or past the ledger's own cost budget")
        for (request, _, _), call, worst in zip(owed, calls, reserved, strict=True):
            mine = by_key.get(request.key)
            if mine is None:  # nothing is sent for it
                self.spender.release(worst)
                continue
            self.reservations[mine["attempt_id"]] = worst
            body.append(self.client.line(mine["custom_id"], call)[0])
        if job_id is None:
            return True, unsent
        return (await self._send(job_id, uid, body, [w["attempt_id"] for w in written]),
                unsent)

    async def _send(self, job_id: int, uid: str, body: list[dict[str, Any]],
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
        self.result.submitted += len(body)
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
        self.result.notes.append(f"job {job_id} was not submitted: {why}")

    def _unresolved(self, keys: list[str]) -> None:
        """Each request neither accepted nor held by a job: the errors of its last receipt."""
        store, out = self.store, self.result.outcome
        held = store.job_held_keys(keys)
        for key in held:
            job = next((j for j in self.result.jobs if key in j.get("keys", ())), None)
            where = f"job {job['id']} ({job['provider_job_id'] or 'no provider id'}, " \
                f"{job['status']})" if job else "a batch job"
            for task_id in self.requests[key].task_ids:
                out.errors[task_id] = [{"type": "pending", "task_id": task_id, "request": key,
                                        "message": f"submitted in {where}; re-run to collect "
                                        "what has ended"}]
        done = store.accepted_keys(keys) | held
        history = store.job_history([k for k in keys if k not in done], self.plan.revision_id)
        for key, rows in history.items():
            errors = json.loads(rows[-1]["errors"] or "[]")
            for task_id in self.requests[key].task_ids:
                out.errors[task_id] = [{**e, "task_id": task_id, "request": key}
                                       for e in errors if e.get("task_id") in (None, task_id)
                                       ] or [{"type": "batch_rejected", "task_id": task_id,
                                              "request": key, "message": "another item of the "
                                              "same request failed"}]


def job_view(row: Mapping[str, Any], keys: Sequence[str] | None = ()) -> dict[str, Any]:
    """A job as a result, ``batchjson jobs`` and the notebook show it; ``keys`` (its requests'
    keys, for a run to tell which of its requests it holds) is left out when None."""
    detail = _detail(row)
    shown = {"id": row["id"], "provider": row["protocol"], "provider_job_id":
             row["provider_job_id"], "status": row["status"], "batch": row["batch"],
             "requests": row["requests"], "reserved": row["reserved"],
             "created_at": row["created_at"], "provider_status": detail.get("provider_status"),
             "counts": detail.get("counts"), "why": detail.get("why")}
    return shown if keys is None else {**shown, "keys": tuple(keys)}


def plan_facts(plan: Plan) -> dict[str, Any]:
    """What judging a job's lines needs beside its revision, kept on the job row so a kernel
    that did not run the cell can collect it: the answer schema (None when it is no JSON),
    mode and identity fields."""
    try:
        schema = json.loads(json.dumps(plan.schema.json_schema))
    except (TypeError, ValueError):
        schema = None
    return {"schema": schema, "mode": plan.mode, "identity": list(plan.identity)}


def unix(stamp: str) -> float:
    """Seconds since the epoch of a ledger time (ISO 8601 UTC)."""
    moment = datetime.fromisoformat(stamp)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _detail(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return dict(json.loads(row["detail"] or "{}"))
    except (TypeError, ValueError):
        return {}


def _http(error: ProviderError) -> str:
    return f" (HTTP {error.status})" if error.status else ""
