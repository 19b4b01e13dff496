"""Provider batch jobs: a job and its lines are recorded before upload, each line with a receipt
and a claim held by the job itself (never presumed gone) until its collection releases them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .._content.tasks import Request, stored_request
from .records import now
from .store_base import Row, Tx
from .store_calls import BUDGET_SETTLE_SQL, MINE, CallStore, Owner, _owner_gone

JOB_HOST = "batchjson-job"  # the host of a job's claims: no process, never presumed gone
NEVER = 1e18  # a job's claims have no lease: they are released when the job is collected
OPEN_STATES = ("recording", "open", "uncertain")


def _job_owner(uid: str) -> Owner:
    return Owner(JOB_HOST, 0, "job", uid)


_JOBS_OF_CLAIMS = (f"JOIN jobs j ON c.owner = '{_job_owner('').id}' || j.uid AND j.status IN "
                   f"{OPEN_STATES}")
JOB_LINES_SQL = ("SELECT l.custom_id, l.attempt_id, l.request_key, l.wrapped, l.reserved, "
                 "a.kind, a.sent_at, a.status FROM job_lines l JOIN attempts a ON a.id = "
                 "l.attempt_id WHERE {where} ORDER BY l.attempt_id")
ANY_JOB_OPEN_SQL = f"SELECT 1 FROM jobs WHERE status IN {OPEN_STATES} LIMIT 1"
# Requests an unfinished job claims; then those whose model sees what such a request's saw
HELD_SQL = (f"SELECT c.request_key, j.id FROM claims c {_JOBS_OF_CLAIMS} "
            "WHERE c.request_key IN ({marks})")
HELD_ALIKE_SQL = (
    "SELECT s.request_key, MIN(j.id) FROM seen s JOIN seen o ON o.seen_key = s.seen_key AND "
    f"o.request_key <> s.request_key JOIN claims c ON c.request_key = o.request_key "
    f"{_JOBS_OF_CLAIMS} WHERE s.request_key IN ({{marks}}) GROUP BY s.request_key")


def _custom_id(job_uid: str, attempt_id: int, request_key: str) -> str:
    """A line's id naming one receipt of one job (a stale line is never joined to a later one),
    51 characters of ``[a-z0-9_]``: within both providers' rule ``^[a-zA-Z0-9_-]{1,64}$``."""
    digest = hashlib.sha256(f"{job_uid}:{attempt_id}:{request_key}".encode()).hexdigest()
    return f"bj_{digest[:48]}"


class JobStore(CallStore):
    """Job rows, their lines and their claims."""

    def open_job(self, *, uid: str, protocol: str, batch_id: int, revision_id: int,
                 model: str | None, endpoint: str, provider: str, source: str | None,
                 writer: Owner, lines: Sequence[tuple[Request, str, bool, float, int]],
                 shared: bool, plan: Mapping[str, Any]) -> tuple[int | None, list[dict[str, Any]]]:
        """Record a job (``recording``) with a receipt, claim and line for each (request, kind,
        wrapped, reserved, estimated tokens) still free and within the ledger's budget (on which
        ``shared`` reserves each worst case): (its id, the lines written), or (None, [])."""
        owner, stamp = _job_owner(uid), now()
        written: list[dict[str, Any]] = []
        with self.transaction(calls=True) as tx:
            job_id = self._insert(tx, JOB_SQL, (
                uid, protocol, batch_id, revision_id, model, endpoint, writer.id, writer.host,
                writer.pid, stamp, json.dumps(dict(plan)), self._clock(tx) + self.lease_seconds))
            for request, kind, wrapped, reserved, estimated in lines:
                state, attempt_id = self.begin_call_later(
                    tx, batch_id, revision_id, request, kind, provider, model, source,
                    owner=owner, estimated_input_tokens=estimated,
                    reserve=reserved if shared else None, at_commit=False)()
                if state != MINE or attempt_id is None:
                    continue
                line = _custom_id(uid, attempt_id, request.key)
                self._exec(tx, "INSERT INTO job_lines(custom_id, job_id, attempt_id, "
                           "request_key, wrapped, reserved) VALUES (?,?,?,?,?,?)",
                           (line, job_id, attempt_id, request.key, int(wrapped), reserved))
                written.append({"custom_id": line, "attempt_id": attempt_id,
                                "request_key": request.key, "reserved": reserved})
            if not written:  # every request was taken meanwhile: no job at all
                self._exec(tx, "DELETE FROM jobs WHERE id = ?", (job_id,))
                return None, []
            self._exec(tx, "UPDATE claims SET lease_expires_at = ? WHERE owner = ?",
                       (NEVER, owner.id))
            self._exec(tx, "UPDATE jobs SET requests = ?, reserved = ? WHERE id = ?",
                       (len(written), sum(w["reserved"] for w in written), job_id))
        return job_id, written

    def renew_job(self, job_id: int) -> None:
        """The writer of a job still being recorded lives: its lease runs on."""
        with self.transaction() as tx:
            self._exec(tx, "UPDATE jobs SET lease_expires_at = ? WHERE id = ? AND status = "
                       "'recording'", (self._clock(tx) + self.lease_seconds, job_id))

    def job_submitted(self, job_id: int, provider_job_id: str,
                      detail: Mapping[str, Any]) -> bool:
        """The provider created the job: its id recorded (kept by a job released meanwhile, so
        none is billed unknown), every receipt sent. True when a person cancelled or released it
        meanwhile."""
        stamp = now()
        with self.transaction() as tx:
            status, old = self._job_state(tx, job_id)
            asked = {k: old[k] for k in ("cancel_requested_at",) if k in old}
            if status in ("recording", "uncertain"):
                self._exec(tx, "UPDATE jobs SET status = 'open', provider_job_id = ?, "
                           "submitted_at = ?, detail = ? WHERE id = ?",
                           (provider_job_id, stamp, json.dumps({**detail, **asked}), job_id))
            else:  # released by a person meanwhile: its receipts stay cancelled
                self._exec(tx, "UPDATE jobs SET provider_job_id = ?, detail = ? WHERE id = ?",
                           (provider_job_id, json.dumps({**old, **detail,
                                                         "created_after_cancel": stamp}),
                            job_id))
            self._exec(tx, "UPDATE attempts SET sent_at = ? WHERE id IN (SELECT attempt_id "
                       "FROM job_lines WHERE job_id = ?)", (stamp, job_id))
        return bool(asked) or status not in ("recording", "uncertain")

    def note_job(self, job_id: int, note: Mapping[str, Any], *, recording: bool = False,
                 uncertain: bool = False) -> bool:
        """Add ``note`` to a job's detail, only while it is recording if ``recording``; then
        ``uncertain`` marks it so (it may exist, billed, without its id): False if it is not."""
        with self.transaction() as tx:
            status, old = self._job_state(tx, job_id)
            if (recording or uncertain) and status != "recording":
                return False
            self._exec(tx, "UPDATE jobs SET status = ?, detail = ? WHERE id = ?",
                       ("uncertain" if uncertain else status, json.dumps({**old, **note}),
                        job_id))
        return True

    def _job_state(self, tx: Tx, job_id: int) -> tuple[str, dict[str, Any]]:
        status, detail = self._exec(tx, "SELECT status, detail FROM jobs WHERE id = ?",
                                    (job_id,)).fetchone()
        return status, dict(json.loads(detail or "{}"))

    def end_job(self, tx: Tx, job_id: int, status: str, detail: Mapping[str, Any],
                was: Sequence[str] = ("open",)) -> bool:
        """In ``tx`` (which completes its receipts): the job ended or was cancelled, its claims
        released; False when it was no longer in a state of ``was``."""
        marks = ",".join("?" * len(was))
        ended = self._exec(tx, f"UPDATE jobs SET status = ?, ended_at = ?, detail = ? WHERE "
                           f"id = ? AND status IN ({marks}) RETURNING uid",
                           (status, now(), json.dumps(dict(detail)), job_id, *was)).fetchall()
        for (uid,) in ended:
            self._exec(tx, "DELETE FROM claims WHERE owner = ?", (_job_owner(uid).id,))
        return bool(ended)

    def cancel_job(self, job_id: int, why: str, *, sent: bool,
                   was: Sequence[str] = ("recording",), provider_job_id: str | None = None,
                   note: Mapping[str, Any] | None = None, sent_at: str | None = None) -> bool:
        """A job that will never be collected: its receipts still in flight are cancelled, its
        claims released. ``sent``: it may have run and been billed, so each stays a call (sent
        when submitted, else ``sent_at`` or now: an uncertain job's never was recorded); else it
        never left. ``provider_job_id``: its batch, found at the provider; ``note``: detail."""
        message = (f"{why}; the job may have run and been billed" if sent else
                   f"{why}; nothing was sent")
        errors = json.dumps([{"type": "cancelled", "task_id": None, "message": message}])
        stamp = now()
        with self.transaction() as tx:
            if not self.end_job(tx, job_id, "cancelled", {**(note or {}), "why": message}, was):
                return False
            if provider_job_id is not None:  # no batch the provider bills is unknown
                self._exec(tx, "UPDATE jobs SET provider_job_id = ? WHERE id = ?",
                           (provider_job_id, job_id))
            for attempt_id, reserved in self._exec(
                    tx, "SELECT id, reserved FROM attempts WHERE status = 'in_flight' AND "
                    "reserved IS NOT NULL AND id IN (SELECT attempt_id FROM job_lines WHERE "
                    "job_id = ?)", (job_id,)).fetchall():  # possibly billed: its worst case
                self._exec(tx, BUDGET_SETTLE_SQL, (reserved if sent else 0.0, attempt_id))
            self._exec(tx, "UPDATE attempts SET status = 'cancelled', errors = ?, "
                       "finished_at = ?, sent_at = CASE WHEN ? THEN COALESCE(sent_at, ?) "
                       "ELSE NULL END WHERE status = 'in_flight' AND id IN (SELECT attempt_id "
                       "FROM job_lines WHERE job_id = ?)",
                       (errors, stamp, sent, sent_at or stamp, job_id))
        return True

    # -- reads ---------------------------------------------------------------------------------
    def _jobs_in_the_way(self, name: str | None, then: str) -> str | None:
        """Why ``then`` waits for an unfinished job of batch ``name`` (None: of any batch)."""
        return _unfinished_jobs([j for j in self.jobs() if name in (None, j["batch"])],
                                "this ledger" if name is None else f"batch {name!r}", then)

    def job_holders(self, keys: Sequence[str]) -> dict[str, int]:
        """Of ``keys``, those an unfinished job claims, each with the job's id: the key itself, or
        another whose model saw the same (another validator's revision): asked once, not again."""
        if not keys or not self._read(ANY_JOB_OPEN_SQL):  # the usual case: no job at all
            return {}
        held = {row[0]: row[1] for row in self._by_keys(HELD_SQL, keys)}
        held.update((row[0], row[1]) for row in self._by_keys(
            HELD_ALIKE_SQL, [key for key in keys if key not in held]))
        return held

    def last_attempt_id(self) -> int:
        """The newest receipt's id (0 when there is none): what a run found on record."""
        return self._read("SELECT COALESCE(MAX(id), 0) FROM attempts")[0][0]

    def jobs(self, *, every: bool = False, job: str | None = None,
             lost: bool = False) -> list[Row]:
        """Job rows, newest first: open ones (``every``: all), or the one named by its id or
        provider id; ``lost``: those still recording whose writer is gone (as a claim's holder
        is) marked uncertain first, as it may have created the job, billed, without its id."""
        at = self._clock(None) if lost else 0.0
        for row in self._read("SELECT id, owner, host, pid, lease_expires_at FROM jobs WHERE "
                              "status = 'recording'") if lost else ():
            if _owner_gone(row["owner"], row["host"], row["pid"], row["lease_expires_at"], at):
                self.note_job(row["id"], {"why": "its runner stopped between recording the "
                                          "job and recording the provider's id: the job may "
                                          "exist and be billed"}, uncertain=True)
        sql = "SELECT j.*, b.name AS batch FROM jobs j JOIN batches b ON b.id = j.batch_id"
        if job is not None:
            return self._read(sql + " WHERE CAST(j.id AS TEXT) = ? OR j.provider_job_id = ? "
                              "OR j.uid = ?", (job, job, job))
        if not every:
            sql += f" WHERE j.status IN {OPEN_STATES}"
        return self._read(sql + " ORDER BY j.id DESC")

    def job_lines(self, job_id: int | None = None, *, attempts: Sequence[int] = ()
                  ) -> list[Row]:
        """A job's lines with their receipts as they stand; or, by ``attempts``, those lines."""
        if job_id is None:
            return self._by_keys(JOB_LINES_SQL.format(where="l.attempt_id IN ({marks})"),
                                 list(attempts))
        return self._read(JOB_LINES_SQL.format(where="l.job_id = ?"), (job_id,))

    def job_window(self, keys: Sequence[str], revision_id: int
                   ) -> tuple[dict[str, int], set[str], dict[str, list[Row]]]:
        """Of a window of ``keys``: those an unfinished job claims (with the job's id); those done
        (accepted, or so claimed); each other key's job receipts of one revision, oldest first."""
        holders = self.job_holders(keys)
        done = self.accepted_keys(keys) | holders.keys()
        history: dict[str, list[Row]] = {}
        for row in self._by_keys(
                "SELECT a.id, a.request_key, a.kind, a.status, a.errors, a.raw, l.job_id FROM "
                "attempts a JOIN job_lines l ON l.attempt_id = a.id WHERE a.revision_id = ? "
                "AND a.request_key IN ({marks}) ORDER BY a.id",
                [k for k in keys if k not in done], before=(revision_id,)):
            history.setdefault(row["request_key"], []).append(row)
        return holders, done, history

    def requests_by_keys(self, keys: Sequence[str], revision_id: int | None = None
                         ) -> dict[str, Request]:
        """The ledger's copy of each of ``keys``: of one revision, its leaves there (its parts,
        once split); else the first recorded (a job's line may be of another revision)."""
        sql, before = ("SELECT key, tasks, task_ids, position, parent_key FROM requests WHERE "
                       "key IN ({marks}) ORDER BY id"), ()
        if revision_id is not None:
            sql, before = LEAVES_SQL, (revision_id,)
        found: dict[str, Request] = {}
        for row in self._by_keys(sql, keys, before=before):
            found.setdefault(row["key"], stored_request(row))
        return found


# The leaf requests of one revision where ``{marks}`` are: a request and every part it was split
# into (halves, a partial return's parts) share its position.
LEAVES_SQL = (
    "SELECT DISTINCT q.id, q.key, q.tasks, q.task_ids, q.position, q.parent_key FROM requests q "
    "JOIN requests p ON p.revision_id = q.revision_id AND p.position = q.position "
    "WHERE q.revision_id = ? AND q.split = 0 AND p.key IN ({marks}) ORDER BY q.id")


def _unfinished_jobs(jobs: Sequence[Mapping[str, Any]], where: str, then: str) -> str | None:
    """Why ``then`` must wait while any of ``jobs`` is unfinished, naming each, or None: only its
    own ledger collects a job."""
    open_jobs = [j for j in jobs if j["status"] in OPEN_STATES]
    if not open_jobs:
        return None
    named = ", ".join(f"{j['id']} (batch {j['batch']!r}, {j['provider_job_id'] or j['status']})"
                      for j in open_jobs)
    return (f"{where} has unfinished batch job(s) {named}: they may still answer, and be "
            f"billed, there. Re-run the batch to collect them, or `batchjson cancel JOB` "
            f"them, first; then {then}")


JOB_SQL = (
    "INSERT INTO jobs(uid, protocol, status, batch_id, revision_id, model, endpoint, requests, "
    "reserved, owner, host, pid, created_at, plan, lease_expires_at) "
    "VALUES (?,?, 'recording', ?,?,?,?, 0, 0,?,?,?,?,?,?)")
