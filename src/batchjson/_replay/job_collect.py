"""Collecting a run's batch jobs: poll the ones watched, find an uncertain OpenAI job by the uid
it was created with, and judge an ended job's lines through the same acceptance as a live
return, committing every receipt and the job in one transaction.

An ended job's output is read a line at a time, twice (to count each ``custom_id``, then to
judge a window of lines with their requests from the ledger), so collecting holds a job's
output bytes and its receipts' writes, never every line parsed at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from .._content.tasks import Request
from .._errors import ProviderError
from .._ledger.records import now
from .._ledger.store import Store
from .._providers.batch_client import NOT_UTF8
from .._providers.reply import received
from .._providers.settings import declared_output_cap
from .budget import Spender, charge_of
from .plan import Plan
from .settle import Settle, usage_of

WINDOW = 1000  # requests read from the ledger, or output lines judged, together


class Collection:
    """The collecting half of a :class:`~batchjson._replay.jobs.JobRunner` (its plan, store,
    client, spender, reservations, result and the ids of the jobs it watches)."""

    plan: Plan
    store: Store
    provider: Any
    client: Any
    spender: Spender
    reservations: dict[int, float]
    result: Any  # a JobsOutcome
    watched: set[int]
    unreadable: set[int]  # open jobs whose reading failed with a final 4xx: not waited for
    stopped: set[int]  # jobs a person cancelled during the run: none of their requests resent
    cancelled_before: set[int]  # jobs asked to cancel before the run began
    chunk: int
    settle: Settle
    on_progress: Callable[[int], None] | None

    def _open_rows(self) -> list[Any]:
        """The watched jobs still unfinished (those that ended are no longer watched)."""
        rows = [row for row in self.store.jobs() if row["id"] in self.watched]
        self.watched = {row["id"] for row in rows}
        return rows

    async def _collect_ended(self) -> list[int]:
        """Poll the watched jobs and collect those that ended: the ids of every watched job
        no longer unfinished (collected here, or by another runner meanwhile)."""
        self.store.lost_recordings()
        for row in self.store.jobs():
            if row["id"] not in self.watched or row["protocol"] != self.client.protocol:
                continue
            if row["status"] == "uncertain" and row["provider_job_id"] is None:
                row = await self._recover(row)
            if row["status"] != "open":
                continue
            if "cancel_requested_at" in detail_of(row):
                await self._cancel_asked(row)
                row = self.store.jobs(job=str(row["id"]))[0]  # what it recorded
            try:
                batch = await self.client.poll(row["provider_job_id"])
                status = self.client.status(batch)
                if status not in self.client.running:
                    await self._collect(row, batch)
                    continue
            except ProviderError as exc:  # the job stays open: the next run looks again
                final = not exc.retryable and 400 <= (exc.status or 0) < 500
                if final:  # asking again will not help: no wait for it (see JobRunner.run)
                    self.unreadable.add(row["id"])
                self.result.notes.append(
                    f"job {row['id']} ({row['provider_job_id']}) could not be read this time: "
                    f"{exc}" + ("; the wait for it ends, and it stays open for a later run or "
                                "%batch_status to collect" if final else ""))
                continue
            self.store.job_detail(row["id"], {**detail_of(row), "provider_status": status,
                                              "counts": self.client.counts(batch)})
        before = set(self.watched)
        gone = sorted(before - {row["id"] for row in self._open_rows()})
        for job_id in gone:
            if job_id not in self.cancelled_before and (
                    self.store.jobs(job=str(job_id))[0]["status"] == "cancelled"):
                self.stopped.add(job_id)
                self.result.notes.append(
                    f"job {job_id} was cancelled while this run watched it: none of its "
                    "requests is sent again by this run; the next run you start owes them")
        return [job_id for job_id in gone if job_id not in self.stopped]

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
            self.result.notes.append(
                f"job {row['id']} ({row['provider_job_id']}) was cancelled by a person while "
                f"it was created, but the provider could not be asked to cancel it: {exc}")
            return
        self.store.job_detail(row["id"], {**detail, "cancel_sent_at": now(),
                                          "provider_status": self.client.status(batch)})
        self.result.notes.append(
            f"job {row['id']} ({row['provider_job_id']}) was cancelled at the provider, as a "
            "person asked while it was being created")

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
        receipt and the job in one transaction. The output is read twice, a line at a time:
        once to count each custom_id (one that comes back twice is admitted in neither
        copy), then to judge, a window of lines with their requests at a time."""
        lines = {line["custom_id"]: line for line in self.store.job_lines(row["id"])}
        whole = self.client.whole_failure(batch)
        status = self.client.status(batch)
        outs = await self.client.results(batch) if whole is None else ()
        if whole is not None and self.client.too_large(batch):
            self.chunk = max(1, min(self.chunk, len(lines)) // 2)
        came: dict[str, int] = {}
        unknown: list[str] = []
        for out in outs:
            cid = self.client.line_id(out)
            if cid in lines:
                came[cid] = came.get(cid, 0) + 1
            else:
                unknown.append(str(cid)[:80])
        writes, garbled = [], 0
        once = (out for out in outs if came.get(self.client.line_id(out)) == 1)
        for part in _batched(once, WINDOW):
            cids = [self.client.line_id(out) for out in part]
            requests = self.store.requests_by_keys([lines[c]["request_key"] for c in cids])
            for cid, out in zip(cids, part, strict=True):
                line = lines[cid]
                got = self.client.outcome(out, bool(line["wrapped"]))
                if NOT_UTF8 in out:
                    got, garbled = _not_utf8(got, out[NOT_UTF8]), garbled + 1
                writes.append(await self._judge_line(line, got, requests[line["request_key"]]))
        if garbled:
            self.result.notes.append(
                f"job {row['id']} ({row['provider_job_id']}) returned {garbled} line(s) that "
                "are not valid UTF-8: refused as provider errors, never read as answers")
        for cid, line in lines.items():
            if came.get(cid) != 1:
                writes.append(self._failed_line(line, _lost(cid, came.get(cid, 0), whole,
                                                            status)))
        detail = {**detail_of(row), "provider_status": status, "counts": self.client.counts(batch)}
        if unknown:
            detail["unknown_custom_ids"] = unknown[:20]
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

    def _failed_line(self, line: Mapping[str, Any], got: ProviderError
                     ) -> Callable[[Any], None]:
        """The write completing a receipt whose line brought no answer (never billed, unless
        it brought a reply that was refused: not UTF-8)."""
        cost = got.usage.get("cost") or 0.0
        self.settle.charge(self.reservations.pop(line["attempt_id"], None), cost, got.usage)
        self.result.outcome.calls += 1
        return self.settle.failed(line["attempt_id"], got, cost)

    async def _judge_line(self, line: Mapping[str, Any], got: Any, request: Request
                          ) -> Callable[[Any], None]:
        """The write completing one receipt, from what the provider returned for it."""
        if isinstance(got, ProviderError):
            return self._failed_line(line, got)
        settle, attempt_id = self.settle, line["attempt_id"]
        self.result.outcome.calls += 1
        reply = received(got, declared_output_cap(self.provider))
        cost = settle.cost(reply)
        settle.charge(self.reservations.pop(attempt_id, None), cost, usage_of(reply))
        # the ledger's own budget settles against what the ledger reserved for the line
        verdict, write = await settle.judge(request, reply, attempt_id,
                                            charge_of(line["reserved"], cost))
        if verdict.accepted and self.on_progress is not None:
            self.on_progress(len(request.tasks))
        return write


def unix(stamp: str) -> float:
    """Seconds since the epoch of a ledger time (ISO 8601 UTC)."""
    moment = datetime.fromisoformat(stamp)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _lost(custom_id: str, came: int, whole: str | None, status: str) -> ProviderError:
    """Why a receipt got no answer it could admit: its line came back ``came`` times (not
    once), in a job that ended ``status`` (or failed as a whole: ``whole``)."""
    if came:
        why = (f"custom_id {custom_id} came back {came} times in one job's output; none of "
               "its lines was admitted")
    elif whole is not None:
        why = f"the job failed as a whole before any line ran: {whole}"
    elif status in ("expired", "cancelled", "canceled"):
        why = f"the job {status} before this request was answered"
    else:
        why = f"custom_id {custom_id} is missing from the output of a {status} job"
    return ProviderError(why, retryable=True)


def _not_utf8(got: Any, at: int) -> ProviderError:
    """A line that was not valid UTF-8, refused; the usage of the reply it brought is kept."""
    usage = {} if isinstance(got, ProviderError) else usage_of(got)
    return ProviderError(f"its output line is not valid UTF-8 (byte {at}): refused, never "
                         "read as an answer", usage=usage, retryable=True)


def _batched(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    part: list[Any] = []
    for item in items:
        part.append(item)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part



def detail_of(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return dict(json.loads(row["detail"] or "{}"))
    except (TypeError, ValueError):
        return {}


def _http(error: ProviderError) -> str:
    return f" (HTTP {error.status})" if error.status else ""
