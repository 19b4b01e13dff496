"""Forgetting a batch: its evidence stops owing calls; its account stays whole.

An abandoned batch with unresolved requests owes calls forever (``%batch_status``,
``minimum_exact_retry_calls``, a strict session's validator, an RLM host's gate). Forgetting
marks every revision of the batch that still owes as forgotten, in one transaction, and records
who forgot it, when, how, and what it stopped owing. Receipts, costs and accepted values are
untouched. A later run of the same content reopens its revision, which owes again; new content
opens a new revision as always.

Only a person forgets: ``batchjson forget`` and ``%batch_forget`` offer it. No RLM helper does,
and the ``Session`` has no method for it, so a model cannot clear its own gate through the
names it is given.
"""

from __future__ import annotations

import getpass
import json
import socket
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import InvalidBatch
from ._ledger import Ledger
from ._records import now
from ._result import money


def who() -> str:
    """``user@host`` for the record; a missing user name (some containers) is said so."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no USER/LOGNAME and no passwd entry
        user = "unknown-user"
    return f"{user}@{socket.gethostname() or 'unknown-host'}"


def forget_batch(ledger: Ledger, name: str, *, via: str, by: str | None = None
                 ) -> dict[str, Any] | None:
    """Stop every revision of batch ``name`` that owes requests from owing them.

    Returns the record (batch, revisions, requests, items, by, via, at), or None when the batch
    owes nothing (then nothing is recorded). An unknown name is an InvalidBatch listing the
    batches there are."""
    problem = ledger.no_such_batch(name)
    if problem:
        raise InvalidBatch(problem)
    stamp, by = now(), by or who()
    with ledger.transaction() as db:
        owed = [r for r in ledger.unresolved() if r["batch"] == name]
        if not owed:
            return None
        revisions = sorted({r["revision"] for r in owed})
        items = len({t for r in owed for t in json.loads(r["task_ids"])})
        batch_id = db.execute("SELECT id FROM batches WHERE name = ?", (name,)).fetchone()[0]
        forget_id = db.execute(
            "INSERT INTO forgets(batch_id, forgotten_at, forgotten_by, via, revisions, requests, "
            "items) VALUES (?,?,?,?,?,?,?)",
            (batch_id, stamp, by, via, json.dumps(revisions), len(owed), items)).lastrowid
        db.execute(f"UPDATE revisions SET forget_id = ? WHERE batch_id = ? AND number IN "
                   f"({','.join('?' * len(revisions))})", (forget_id, batch_id, *revisions))
    return {"batch": name, "revisions": revisions, "requests": len(owed), "items": items,
            "by": by, "via": via, "at": stamp}


def carry_forgets(db: sqlite3.Connection, forgets: Sequence[Mapping[str, Any]],
                  revisions: Sequence[Mapping[str, Any]], revision_map: Mapping[int, int],
                  batch_map: Mapping[int, int]) -> None:
    """Merging: revisions another ledger had forgotten stay forgotten here, under a copy of
    its record (who, when, how), renumbered as the revisions were; in the merge's transaction."""
    by_id = {f["id"]: f for f in forgets}
    carried: dict[int, int] = {}
    for r in revisions:
        record = by_id.get(r["forget_id"])
        if record is None:
            continue
        if record["id"] not in carried:
            carried[record["id"]] = db.execute(
                "INSERT INTO forgets(batch_id, forgotten_at, forgotten_by, via, revisions, "
                "requests, items) VALUES (?,?,?,?,?,?,?)",
                (batch_map[record["batch_id"]], record["forgotten_at"], record["forgotten_by"],
                 record["via"], "[]", record["requests"], record["items"])).lastrowid
        db.execute("UPDATE revisions SET forget_id = ? WHERE id = ?",
                   (carried[record["id"]], revision_map[r["id"]]))
    for ours in carried.values():
        numbers = [n for (n,) in db.execute("SELECT number FROM revisions WHERE forget_id = ? "
                                            "ORDER BY number", (ours,))]
        db.execute("UPDATE forgets SET revisions = ? WHERE id = ?", (json.dumps(numbers), ours))


def forgotten(ledger: Ledger, name: str | None = None) -> list[dict[str, Any]]:
    """Every forgetting on record (of one batch, or all), oldest first; ``in_effect`` says how
    many of its revisions still stand forgotten (a later run of one reopens it)."""
    rows = ledger._rows(
        "SELECT b.name, f.forgotten_at, f.forgotten_by, f.via, f.revisions, f.requests, f.items,"
        " (SELECT COUNT(*) FROM revisions r WHERE r.forget_id = f.id) AS in_effect "
        "FROM forgets f JOIN batches b ON b.id = f.batch_id"
        + (" WHERE b.name = ?" if name is not None else "") + " ORDER BY f.id",
        (name,) if name is not None else ())
    return [{"batch": r[0], "at": r[1], "by": r[2], "via": r[3], "revisions": json.loads(r[4]),
             "requests": r[5], "items": r[6], "in_effect": r[7]} for r in rows]


def forgotten_line(f: dict[str, Any]) -> str:
    """One line for status: what was forgotten, by whom, when, and whether it still stands."""
    revs = ", ".join(map(str, f["revisions"]))
    state = "" if f["in_effect"] else "; owed again since a later run reopened it"
    return (f"{f['batch']} revision(s) {revs}: {f['requests']} request(s), {f['items']} item(s) "
            f"no longer owed, forgotten by {f['by']} via {f['via']} at {f['at'][:19]}Z{state}")


def forget_message(name: str, record: dict[str, Any] | None, spend: dict[str, Any]) -> str:
    """What a face says after forgetting (the CLI and the magic say the same)."""
    if record is None:
        return f"batch {name!r} owes nothing, so nothing was forgotten"
    revs = ", ".join(map(str, record["revisions"]))
    return (f"forgot batch {name!r}: revision(s) {revs} no longer owe {record['requests']} "
            f"request(s) ({record['items']} item(s)); recorded as forgotten by {record['by']} "
            f"at {record['at'][:19]}Z. Its {spend['calls']} call(s) and their cost "
            f"({money(spend['cost'])}) stay in the account, and a later run of {name!r} owes "
            "again.")
