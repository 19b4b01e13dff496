"""The store's SQL for a call: its receipt and claim written before it is sent, completed after
with an accepted return's checkpoint rows, the ledger's budget reserved and settled in the same
transactions; and who is live. A method taking ``tx`` runs in the caller's transaction, so a group
commit puts many calls' writes in one (docs/design.md, "Claims"; docs/scale.md, "Budgets")."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import uuid
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._content.tasks import Request
from .records import _uid, now
from .store_base import Later, Tx
from .store_runs import CHECKPOINT_SQL, RunStore

# "This host": its name, or BATCHJSON_HOST where machines share one (containers with the host's
# name but their own process ids); a process id is checked only on its host.
HOST = os.environ.get("BATCHJSON_HOST") or socket.gethostname()

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

    id: str = field(init=False, repr=False, compare=False)  # host/pid/session/run

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.host}/{self.pid}/{self.session}/{self.run}")


def _owner_gone(owner: str, host: str, pid: int, lease_expires_at: float | None,
               at: float) -> bool:
    """Same host: its process (or, in this process, its run) no longer exists. Any host: its
    lease expired, so it stopped renewing."""
    if host == HOST:
        if pid == os.getpid():
            with _live_lock:
                if owner not in _live_runs:
                    return True
        else:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # exists, owned by someone else
                pass
    return lease_expires_at is not None and lease_expires_at < at


ABANDONED = {"type": "abandoned", "task_id": None, "message": "its runner was killed or lost "
             "before the answer was recorded; the call may have been paid for"}

# what begin_call_later finds; PARTED: a return accepted in part split the request (only its
# rejected tasks are owed, never the whole pack again); OVER: the ledger's own cost budget
# cannot hold the call
MINE, HELD, ACCEPTED, PARTED, OVER = "mine", "held", "accepted", "parted", "over"
# A partial return's parts: its revision id, its request, the parts accepted and rejected, and
# the accepted part's own return (its items alone).
Parts = tuple[int, Request, Request, Request, str]
InFlight = dict[str, Any]  # an in-flight receipt's RECEIPT_COLUMNS


class CallStore(RunStore):
    """Receipts, checkpoint rows and claims of every call; the budget they hold; the live hosts."""

    def begin_call_later(self, tx: Tx, batch_id: int, revision_id: int, request: Request,
                         kind: str, provider: str | None, model: str | None,
                         source: str | None, *, owner: Owner,
                         estimated_input_tokens: int | None = None,
                         cost_floor: float | None = None, reserve: float | None = None,
                         at_commit: bool = True) -> Later:
        """Write a call's in-flight receipt and claim its request in ``tx``, committed before it is
        sent: a ``Later`` of (MINE, receipt id), or (HELD, ACCEPTED, PARTED or OVER, None), the
        receipt then not kept (``reserve``: its worst case; None: unpriced). ``at_commit``: where
        one statement decides the claim (:meth:`_claim_at_commit`), read once ``tx`` has
        committed."""
        receipt = dict(zip(RECEIPT_COLUMNS, (
            batch_id, revision_id, request.key, request.task_ids_json, kind, provider, model,
            now(), _uid(), owner.id, estimated_input_tokens, cost_floor, source, reserve),
            strict=True))
        claimed = None if reserve is not None or not at_commit else self._claim_at_commit(
            tx, receipt, owner)
        return claimed or self._begin(tx, receipt, owner, reserve)

    def _claim_at_commit(self, tx: Tx, receipt: InFlight, owner: Owner) -> Later | None:
        """A claim the ledger's budget holds nothing for, decided in one statement that asks
        nothing before COMMIT: a ``Later`` whose outcome is a ``Later`` read once ``tx`` has
        committed; None where the store decides it inside ``tx``."""
        return None

    def _begin(self, tx: Tx, receipt: InFlight, owner: Owner, reserve: float | None) -> Later:
        """The claim decided inside ``tx``; a receipt not won (or over budget) is deleted there."""
        opened = self._open(tx, receipt, owner)

        def outcome() -> tuple[str, int | None]:
            attempt_id, state, budgeted = opened()
            if state == MINE and not self._reserve_shared(tx, attempt_id, reserve, budgeted):
                self.claims(tx, owner, "release", receipt["request_key"])
                state = OVER
            if state != MINE:
                self._exec(tx, "DELETE FROM attempts WHERE id = ? AND status = 'in_flight'",
                           (attempt_id,))
                return state, None
            return state, attempt_id

        return Later(outcome)

    def _open(self, tx: Tx, receipt: InFlight, owner: Owner) -> Later:
        """Write the receipt and claim its request: (receipt id, what the claim found, whether
        the ledger has a budget: None, not asked). The hot path: one statement claims a request
        free or ours and not accepted (whole or in part) on a ledger without a budget; with one,
        :data:`TAKE_SQL`; anything else takes :meth:`_decide`."""
        attempt_id = self._insert(tx, RECEIPT_SQL, tuple(receipt.values()))
        key = receipt["request_key"]
        claim = (key, owner.id, owner.host, owner.pid, owner.session, attempt_id,
                 self._clock(tx) + self.lease_seconds, receipt["started_at"], key)
        if self._exec(tx, TAKE_UNBUDGETED_SQL, claim).rowcount:
            found = (attempt_id, MINE, False)
        elif self._budgeted(tx) and self._exec(tx, TAKE_SQL, claim).rowcount:
            found = (attempt_id, MINE, True)
        else:
            found = (attempt_id, self._decide(tx, receipt, owner, attempt_id), None)
        return Later(lambda: found)

    def _budgeted(self, tx: Tx) -> bool:
        """Whether the ledger has a budget of its own, read in ``tx``."""
        return bool(self._exec(tx, "SELECT EXISTS (SELECT 1 FROM budget WHERE id = 1)"
                               ).fetchone()[0])

    def _decide(self, tx: Tx, receipt: InFlight, owner: Owner, attempt_id: int) -> str:
        """A claimed or accepted request, by the ledger's clock: ACCEPTED, PARTED (accepted in
        part), HELD by a live runner, or a gone runner's taken over (MINE) if its row can be
        locked; a row another runner is taking over is skipped (``{lock}``), never waited for, so
        no wait is circular."""
        sql, request_key = self.dialect._claim_sql, receipt["request_key"]
        settled, holder, host, pid, lease, at = self._exec(
            tx, sql(HOLDER_SQL), (request_key, request_key)).fetchone()
        if settled:
            return ACCEPTED if settled == "accepted" else PARTED
        if holder is None or holder == owner.id or not _owner_gone(holder, host, pid, lease, at):
            return HELD  # released a moment ago, or held: look again later
        if self._exec(tx, sql(LOCK_HOLDER_SQL), (request_key, holder)).fetchone() is None:
            return HELD  # another runner is taking it over this moment
        self._abandon(tx, holder)
        self._exec(tx, sql(HOLD_SQL), (request_key, owner.id, owner.host, owner.pid,
                                       owner.session, attempt_id, self.lease_seconds,
                                       receipt["started_at"]))
        return MINE

    def _abandon(self, tx: Tx, owner: str) -> int:
        """Take every claim of a gone owner; its in-flight receipts become 'abandoned', each charged
        its worst case to the ledger's budget (rows another runner is taking over are its)."""
        sql = self.dialect._claim_sql
        self._exec(tx, sql(ABANDON_CLAIMS_SQL), (owner,))
        held = self._exec(tx, sql(HELD_SQL), (owner,)).fetchone()[0]
        if held:
            self._exec(tx, BUDGET_ABANDON_SQL, (held, held, held))
        return self._exec(tx, sql(ABANDON_SQL), (now(), json.dumps([ABANDONED]),
                                                 owner)).rowcount

    def reap(self) -> int:
        """Abandon the claims and in-flight receipts of every gone owner (each run starts so): a
        gone claim holder, or an owner of receipts in flight on this host whose process (or run)
        is gone; how many receipts were abandoned."""
        with self.transaction() as tx:
            at = self._clock(tx)
            holders = self._exec(tx, "SELECT owner, MAX(host), MAX(pid), MAX(lease_expires_at) "
                                 "FROM claims GROUP BY owner").fetchall()
            gone = {r[0] for r in holders if _owner_gone(*r, at)}
            for (owner,) in self._exec(tx, "SELECT DISTINCT owner FROM attempts WHERE status = "
                                       "'in_flight' AND owner IS NOT NULL").fetchall():
                parts = owner.split("/")
                if (owner not in gone and len(parts) == 4 and parts[0] == HOST
                        and parts[1].isdigit()
                        and _owner_gone(owner, HOST, int(parts[1]), None, at)):
                    gone.add(owner)
            return sum(self._abandon(tx, owner) for owner in gone)

    def taken(self, keys: Sequence[str], owner: Owner) -> tuple[set[str], set[str]]:
        """Of ``keys``: those accepted, and those another live runner holds a claim on (a read:
        a gone runner's claim is left for ``begin_call_later`` to take over)."""
        accepted = self.accepted_keys(keys)
        rows = self._by_keys("SELECT request_key, owner, host, pid, lease_expires_at FROM "
                             "claims WHERE request_key IN ({marks})", keys)
        at = self._clock(None) if rows else 0.0
        held = {r[0] for r in rows if r[1] != owner.id and r[0] not in accepted
                and not _owner_gone(r[1], r[2], r[3], r[4], at)}
        return accepted, held

    def claims(self, tx: Tx, owner: Owner, action: Literal["renew", "release"],
               request_key: str | None = None) -> None:
        """``owner``'s claims, in ``tx``: every lease renewed (one being taken over is skipped),
        or given up, on ``request_key`` or every one."""
        if action == "renew":
            self._exec(tx, self.dialect._claim_sql(RENEW_SQL), (self.lease_seconds, owner.id))
        elif request_key is None:
            self._exec(tx, "DELETE FROM claims WHERE owner = ?", (owner.id,))
        else:
            self._exec(tx, "DELETE FROM claims WHERE request_key = ? AND owner = ?",
                       (request_key, owner.id))

    # -- completing a receipt ------------------------------------------------------------------
    def complete_call(self, tx: Tx, attempt_id: int, status: str, raw: str | None,
                      usage: Mapping[str, Any], *, errors: Sequence[Mapping] = (),
                      accepted: tuple[int, str, Mapping[str, str]] | None = None,
                      sent_at: str | None = None, charge: float | None = None,
                      parts: Parts | None = None) -> bool | None:
        """Complete a receipt in ``tx``: an accepted (or 'partial', split into ``parts``) return
        admits its items (``accepted``: batch id, request key, JSON texts), never re-pointing a
        checkpoint row (another runner's admitted first: kept as paid, admitting nothing); any
        other ``status`` keeps its ``errors``. ``charge``: its cost to the ledger's budget.
        Whether a partial return split its request (None for any other)."""
        if (status in ("accepted", "partial")) != (accepted is not None) or (
                status == "partial") != (parts is not None):
            raise ValueError("an accepted or partial return, and only one, names its items "
                             "(accepted=), a partial one its parts (parts=)")
        if parts is not None:
            return self._complete_partial(tx, attempt_id, accepted[0], accepted[2], parts, raw,
                                          usage, errors, sent_at, charge)
        if accepted is not None:
            self._accept_call(tx, attempt_id, *accepted, raw, usage, sent_at, charge)
        else:
            self._complete(tx, attempt_id, status, errors, raw, usage, sent_at=sent_at,
                           charge=charge)
        return None

    def _accept_call(self, tx: Tx, attempt_id: int, batch_id: int, request_key: str,
                     items: Mapping[str, str], raw: str, usage: Mapping[str, Any],
                     sent_at: str | None, charge: float | None) -> None:
        self._admitting(tx, request_key)
        stamp = now()
        rows = [(batch_id, request_key, task_id, attempt_id, item, stamp, request_key)
                for task_id, item in items.items()]
        added = (self._exec(tx, CHECKPOINT_WHOLE_SQL, rows[0]) if len(rows) == 1
                 else self._many(tx, CHECKPOINT_WHOLE_SQL, rows)).rowcount
        if rows and added == 0:  # another return came first, whole or in part
            first = self._exec(tx, FIRST_ADMITTED_SQL, (request_key, batch_id, request_key)
                               ).fetchone()[0]
            self._complete(tx, attempt_id, "rejected", _already_accepted(first), raw, usage,
                           stamp, sent_at, charge)
            return
        self._complete(tx, attempt_id, "accepted", (), raw, usage, stamp, sent_at, charge)

    def _complete_partial(self, tx: Tx, attempt_id: int, batch_id: int,
                          items: Mapping[str, str], parts: Parts, raw: str,
                          usage: Mapping[str, Any], errors: Sequence[Mapping],
                          sent_at: str | None, charge: float | None) -> bool:
        """A 'partial' receipt (raw whole, the rejected items' ``errors``), its request split into
        ``kept`` and ``rest``; ``kept`` gets a derived accepted receipt of cost 0, as a recheck
        does, and its checkpoint rows, so every reading of "accepted" and "owed" holds. A request
        another runner's return admitted meanwhile, whole or in part (a late return after its
        claim was taken over), is not split: this one is kept as paid, admitting nothing."""
        stamp = now()
        revision_id, parent, kept, rest, kept_raw = parts
        self._admitting(tx, parent.key)
        first = self._exec(tx, FIRST_ADMITTED_SQL, (parent.key, batch_id, parent.key)
                           ).fetchone()[0]
        if first is not None:
            self._complete(tx, attempt_id, "rejected", _already_accepted(first), raw, usage,
                           stamp, sent_at, charge)
            return False
        self._complete(tx, attempt_id, "partial", errors, raw, usage, stamp, sent_at, charge)
        if not self._split_request(tx, revision_id, parent, kept, rest):
            return True
        derived = self._insert(tx, PARTIAL_SQL, (kept.key, kept.task_ids_json,
                                                 self._raw(kept_raw), stamp, stamp, _uid(),
                                                 attempt_id))
        self._exec(tx, "INSERT INTO rechecks(attempt_id, from_attempt) VALUES (?, ?)",
                   (derived, attempt_id))
        self._many(tx, CHECKPOINT_SQL, [(batch_id, kept.key, task_id, derived, item, stamp)
                                        for task_id, item in items.items()])
        return True

    def _complete(self, tx: Tx, attempt_id: int, status: str, errors: Sequence[Mapping],
                  raw: str | None, usage: Mapping[str, Any], stamp: str | None = None,
                  sent_at: str | None = None, charge: float | None = None) -> None:
        self._exec(tx, _COMPLETE_BY_VALUES, (
            status, json.dumps(list(errors)) if errors else "[]",
            *self._completion(tx, attempt_id, raw, usage, stamp, sent_at, charge)))

    def _completion(self, tx: Tx, attempt_id: int, raw: str | None, usage: Mapping[str, Any],
                    stamp: str | None, sent_at: str | None, charge: float | None) -> tuple:
        """``COMPLETE_SQL``'s values after its status and errors; the charge settled first."""
        # an 'abandoned' receipt may still be completed: its owner came back with the answer
        if charge is not None:
            self._exec(tx, BUDGET_SETTLE_SQL, (charge, attempt_id))
        cost = usage.get("cost")
        if cost is not None and not (isinstance(cost, (int, float)) and math.isfinite(cost)
                                     and cost >= 0):
            cost = None  # a NaN or negative cost is no cost at all; the account says unknown
        return (self._raw(raw), usage.get("input_tokens"), usage.get("output_tokens"),
                usage.get("cached_tokens"), cost, usage.get("model"), stamp or now(), sent_at,
                attempt_id)

    # -- the ledger's own cost budget -------------------------------------------------------
    def _shared_budget(self) -> dict[str, Any] | None:
        rows = self._read("SELECT cost, spent, reserved, set_at, set_by FROM budget WHERE id = 1")
        if not rows:
            return None
        row = dict(rows[0])
        return {**row, "left": max(0.0, row["cost"] - row["spent"] - row["reserved"])}

    def _set_shared_budget(self, cost: float | None, *, by: str, stamp: str) -> None:
        with self.transaction() as tx:
            if cost is None:
                self._exec(tx, "DELETE FROM budget WHERE id = 1")
                self._exec(tx, "UPDATE attempts SET reserved = NULL WHERE reserved IS NOT NULL "
                           "AND status IN ('in_flight', 'abandoned')")
                return
            self._exec(tx, "INSERT INTO budget(id, cost, spent, reserved, set_at, set_by) "
                       "VALUES (1, ?, 0, 0, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                       "cost = excluded.cost, set_at = excluded.set_at, "
                       "set_by = excluded.set_by", (cost, stamp, by))

    def _reserve_shared(self, tx: Tx, attempt_id: int, amount: float | None,
                        budgeted: bool | None = None) -> bool:
        """Reserve ``amount`` (None: not priced) for the receipt just written, in ``tx``: False
        when the ledger has a budget that cannot hold it (``budgeted``: if already read)."""
        if budgeted is not False:
            if amount is not None and self._exec(tx, BUDGET_RESERVE_SQL,
                                                 (amount, amount)).fetchall():
                return True
            if self._budgeted(tx):
                return False
        if amount is not None:
            self._exec(tx, "UPDATE attempts SET reserved = NULL WHERE id = ?", (attempt_id,))
        return True

    # -- the live hosts, sharing the rate limits ---------------------------------------------
    def hosts(self, tx: Tx, owner: Owner, *, leaving: bool = False) -> tuple[int, int]:
        """Renew ``owner``'s row, or delete it when ``leaving``; then the hosts alive: how many,
        and ``owner``'s place among them in the order of their ids. Gone hosts' rows are deleted
        in one order, so no two hosts wait on each other in a circle."""
        at = self._clock(tx)
        if not leaving:
            self._exec(tx, HOST_JOIN_SQL, (owner.id, owner.host, owner.pid,
                                           at + self.lease_seconds, now()))
        rows = self._exec(tx, "SELECT owner, host, pid, lease_expires_at FROM hosts").fetchall()
        gone = {row[0] for row in rows if row[0] != owner.id
                and _owner_gone(row[0], row[1], row[2], row[3], at)}
        if leaving:  # its own row among the others', in the same order: two hosts leaving
            gone.add(owner.id)  # together would otherwise each hold one and wait on the other
        for name in sorted(gone):
            self._exec(tx, "DELETE FROM hosts WHERE owner = ?", (name,))
        alive = sorted({row[0] for row in rows} - gone)
        return len(alive), bisect_left(alive, owner.id)

    def rate_limits(self, tx: Tx, account: str, model: str,
                    learnt: tuple[int | None, int | None] | None = None
                    ) -> tuple[int | None, int | None, float] | None:
        """The requests and tokens per minute last learnt for ``model`` on ``account`` and their
        age by the ledger's clock, or None; with ``learnt``, those are kept instead."""
        at = self._clock(tx)
        if learnt is not None:
            self._exec(tx, LIMITS_KEEP_SQL, (account, model, *learnt, at))
            return None
        row = self._exec(tx, "SELECT requests_per_minute, tokens_per_minute, learnt_at FROM "
                         "rate_limits WHERE account = ? AND model = ?", (account, model)
                         ).fetchone()
        return None if row is None else (row[0], row[1], max(0.0, at - row[2]))


def _already_accepted(first: Any) -> list[dict[str, Any]]:
    """The error of a paid return whose request another runner's attempt ``first`` admitted."""
    return [{"type": "already_accepted", "task_id": None,
             "message": f"attempt {first} of another runner was admitted first; this "
             "return was paid for but admits nothing"}]


# Completing a receipt; ``{status}`` and ``{errors}`` are SQL (each a parameter, in SQLite).
COMPLETE_SQL = (
    "UPDATE attempts SET status = {status}, errors = {errors}, raw = ?, input_tokens = ?, "
    "output_tokens = ?, cached_tokens = ?, cost = ?, model = COALESCE(?, model), "
    "finished_at = ?, sent_at = COALESCE(?, sent_at) WHERE id = ? "
    "AND status IN ('in_flight', 'abandoned')")
_COMPLETE_BY_VALUES = COMPLETE_SQL.format(status="?", errors="?")

# An accepted return's rows, unless its request was accepted in part meanwhile (a late return
# after its claim was taken over: the parts hold its items); and the receipt admitted first.
CHECKPOINT_WHOLE_SQL = CHECKPOINT_SQL.replace(
    "VALUES (?,?,?,?,?,?)", "SELECT ?,?,?,?,?,? WHERE NOT EXISTS (SELECT 1 FROM attempts WHERE "
    "request_key = ? AND status = 'partial')")
FIRST_ADMITTED_SQL = (
    "SELECT COALESCE((SELECT MIN(attempt_id) FROM checkpoint WHERE request_key = ? AND "
    "batch_id = ?), (SELECT MIN(id) FROM attempts WHERE request_key = ? AND status = "
    "'partial'))")

# The accepted part of a partial return: a receipt of no call, from the call that answered.
PARTIAL_SQL = (
    "INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, status, errors, "
    "raw, input_tokens, output_tokens, cached_tokens, cost, provider, model, started_at, "
    "finished_at, uid, source, sent_at) SELECT batch_id, revision_id, ?, ?, 'recheck', "
    "'accepted', '[]', ?, 0, 0, 0, 0.0, provider, model, ?, ?, ?, source, sent_at "
    "FROM attempts WHERE id = ?")

# An in-flight receipt: its columns, in the order ``begin_call_later`` gives them.
RECEIPT_COLUMNS = ("batch_id", "revision_id", "request_key", "task_ids", "kind", "provider",
                   "model", "started_at", "uid", "owner", "estimated_input_tokens",
                   "cost_floor", "source", "reserved")
RECEIPT_INTO = f"INSERT INTO attempts(status, {', '.join(RECEIPT_COLUMNS)}) VALUES ('in_flight', "
RECEIPT_SQL = RECEIPT_INTO + ",".join("?" * len(RECEIPT_COLUMNS)) + ")"

# The claim protocol's statements, written once, decided by the ledger's clock (``{now}``);
# ``{lock}``: PostgreSQL locks the rows a read decides on and skips those another runner is
# deciding on, where SQLite's BEGIN IMMEDIATE already serialises writers.
CLAIM_INTO = ("INSERT INTO claims(request_key, owner, host, pid, session, attempt_id, "
              "lease_expires_at, claimed_at) ")
# A request accepted in part ('partial') is never claimed again: its parts are other requests.
TAKE_SQL = (
    CLAIM_INTO + "SELECT ?,?,?,?,?,?,?,? WHERE NOT EXISTS (SELECT 1 FROM attempts WHERE "
    "request_key = ? AND status IN ('accepted', 'partial')) ON CONFLICT(request_key) DO "
    "UPDATE SET attempt_id = excluded.attempt_id, lease_expires_at = excluded.lease_expires_at "
    "WHERE claims.owner = excluded.owner")
TAKE_UNBUDGETED_SQL = TAKE_SQL.replace(" ON CONFLICT", " AND NOT EXISTS (SELECT 1 FROM budget "
                                       "WHERE id = 1) ON CONFLICT", 1)
HOLDER_SQL = (
    "SELECT (SELECT MIN(status) FROM attempts WHERE request_key = ? AND status IN "
    "('accepted', 'partial')), owner, host, pid, lease_expires_at, {now} "
    "FROM (SELECT 1) AS one "
    "LEFT JOIN claims ON request_key = ?")
LOCK_HOLDER_SQL = "SELECT 1 FROM claims WHERE request_key = ? AND owner = ?{lock}"
HOLD_SQL = CLAIM_INTO + "VALUES (?, ?, ?, ?, ?, ?, {now} + ?, ?)"
ABANDON_CLAIMS_SQL = ("DELETE FROM claims WHERE request_key IN (SELECT request_key FROM claims "
                      "WHERE owner = ?{lock})")
_GONE = "SELECT id FROM attempts WHERE owner = ? AND status = 'in_flight'{lock}"
HELD_SQL = f"SELECT COALESCE(SUM(reserved), 0) FROM attempts WHERE id IN ({_GONE})"
ABANDON_SQL = (f"UPDATE attempts SET status = 'abandoned', finished_at = ?, errors = ? "
               f"WHERE id IN ({_GONE})")
RENEW_SQL = ("UPDATE claims SET lease_expires_at = {now} + ? WHERE request_key IN (SELECT "
             "request_key FROM claims WHERE owner = ?{lock})")

# The ledger's budget is one row (id 1) while it is set.
BUDGET_RESERVE_SQL = ("UPDATE budget SET reserved = reserved + ? WHERE id = 1 "
                      "AND spent + reserved + ? <= cost RETURNING id")

# Settling a receipt (charged its cost, else worst case, before its status changes): what it held
# in flight comes off ``reserved``; its charge goes to ``spent``, less what was charged when it
# was abandoned.
BUDGET_SETTLE_SQL = (
    "UPDATE budget SET "
    "reserved = CASE WHEN reserved > a.held THEN reserved - a.held ELSE 0 END, "
    "spent = spent + ? - a.charged FROM (SELECT "
    "CASE WHEN status = 'in_flight' THEN reserved ELSE 0 END AS held, "
    "CASE WHEN status = 'abandoned' THEN reserved ELSE 0 END AS charged FROM attempts "
    "WHERE id = ? AND reserved IS NOT NULL AND status IN ('in_flight', 'abandoned')) AS a "
    "WHERE budget.id = 1")

# Receipts of a runner that is gone are charged their worst case: nothing says they cost less.
BUDGET_ABANDON_SQL = ("UPDATE budget SET reserved = CASE WHEN reserved > ? THEN reserved - ? "
                      "ELSE 0 END, spent = spent + ? WHERE id = 1")

HOST_JOIN_SQL = ("INSERT INTO hosts(owner, host, pid, lease_expires_at, joined_at) "
                 "VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET "
                 "lease_expires_at = excluded.lease_expires_at")

LIMITS_KEEP_SQL = ("INSERT INTO rate_limits(account, model, requests_per_minute, "
                   "tokens_per_minute, learnt_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (account, "
                   "model) DO UPDATE SET requests_per_minute = excluded.requests_per_minute, "
                   "tokens_per_minute = excluded.tokens_per_minute, learnt_at = excluded.learnt_at")
