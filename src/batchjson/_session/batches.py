"""What the session adds for the batch transport: the batch API a provider offers (refused before
anything is recorded), batch prices, what a result says of its jobs, and collecting ended jobs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .._content.keys import Keys
from .._content.schema import ItemSchema, compile_schema
from .._content.tasks import Request
from .._errors import BatchJsonError, ConfigError, InvalidBatch, ProviderError
from .._ledger import Ledger
from .._ledger.records import now
from .._ledger.store import Store
from .._ledger.store_jobs import OPEN_STATES
from .._loop import run_sync
from .._providers.anthropic import AnthropicBatches, AnthropicProvider
from .._providers.base import close_provider
from .._providers.batch_client import WINDOW_HOURS
from .._providers.openai import OpenAIBatches, OpenAIProvider
from .._providers.pricing import batch_share
from .._replay.budget import Pricing, Spender, batch_pricing, pricing_of
from .._replay.jobs import JobRunner, JobsOutcome, created_batch, detail_of, job_view, unix
from .._replay.plan import Outcome, Plan
from .plan import Runtime
from .registry import checker_of
from .result import BatchResult


def batch_offer(provider: Any) -> Callable[[], Any]:
    """What makes ``provider``'s batch API (asking nothing), or a ConfigError saying why not."""
    offer = getattr(provider, "batch_api", None)  # a provider says if it has a batch transport
    if not callable(offer):
        raise ConfigError(
            f"transport='batch' needs a provider with a batch API (OpenAIProvider or "
            f"AnthropicProvider); {getattr(provider, 'name', type(provider).__name__)!r} has "
            "none. Use transport='live', or an OpenAI or Anthropic provider")
    return offer


def client_for(rt: Runtime, provider: Any) -> Any:
    """``provider``'s batch API, checked to exist with one look on the session's loop."""
    client = batch_offer(provider)()
    rt.remember_provider(provider)
    rt.loop.run(client.check)
    return client


def held_by_jobs(store: Store, pending: Sequence[Request]) -> JobsOutcome:
    """The unfinished jobs claiming a live run's pending requests, and their errors."""
    held = store.job_holders([r.key for r in pending])
    out = JobsOutcome(Outcome())
    if not held:
        return out
    ids = set(held.values())
    out.jobs = [job_view(r) for r in store.jobs() if r["id"] in ids]
    for request in pending:
        if request.key in held:
            for task_id in request.task_ids:
                out.outcome.errors[task_id] = [{
                    "type": "pending", "task_id": task_id, "request": request.key,
                    "message": "claimed by an unfinished batch job: re-run with "
                    "transport='batch' to collect it"}]
    out.notes.append(f"{len(held)} request(s) are claimed by unfinished batch job(s) and were "
                     "not sent live; re-run with transport='batch' to collect them")
    return out


def pricing(provider: Any, *, batch: bool) -> Pricing:
    """The prices a cost budget reserves by: the provider's, at its batch share for a job."""
    live = pricing_of(provider)
    if not batch:
        return live
    return batch_pricing(live, batch_share(getattr(provider, "model", None),
                                           getattr(provider, "prices", None)))


def report(result: BatchResult, ran: JobsOutcome) -> None:
    """The jobs of a run on its result: pending while any still holds one of its requests."""
    result.jobs = ran.jobs
    result.notes.extend(ran.notes)
    if ran.submitted:
        result.notes.append(f"{ran.submitted} request(s) submitted as a batch job at batch "
                            "prices")
    holding = [job for job in ran.jobs if job["status"] in OPEN_STATES]
    if holding and not result.resolved:
        result.status = "pending"
        ids = ", ".join(f"{job['id']} ({job['provider_job_id'] or job['status']})"
                        for job in holding)
        result.notes.append(f"pending in batch job(s) {ids}: re-run the same cell or call to "
                            "collect what has ended, or pass wait=True to block until they end")
    for job in holding:
        if job["status"] == "uncertain":
            why = job["why"] or "its provider id was never recorded"
            result.notes.append(
                f"job {job['id']} is uncertain: {why}; its requests are not resubmitted on "
                "their own. Check the provider's console, "
                f"then `batchjson cancel {job['id']}` to release them")


def job_client(row: Mapping[str, Any], provider: Any = None) -> tuple[Any, Any]:
    """A job's provider (``provider`` if it speaks the job's protocol) and batch API."""
    anthropic = row["protocol"] == AnthropicBatches.protocol
    kind = AnthropicProvider if anthropic else OpenAIProvider
    if (not isinstance(provider, kind) or getattr(provider, "model", None) != row["model"]
            or getattr(provider, "base_url", None) != row["endpoint"]):
        provider = kind(row["model"], base_url=row["endpoint"])
    return provider, provider.batch_api()


def list_jobs(ledger: Ledger, *, every: bool = False) -> list[dict[str, Any]]:
    """The ledger's unfinished batch jobs (``every``: all), newest first, as shown."""
    return [job_view(row) for row in ledger.store.jobs(every=every, lost=True)]


ASK_SECONDS = 5.0  # how long a status waits on a provider for a job's progress


def pending_jobs(ledger: Ledger, name: str | None = None, *,
                 timeout: float = ASK_SECONDS) -> list[dict[str, Any]]:
    """The unfinished jobs as a status shows them: their progress (None past ``timeout``)."""
    rows = [r for r in ledger.store.jobs(lost=True) if name in (None, r["batch"])]

    async def ask_all() -> list[tuple[int, int] | None]:
        return list(await asyncio.gather(*(_progress(row, timeout) for row in rows)))

    asked = run_sync(ask_all) if rows else []
    return [{**job_view(row), **_timeline(row, progress)}
            for row, progress in zip(rows, asked, strict=True)]


async def _progress(row: Mapping[str, Any], timeout: float) -> tuple[int, int] | None:
    """(lines ended, lines in all) of an open job, from its provider; None when unknown."""
    if row["status"] != "open" or not row["provider_job_id"]:
        return None
    try:
        provider, client = job_client(row)
    except BatchJsonError:  # no key for it here
        return None
    try:
        batch = await asyncio.wait_for(client.poll(row["provider_job_id"]), timeout)
        return client.progress(batch)
    except Exception:  # noqa: BLE001 - any failure to ask leaves the progress unknown
        return None
    finally:
        await close_provider(provider)


def _timeline(row: Mapping[str, Any], progress: tuple[int, int] | None) -> dict[str, Any]:
    submitted = row["submitted_at"] or row["created_at"]
    start = unix(submitted)
    end, by = start + WINDOW_HOURS * 3600, "window"
    if progress and 0 < progress[0] < progress[1]:
        at_rate = start + (time.time() - start) * progress[1] / progress[0]
        end, by = (at_rate, "rate") if at_rate < end else (end, by)
    elif progress and progress[0] >= progress[1]:
        end, by = time.time(), "ended"
    return {"submitted_at": submitted, "window_hours": WINDOW_HOURS,
            "progress": None if progress is None else {"ended": progress[0],
                                                       "total": progress[1]},
            "ends_by": datetime.fromtimestamp(end, UTC).isoformat(timespec="seconds"),
            "ends_from": by}


def cancel_job(ledger: Ledger, job: str, *, provider: Any = None) -> dict[str, Any]:
    """Cancel job ``job`` (number, provider id or uid) at its provider and record it."""
    store = ledger.store
    rows = store.jobs(job=str(job), lost=True)
    if not rows:
        raise InvalidBatch(f"no batch job {job!r} in this ledger; `batchjson jobs` lists them")
    row = rows[0]
    if row["status"] == "recording" and store.note_job(
            row["id"], {"cancel_requested_at": now()}, recording=True):
        return {**job_view(row), "cancel_requested": True}
    row = store.jobs(job=str(row["id"]))[0]  # as it stands after that
    if row["status"] == "uncertain":
        return _cancel_uncertain(store, row, provider)
    if row["status"] != "open":
        raise InvalidBatch(f"batch job {row['id']} has already {row['status']}; nothing to "
                           "cancel")
    provider, client = job_client(row, provider)

    async def cancel() -> dict[str, Any]:
        try:
            return await client.cancel(row["provider_job_id"])
        finally:
            await close_provider(provider)

    batch = run_sync(cancel)
    store.note_job(row["id"], {"cancel_requested_at": now(), "cancel_sent_at": now(),
                               "provider_status": client.status(batch)})
    return {**job_view(row), "provider_status": client.status(batch)}


def _cancel_uncertain(store: Store, row: Mapping[str, Any], provider: Any) -> dict[str, Any]:
    """Release a job whose provider id was never recorded. Its batch may exist, billed: found
    by its uid (OpenAI keeps it; Anthropic keeps none) it is cancelled there and its id kept,
    and its receipts stay calls either way, so the account never loses what may have run."""
    batch, asked = (_find_and_cancel(row, provider) if row["protocol"] == OpenAIBatches.protocol
                    else (None, False))
    found: dict[str, Any] = {}
    note: dict[str, Any] = {}
    sent_at = None
    if batch is not None:
        stamp, status = now(), OpenAIBatches.status(batch)
        found = {"provider_job_id": str(batch["id"]), "provider_status": status}
        note = {"recovered": "found at the provider by the uid it was created with",
                "provider_status": status, "cancel_requested_at": stamp,
                **({"cancel_sent_at": stamp} if asked else {})}
        created = batch.get("created_at")  # when its requests were sent, as the provider says
        if isinstance(created, (int, float)):
            sent_at = datetime.fromtimestamp(created, UTC).isoformat(timespec="microseconds")
    if not store.cancel_job(row["id"], "cancelled by a person before its provider id was "
                            "recorded", sent=True, was=("recording", "uncertain"),
                            provider_job_id=found.get("provider_job_id"), note=note,
                            sent_at=sent_at):
        return {**job_view(store.jobs(job=str(row["id"]))[0]), **found}  # recorded meanwhile
    return {**job_view(row), **found, "status": "cancelled", "released": row["requests"]}


def _find_and_cancel(row: Mapping[str, Any], provider: Any) -> tuple[dict[str, Any] | None, bool]:
    """The batch an uncertain OpenAI job made, found by its uid and cancelled if still running
    (a rerun would otherwise pay for its requests twice), or None; and whether it was asked to
    cancel. A provider that cannot be asked refuses: releasing unasked is what pays twice."""
    provider, client = job_client(row, provider)

    async def find() -> tuple[dict[str, Any] | None, bool]:
        try:
            batch = await created_batch(client, row)
            if batch is None or client.status(batch) not in client.running - {"cancelling"}:
                return batch, False  # none, or ended (what it answered is billed): kept
            return await client.cancel(str(batch["id"])), True
        finally:
            await close_provider(provider)

    try:
        return run_sync(find)
    except ProviderError as exc:
        raise ProviderError(
            f"batch job {row['id']} is uncertain and its provider could not be asked whether "
            f"it created it, to cancel it there: {exc}; nothing was released: try again",
            status=exc.status, retryable=exc.retryable) from exc


def status_summary(rt: Runtime, name: str | None = None) -> dict[str, Any]:
    """What ``%batch_status`` shows: ended jobs collected first, then the summary."""
    forgo_ended_elsewhere(rt)  # (a run does it as it starts)
    collected = collect_ended(rt, name)
    return {**rt.evidence.summary(name), "collected": collected,
            "jobs": pending_jobs(rt.ledger, name)}


def forgo_ended_elsewhere(rt: Runtime) -> None:
    """The session's reservations of job lines another session has since recorded (collected,
    or cancelled unsent): charged there, held here no more; a line of a job cancelled while
    uncertain, possibly billed, is charged its worst case, as the ledger keeps it."""
    reserved = list(rt.job_reservations)  # (a line recorded later by a run on another thread
    if not reserved:  # is not among them: it keeps its own)
        return
    for line in rt.ledger.store.job_lines(attempts=reserved):
        status = line["status"]
        worst = None if status == "in_flight" else rt.job_reservations.pop(
            line["attempt_id"], None)  # (None: a collection here took it meanwhile)
        if worst is not None and status == "cancelled" and line["sent_at"] is not None:
            rt.tally.keep(worst)
        elif worst is not None:
            rt.tally.forgo(worst)


def collect_ended(rt: Runtime, name: str | None = None) -> list[str]:
    """Collect every ended job (of batch ``name``) this kernel can judge; a line for each."""
    store = rt.ledger.store
    said = []
    for row in store.jobs(lost=True):
        if row["status"] not in ("open", "uncertain") or name not in (None, row["batch"]):
            continue  # an uncertain one may be found at the provider (OpenAI), then collected
        shown = (f"job {row['id']} of {row['batch']!r} "
                 f"({row['provider_job_id'] or 'no provider id'})")
        plan, why = job_plan(rt, row)
        if plan is None:
            said.append(f"{shown} was not collected here: {why}; re-run its cell to collect it")
            continue
        try:
            said.append(f"{shown} {_collect(rt, row, plan)}")
        except BatchJsonError as exc:  # the job stays open: the next look tries again
            said.append(f"{shown} could not be collected this time: {exc}")
    return said


def job_plan(rt: Runtime, row: Mapping[str, Any]) -> tuple[Plan | None, str]:
    """What judging job ``row``'s lines needs, or None and why this kernel cannot judge them."""
    [revision] = rt.ledger.revisions(revision_id=row["revision_id"])
    facts = json.loads(row["plan"] or "{}")
    schema = _schema(rt, revision.components.get("schema"), facts.get("schema"))
    if schema is None:
        return None, ("its answer schema is not on record in a form this kernel can rebuild "
                      "(a pydantic model with validators of its own)")
    digest, checker = revision.components.get("validator"), None
    if digest not in (None, "none"):
        version = next((v for v in rt.validators.versions(revision.validator_name or "")
                        if v.fingerprint.digest == digest), None)
        if version is None:
            return None, (f"its validator {revision.validator_name!r} (the version it ran "
                          "with) is not registered in this kernel")
        checker = checker_of(version, "task", rt.transport.timeout)
    return Plan(batch_id=row["batch_id"], revision_id=row["revision_id"],
                mode=facts.get("mode", "items"), identity=tuple(facts.get("identity", ())),
                schema=schema, validator=checker, instructions=None,
                keys=Keys(revision.components, None), repairs=0, replays=0, split=False,
                accept=facts.get("accept", "whole")), ""


def _schema(rt: Runtime, fingerprint: str | None, kept: Any) -> ItemSchema | None:
    known = rt.job_schemas.get(fingerprint or "")
    if known is not None or kept is None:
        return known
    try:
        schema = compile_schema(kept)
    except BatchJsonError:
        return None
    return schema if schema.fingerprint == fingerprint else None


def collector(rt: Runtime, row: Mapping[str, Any], plan: Plan | None = None
              ) -> JobRunner | str:
    """A runner collecting job ``row`` by its own revision's rules (``plan``, else read as
    :func:`job_plan` does), or why this kernel cannot judge its lines."""
    if plan is None:
        plan, why = job_plan(rt, row)
        if plan is None:
            return why
    try:  # the session's own provider, when it speaks the job's protocol (its key, its pool)
        configured = rt.provider()
    except BatchJsonError:
        configured = None
    provider, client = job_client(row, configured)
    rt.remember_provider(provider)
    spender = Spender(None, rt.budget, rt.tally, pricing(provider, batch=True),
                      shared=rt.ledger.budget())
    return JobRunner(plan, rt.ledger, provider, client, spender, rt.job_reservations,
                     session_id=rt.session_id)


def _collect(rt: Runtime, row: Mapping[str, Any], plan: Plan) -> str:
    store = rt.ledger.store
    runner = collector(rt, row, plan)
    assert isinstance(runner, JobRunner)  # given its plan, always one
    keys = [line["request_key"] for line in store.job_lines(row["id"])]
    ran = rt.loop.run(lambda: runner.collect(keys))
    after = store.jobs(job=str(row["id"]))[0]
    if after["status"] == "uncertain":
        return ("stays uncertain: it was not found at the provider by its uid (Anthropic "
                "keeps none); check the provider's console, then `batchjson cancel "
                f"{row['id']}` to release its requests")
    if after["status"] == "open":
        status = detail_of(after).get("provider_status") or "running"
        return f"is still {status}" + "".join(f"; {note}" for note in ran.notes)
    out = ran.outcome
    return (f"{after['status']}: collected {out.calls} line(s), {out.accepted_returns} "
            f"accepted, {out.rejected_returns} rejected, {out.provider_errors} provider "
            "error(s); re-run its cell for the values (what was accepted is never sent again) "
            "and follow-ups of the rest" + "".join(f"; {note}" for note in ran.notes))
