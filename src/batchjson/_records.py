"""The ledger's rows as Python values: receipts, revisions, ids and timestamps.

Kept apart from :mod:`batchjson._ledger` (which writes and queries) so the shapes a reader
meets, and the one timestamp format every record uses, live in one small place.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ._migrations import SCHEMA_VERSION

_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def now() -> str:
    """The time as ISO 8601 UTC with microseconds (``datetime.isoformat``'s form); every call
    writes three or four, so the date and time of day are formatted once a second."""
    global _second
    second, fraction = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _second
    if cached[0] != second:
        cached = _second = (second, datetime.fromtimestamp(second, UTC).strftime(
            "%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{fraction:06d}+00:00"


@dataclass(frozen=True)
class Receipt:
    """One attempt as the ledger holds it."""

    id: int
    batch: str
    revision: int
    request_key: str
    task_ids: tuple[str, ...]
    kind: str
    status: str
    errors: list[dict[str, Any]]
    raw: str | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    cost: float | None
    provider: str | None
    model: str | None
    started_at: str
    finished_at: str | None
    source: str | None = None  # the answer source (providers.base.answer_source)
    sent_at: str | None = None  # None: the call was never sent (it cost nothing)

    @property
    def tokens(self) -> int:
        return (self.input_tokens or 0) + (self.output_tokens or 0)


@dataclass(frozen=True)
class Revision:
    id: int
    batch_id: int
    batch: str
    number: int
    fingerprint: str
    components: dict[str, str]
    status: str
    supersede_reason: str | None
    validator_name: str | None
    created_at: str


def ledger_problem(path: Path) -> str | None:
    """Why the file at ``path`` cannot be read as a ledger, or None; it is opened read-only,
    so a wrong path is never turned into a ledger by the migrations."""
    if not path.exists():
        return f"no ledger at {path}"
    if path.is_dir():
        return f"{path} is a directory; pass --ledger with the ledger file inside it"
    try:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return f"{path} is not a SQLite file, so not a batchjson ledger"
    if version == 0 or "attempts" not in tables:
        return f"{path} is a SQLite file but not a batchjson ledger"
    if version > SCHEMA_VERSION:
        return (f"{path} has ledger schema version {version} but this batchjson knows up to "
                f"{SCHEMA_VERSION}; upgrade batchjson to read it")
    return None



def _revision(row: sqlite3.Row) -> Revision:
    return Revision(row["id"], row["batch_id"], row["batch"], row["number"], row["fingerprint"],
                    json.loads(row["components"]), row["status"], row["supersede_reason"],
                    row["validator_name"], row["created_at"])


def _receipt(row: sqlite3.Row) -> Receipt:
    return Receipt(row["id"], row["batch"], row["revision"], row["request_key"],
                   tuple(json.loads(row["task_ids"])), row["kind"], row["status"],
                   json.loads(row["errors"]) if row["errors"] else [], row["raw"],
                   row["input_tokens"], row["output_tokens"], row["cached_tokens"], row["cost"],
                   row["provider"], row["model"], row["started_at"], row["finished_at"],
                   row["source"], row["sent_at"])


def _uid() -> str:
    """A receipt's global id (for merging ledgers): time-ordered like UUIDv7, 64 random bits, so
    new ids append to the unique index instead of touching a random page of it each time. The
    bits come from ``random`` (seeded from the OS, and reseeded in a forked child): an id must
    be unique, not secret, and a system call per receipt is slow on a busy machine."""
    return f"{time.time_ns():016x}{random.getrandbits(64):016x}"
