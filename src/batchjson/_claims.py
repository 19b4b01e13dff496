"""Claims: one payer per request, across threads, sessions and processes sharing a ledger.

A runner claims a request in the same transaction as the in-flight receipt of its call, and keeps
the claim (renewing its lease) until the request is resolved or given up. Another runner of the
same content never sends a claimed request; it waits and takes the accepted result from the
ledger. A claim whose owner is gone is taken over at once, and that owner's in-flight receipts
become ``abandoned``: calls of unknown cost.

Every statement here is plain SQL that a PostgreSQL ledger can run inside one transaction; there
the claim row is read with ``SELECT ... FOR UPDATE SKIP LOCKED`` (see docs/design.md). SQLite's
``BEGIN IMMEDIATE`` already serialises writers, so the read-then-write below is atomic.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass

from ._records import now

HOST = socket.gethostname()
LEASE_SECONDS = 30.0  # renewed every third of this while the owner runs

_live_lock = threading.Lock()
_live_runs: set[str] = set()  # owners of this process whose run is still going


@dataclass(frozen=True)
class Owner:
    """Who holds a claim: this host and process, a session, and one run of it."""

    host: str
    pid: int
    session: str
    run: str

    @classmethod
    def start(cls, session: str) -> Owner:
        owner = cls(HOST, os.getpid(), session, uuid.uuid4().hex[:12])
        with _live_lock:
            _live_runs.add(owner.id)
        return owner

    def stop(self) -> None:
        with _live_lock:
            _live_runs.discard(self.id)

    @property
    def id(self) -> str:
        return f"{self.host}/{self.pid}/{self.session}/{self.run}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def owner_gone(owner: str, host: str, pid: int, lease_expires_at: float | None,
               at: float) -> bool:
    """Same host: its process (or, in this process, its run) no longer exists. Any host: its
    lease expired, so it stopped renewing."""
    if host == HOST:
        if pid == os.getpid():
            with _live_lock:
                if owner not in _live_runs:
                    return True
        elif not pid_alive(pid):
            return True
    return lease_expires_at is not None and lease_expires_at < at


def _parse(owner: str) -> tuple[str, int] | None:
    parts = owner.split("/")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def abandon(db: sqlite3.Connection, owner: str) -> int:
    """Take every claim of a gone owner; its in-flight receipts become 'abandoned'."""
    db.execute("DELETE FROM claims WHERE owner = ?", (owner,))
    return db.execute(
        "UPDATE attempts SET status = 'abandoned', finished_at = ?, errors = ? "
        "WHERE owner = ? AND status = 'in_flight'",
        (now(), '[{"type": "abandoned", "task_id": null, "message": "its runner was killed or '
         'lost before the answer was recorded; the call may have been paid for"}]',
         owner)).rowcount


def reap(db: sqlite3.Connection) -> int:
    """Abandon the claims and in-flight receipts of every owner that is gone; run at start."""
    at = time.time()
    gone: set[str] = set()
    for row in db.execute("SELECT owner, MAX(host), MAX(pid), MAX(lease_expires_at) "
                          "FROM claims GROUP BY owner").fetchall():
        if owner_gone(row[0], row[1], row[2], row[3], at):
            gone.add(row[0])
    for (owner,) in db.execute("SELECT DISTINCT owner FROM attempts WHERE status = "
                               "'in_flight' AND owner IS NOT NULL").fetchall():
        where = _parse(owner)
        if owner not in gone and where is not None and where[0] == HOST and owner_gone(
                owner, where[0], where[1], None, at):
            gone.add(owner)
    return sum(abandon(db, owner) for owner in gone)


MINE, HELD, ACCEPTED = "mine", "held", "accepted"


def claim(db: sqlite3.Connection, request_key: str, owner: Owner) -> str:
    """:func:`take`'s slow path, inside the caller's transaction: one statement reads both
    whether ``request_key`` is accepted and who holds it, and a holder that is gone is
    abandoned. Returns ACCEPTED (already resolved: nothing to send), HELD (a live runner has
    it) or MINE; on MINE the caller records its receipt on the claim with :func:`hold`."""
    row = db.execute(_CLAIM_SQL, (request_key, request_key)).fetchone()
    if row[0]:
        return ACCEPTED
    holder = row[1]
    if holder is not None and holder != owner.id:
        if not owner_gone(holder, row[2], row[3], row[4], time.time()):
            return HELD
        abandon(db, holder)
    return MINE


# PostgreSQL: SELECT ... FROM claims WHERE request_key = $1 FOR UPDATE SKIP LOCKED (a row
# another transaction is deciding on is skipped and treated as HELD), and the accepted check
# as the same EXISTS; SQLite's BEGIN IMMEDIATE makes the plain read atomic with the write.
_CLAIM_SQL = (
    "SELECT EXISTS (SELECT 1 FROM attempts WHERE request_key = ? AND status = 'accepted'), "
    "c.owner, c.host, c.pid, c.lease_expires_at FROM (SELECT ? AS k) AS x "
    "LEFT JOIN claims c ON c.request_key = x.k")


def take(db: sqlite3.Connection, request_key: str, owner: Owner, attempt_id: int,
         stamp: str) -> str:
    """Claim ``request_key`` for the receipt ``attempt_id`` just written, inside the caller's
    transaction; the hot path of every call. One statement claims a request that is free or
    already ours and not accepted; anything else (accepted, held by another runner, held by one
    that is gone) takes :func:`claim`'s slower path. Returns MINE, HELD or ACCEPTED; on HELD or
    ACCEPTED the caller drops its receipt, since nothing will be sent."""
    if db.execute(_TAKE_SQL, (request_key, owner.id, owner.host, owner.pid, owner.session,
                              attempt_id, time.time() + LEASE_SECONDS, stamp,
                              request_key)).rowcount:
        return MINE
    state = claim(db, request_key, owner)
    if state == MINE:  # its holder was gone: taken over
        hold(db, request_key, owner, attempt_id, stamp)
    return state


# PostgreSQL: the same INSERT ... ON CONFLICT ... DO UPDATE ... WHERE; a row another
# transaction holds is waited for there, so the slow path reads it FOR UPDATE SKIP LOCKED.
_TAKE_SQL = (
    "INSERT INTO claims(request_key, owner, host, pid, session, attempt_id, lease_expires_at, "
    "claimed_at) SELECT ?,?,?,?,?,?,?,? WHERE NOT EXISTS (SELECT 1 FROM attempts WHERE "
    "request_key = ? AND status = 'accepted') ON CONFLICT(request_key) DO UPDATE SET "
    "attempt_id = excluded.attempt_id, lease_expires_at = excluded.lease_expires_at "
    "WHERE claims.owner = excluded.owner")


def hold(db: sqlite3.Connection, request_key: str, owner: Owner, attempt_id: int,
         stamp: str | None = None) -> None:
    """Record (or refresh) this owner's claim, pointing at the receipt just written (``stamp``:
    the receipt's start time, so both rows share one clock reading)."""
    db.execute(
        "INSERT INTO claims(request_key, owner, host, pid, session, attempt_id, "
        "lease_expires_at, claimed_at) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(request_key) DO "
        "UPDATE SET owner = excluded.owner, host = excluded.host, pid = excluded.pid, "
        "session = excluded.session, attempt_id = excluded.attempt_id, "
        "lease_expires_at = excluded.lease_expires_at",
        (request_key, owner.id, owner.host, owner.pid, owner.session, attempt_id,
         time.time() + LEASE_SECONDS, stamp or now()))


def release(db: sqlite3.Connection, request_key: str, owner: Owner) -> None:
    db.execute("DELETE FROM claims WHERE request_key = ? AND owner = ?", (request_key, owner.id))


def release_all(db: sqlite3.Connection, owner: Owner) -> None:
    db.execute("DELETE FROM claims WHERE owner = ?", (owner.id,))


def renew(db: sqlite3.Connection, owner: Owner) -> None:
    db.execute("UPDATE claims SET lease_expires_at = ? WHERE owner = ?",
               (time.time() + LEASE_SECONDS, owner.id))
