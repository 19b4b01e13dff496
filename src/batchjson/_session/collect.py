"""``%batch_status`` collects what has ended: each open job's lines judged as its run would judge
them, through the same runner; nothing is submitted. A job whose validator this kernel has not
registered is left open, saying to re-run its cell."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .._content.keys import Keys
from .._content.schema import ItemSchema, compile_schema
from .._errors import BatchJsonError
from .._replay.budget import Spender
from .._replay.jobs import JobRunner
from .._replay.plan import Plan
from . import batches
from .plan import Runtime
from .run import checker_of


def status_summary(rt: Runtime, name: str | None = None) -> dict[str, Any]:
    """What ``%batch_status`` shows: ended jobs collected first, then the evidence's summary and the
    unfinished jobs (of batch ``name``, or all)."""
    collected = collect_ended(rt, name)
    summary = rt.evidence.summary(name)
    summary["collected"] = collected
    summary["jobs"] = [j for j in batches.list_jobs(rt.ledger) if name in (None, j["batch"])]
    return summary


def collect_ended(rt: Runtime, name: str | None = None) -> list[str]:
    """Collect every open job (of batch ``name``) that has ended and this kernel can judge;
    one line per job looked at, saying what was collected or what to do."""
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
                keys=Keys(revision.components, None), repairs=0, replays=0, split=False), ""


def _schema(rt: Runtime, fingerprint: str | None, kept: Any) -> ItemSchema | None:
    known = rt.job_schemas.get(fingerprint or "")
    if known is not None or kept is None:
        return known
    try:
        schema = compile_schema(kept)
    except BatchJsonError:
        return None
    return schema if schema.fingerprint == fingerprint else None


def _collect(rt: Runtime, row: Mapping[str, Any], plan: Plan) -> str:
    """Poll the job once and collect it if it ended; what happened, in words."""
    store = rt.ledger.store
    try:  # the session's own provider, when it speaks the job's protocol (its key, its pool)
        configured = rt.provider
    except BatchJsonError:
        configured = None
    provider, client = batches.job_client(row, configured)
    rt.remember_provider(provider)
    spender = Spender(None, rt.budget, rt.tally, batches.pricing(provider, client),
                      shared=rt.ledger.budget())
    runner = JobRunner(plan, rt.ledger, provider, client, spender,
                       rt.job_reservations, session_id=rt.session_id)
    keys = [line["request_key"] for line in store.job_lines(row["id"])]
    ran = rt.loop.run(lambda: runner.collect(keys))
    after = store.jobs(job=str(row["id"]))[0]
    if after["status"] == "uncertain":
        return ("stays uncertain: it was not found at the provider by its uid (Anthropic "
                "keeps none); check the provider's console, then `batchjson cancel "
                f"{row['id']}` to release its requests")
    if after["status"] == "open":
        status = json.loads(after["detail"] or "{}").get("provider_status") or "running"
        return f"is still {status}" + "".join(f"; {note}" for note in ran.notes)
    out = ran.outcome
    return (f"{after['status']}: collected {out.calls} line(s), {out.accepted_returns} "
            f"accepted, {out.rejected_returns} rejected, {out.provider_errors} provider "
            "error(s); re-run its cell for the values (what was accepted is never sent again) "
            "and follow-ups of the rest" + "".join(f"; {note}" for note in ran.notes))
