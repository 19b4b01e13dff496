"""What every store is made of: the ledger's schema and what SQLite and PostgreSQL spell
differently (``Dialect``), each said once; the ``store_*`` modules write their SQL once, and each
database's store opens transactions and runs statements. A statement marks parameters ``?``
(never inside a literal); a claim's say ``{lock}`` and ``{now}``. A ledger at another schema
version is refused, never converted."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

from .._errors import LedgerError

SCHEMA_VERSION = 14


def _version_problem(version: Any, ledger: str | None) -> str | None:
    """What to do with a ledger at schema ``version`` (named ``ledger``); None: it is read."""
    if version == SCHEMA_VERSION:
        return None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return (f"schema version {version} is newer than this batchjson knows "
                f"({SCHEMA_VERSION}); upgrade batchjson to read it (nothing was changed)")
    export = "batchjson export --jsonl" + (f" --ledger {ledger}" if ledger else "")
    return (f"ledger schema version {version} was written by an earlier batchjson; this "
            f"batchjson reads only schema {SCHEMA_VERSION} and does not convert older ledgers "
            "(nothing was changed). Keep using the batchjson that wrote it, or export its "
            f"receipts with that version ({export} > receipts.jsonl) and import them into a "
            "new ledger (batchjson import receipts.jsonl --ledger NEW)")

# The tables of docs/design.md; times are ISO 8601 UTC text. Rows written with every call are
# WITHOUT ROWID (one b-tree page written, not two); the key index leaves out status (which every
# call changes); ``requests_in_order`` makes each page of a revision's values one index range.
# A CHECK lists its values with OR: SQLite builds a b-tree of an IN list of more than two
# constants for every row it checks.
TABLES = """
CREATE TABLE batches (
    id {id}, name TEXT NOT NULL UNIQUE, current_revision {int},
    created_at TEXT NOT NULL);
CREATE TABLE forgets (
    id {id}, batch_id {int} NOT NULL REFERENCES batches(id),
    forgotten_at TEXT NOT NULL, forgotten_by TEXT NOT NULL, via TEXT NOT NULL,
    revisions TEXT NOT NULL, requests {int} NOT NULL, items {int} NOT NULL);
CREATE TABLE revisions (
    id {id}, batch_id {int} NOT NULL REFERENCES batches(id),
    number {int} NOT NULL, fingerprint TEXT NOT NULL, components TEXT NOT NULL,
    validator_name TEXT, validator_version {int}, validator_fingerprint TEXT,
    status TEXT NOT NULL CHECK (status IN ('open', 'superseded')),
    superseded_by {int} REFERENCES revisions(id), supersede_reason TEXT,
    created_at TEXT NOT NULL, forget_id {int} REFERENCES forgets(id),
    UNIQUE (batch_id, number), UNIQUE (batch_id, fingerprint));
CREATE TABLE requests (
    id {id}, revision_id {int} NOT NULL REFERENCES revisions(id),
    key TEXT NOT NULL, position {int} NOT NULL, parent_key TEXT,
    task_ids TEXT NOT NULL, tasks TEXT NOT NULL, split {int} NOT NULL DEFAULT 0,
    UNIQUE (revision_id, key));
CREATE INDEX requests_in_order ON requests (revision_id, position, id);
CREATE TABLE attempts (
    id {id}, batch_id {int} NOT NULL REFERENCES batches(id),
    revision_id {int} NOT NULL REFERENCES revisions(id), request_key TEXT NOT NULL,
    task_ids TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind = 'initial' OR kind = 'repair' OR kind = 'replay'
        OR kind = 'split' OR kind = 'recheck' OR kind = 'import'),
    status TEXT NOT NULL CHECK (status = 'in_flight' OR status = 'accepted'
        OR status = 'partial' OR status = 'rejected' OR status = 'provider_error'
        OR status = 'cancelled' OR status = 'abandoned'),
    errors TEXT, raw {raw}, input_tokens {int}, output_tokens {int},
    cached_tokens {int}, cost {real}, provider TEXT, model TEXT,
    started_at TEXT NOT NULL, finished_at TEXT,
    uid TEXT NOT NULL UNIQUE, sent_at TEXT, owner TEXT, source TEXT,
    estimated_input_tokens {int}, cost_floor {real}, reserved {real});
CREATE INDEX attempts_by_key ON attempts (request_key);
CREATE INDEX attempts_by_batch ON attempts (batch_id, id);
CREATE INDEX attempts_in_flight ON attempts (owner) WHERE status = 'in_flight';
CREATE TABLE checkpoint (
    batch_id {int} NOT NULL REFERENCES batches(id), request_key TEXT NOT NULL,
    task_id TEXT NOT NULL, attempt_id {int} NOT NULL REFERENCES attempts(id),
    item TEXT NOT NULL, committed_at TEXT NOT NULL,
    PRIMARY KEY (request_key, task_id, batch_id)){rowid};
CREATE TABLE claims (
    request_key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL,
    pid {int} NOT NULL, session TEXT NOT NULL, attempt_id {int},
    lease_expires_at {real} NOT NULL, claimed_at TEXT NOT NULL){rowid};
CREATE TABLE imports (
    digest TEXT PRIMARY KEY, attempt_id {int} REFERENCES attempts(id),
    source TEXT, line {int}, outcome TEXT NOT NULL, imported_at TEXT NOT NULL);
CREATE TABLE validators (
    name TEXT NOT NULL, version {int} NOT NULL, fingerprint TEXT NOT NULL,
    where_defined TEXT, defined_at TEXT NOT NULL, by_identity TEXT,
    PRIMARY KEY (name, fingerprint), UNIQUE (name, version));
CREATE TABLE seen (request_key TEXT PRIMARY KEY, seen_key TEXT NOT NULL);
CREATE INDEX seen_by_seen_key ON seen (seen_key);
CREATE TABLE task_files (
    digest TEXT PRIMARY KEY, tasks TEXT NOT NULL, count {int} NOT NULL,
    fields TEXT NOT NULL);
CREATE TABLE rechecks (
    attempt_id {int} PRIMARY KEY REFERENCES attempts(id),
    from_attempt {int} NOT NULL REFERENCES attempts(id));
CREATE TABLE jobs (
    id {id}, uid TEXT NOT NULL UNIQUE, protocol TEXT NOT NULL,
    provider_job_id TEXT, status TEXT NOT NULL CHECK (status = 'recording' OR status = 'open'
        OR status = 'uncertain' OR status = 'ended' OR status = 'cancelled'),
    batch_id {int} NOT NULL REFERENCES batches(id),
    revision_id {int} NOT NULL REFERENCES revisions(id), model TEXT, endpoint TEXT,
    requests {int} NOT NULL, reserved {real} NOT NULL, owner TEXT NOT NULL, host TEXT NOT NULL,
    pid {int} NOT NULL, created_at TEXT NOT NULL, submitted_at TEXT, ended_at TEXT,
    detail TEXT, plan TEXT, lease_expires_at {real});
CREATE TABLE job_lines (
    custom_id TEXT PRIMARY KEY, job_id {int} NOT NULL REFERENCES jobs(id),
    attempt_id {int} NOT NULL UNIQUE REFERENCES attempts(id), request_key TEXT NOT NULL,
    wrapped {int} NOT NULL, reserved {real} NOT NULL){rowid};
CREATE INDEX job_lines_by_job ON job_lines (job_id);
CREATE TABLE budget (
    id {int} PRIMARY KEY CHECK (id = 1), cost {real} NOT NULL, spent {real} NOT NULL,
    reserved {real} NOT NULL, set_at TEXT NOT NULL, set_by TEXT NOT NULL);
CREATE TABLE hosts (
    owner TEXT PRIMARY KEY, host TEXT NOT NULL, pid {int} NOT NULL,
    lease_expires_at {real} NOT NULL, joined_at TEXT NOT NULL){rowid};
CREATE TABLE rate_limits (
    account TEXT NOT NULL, model TEXT NOT NULL, requests_per_minute {int},
    tokens_per_minute {int}, learnt_at {real} NOT NULL, PRIMARY KEY (account, model)){rowid};
"""

# What a merge brings in from another ledger, table by table, ordered as its rows were written.
MERGED = {**dict.fromkeys(("batches", "revisions", "requests", "attempts", "forgets", "jobs"),
                          "id"), "validators": "name, version", "imports": "imported_at, digest",
          "checkpoint": "attempt_id, task_id"}

# What only a server with writers side by side needs, and the schema's version (SQLite keeps it
# in PRAGMA user_version).
SERVER_TABLES = f"""
CREATE INDEX requests_by_key ON requests (key, id);
CREATE INDEX claims_by_owner ON claims (owner);
CREATE INDEX checkpoint_by_attempt ON checkpoint (attempt_id);
CREATE TABLE batchjson_schema (version INTEGER NOT NULL);
INSERT INTO batchjson_schema(version) VALUES ({SCHEMA_VERSION});
"""


@dataclass(frozen=True)
class Dialect:
    """How one database spells the schema and the statements; ``_sql`` renders a statement."""

    name: str
    types: dict[str, str]  # the schema's open type words
    server_tables: str  # what this database adds to the schema, its version last
    mark: str  # a parameter
    lock: str  # appended to a read that decides on a claim (``store_calls``)
    now: str  # seconds since the epoch by the clock every runner of the ledger reads
    json_valid: str  # true when the text ``{}`` is one JSON text
    json_length: str  # the length of the JSON array held as text in ``{}``
    keys_as_array: bool  # a list of keys bound as one array (``IN (SELECT unnest(?[]))``)
    # a list bound as one array, written ``?[]`` (PostgreSQL's binary form: a list of strings
    # dumped as text is escaped one element at a time in Python, some 40 times the cost)
    array_mark: str = "?"

    @property
    def _schema(self) -> str:
        return TABLES.format_map(self.types) + self.server_tables

    def _sql(self, statement: str) -> str:
        """``statement`` (``?`` parameters, ``?[]`` arrays) as this database reads it; rendered
        once."""
        return statement if self.mark == "?" else _marked(statement, self.mark, self.array_mark)

    def _claim_sql(self, template: str) -> str:
        """A claim's statement, its ``{lock}`` and ``{now}`` spelled once for this database."""
        return _spelled(template, self.lock, self.now)

    def _bind(self, keys: list[Any]) -> tuple[str, tuple[Any, ...]]:
        """``{marks}`` of ``IN ({marks})`` for ``keys`` (not empty), and its arguments."""
        if not self.keys_as_array:
            return ",".join("?" * len(keys)), tuple(keys)
        return ("SELECT unnest(?[]::text[])" if isinstance(keys[0], str)
                else "SELECT unnest(?[])"), (keys,)


@cache
def _marked(statement: str, mark: str, array_mark: str) -> str:
    return statement.replace("%", "%%").replace("?[]", array_mark).replace("?", mark)


@cache
def _spelled(template: str, lock: str, now: str) -> str:
    return template.format(lock=lock, now=now)


SQLITE = Dialect(
    "sqlite", {"id": "INTEGER PRIMARY KEY", "int": "INTEGER", "real": "REAL", "raw": "TEXT",
               "rowid": " WITHOUT ROWID"}, f"PRAGMA user_version = {SCHEMA_VERSION};", "?", "",
    "((julianday('now') - 2440587.5) * 86400.0)", "json_valid({})", "json_array_length({})",
    keys_as_array=False)

# ids from sequences, whole numbers BIGINT, REAL double precision, raw provider text bytea
# (``text`` cannot hold NUL, ``jsonb`` reorders keys and refuses NaN)
POSTGRES = Dialect(
    "postgres", {"id": "BIGSERIAL PRIMARY KEY", "int": "BIGINT", "real": "DOUBLE PRECISION",
                 "raw": "BYTEA", "rowid": ""}, SERVER_TABLES, "%s",
    " FOR UPDATE SKIP LOCKED", "EXTRACT(EPOCH FROM clock_timestamp())",
    "pg_input_is_valid({}, 'json')", "json_array_length(({})::json)", keys_as_array=True,
    array_mark="%b")


Tx = Any  # a store's open transaction: what its statements run on, opaque to everyone else
Row = Any  # a row read by name (``row["id"]``) or position (``row[0]``)

CHUNK = 500  # keys bound per statement, under every database's parameter limit
LEASE_SECONDS = 30.0  # the default lease of a claim (Ledger(lease=)); renewed every third of it


class Later(partial):
    """A write's outcome, read when called: a pipelined group sends every write first."""


class StoreBase(ABC):
    """The transaction protocol the SQL of the ``store_*`` modules runs on."""

    path: Path | None  # the ledger's file, None when it is kept in memory or on a server
    dialect: Dialect  # how its database spells the schema and the statements
    lease_seconds: float = LEASE_SECONDS  # how long a claim holds unless renewed
    # a write's failures that say only that it met another's at the same moment (a deadlock, a
    # serialization failure): run again, it can succeed. None on SQLite, whose writers take turns
    conflicts: tuple[type[BaseException], ...] = ()

    _public: str | None = None  # a server's URL as shown, its password masked
    _failure: type[Exception]  # the database's own error: a failure of the ledger

    @property
    def _where(self) -> str | Path:
        """The ledger as an error (or a person) names it; never a password."""
        return self._public or self.path or ":memory:"

    def transaction(self, *, calls: bool = False,
                    whole: str | None = None) -> AbstractContextManager[Tx]:
        """One write transaction, whole and as if alone (``calls``: side by side where rows lock);
        a failure of the ledger, or any in a person's operation ``whole``, is a LedgerError."""
        tx = self._calls_transaction() if calls else self._write_transaction()
        return tx if whole is None else _whole(self._whole_or_nothing(whole), tx)

    # -- what a store for one database says ----------------------------------------------------
    @abstractmethod
    def _write_transaction(self) -> AbstractContextManager[Tx]: ...

    def _calls_transaction(self) -> AbstractContextManager[Tx]:
        return self._write_transaction()

    @abstractmethod
    def _close(self) -> None: ...

    @contextmanager
    def _whole_or_nothing(self, what: str) -> Iterator[None]:
        try:
            yield
        except self._failure as exc:
            raise self._error(f"{what} failed and was rolled back whole", exc) from exc

    def _error(self, what: str, exc: BaseException) -> LedgerError:
        return LedgerError(what, path=self._where, cause=exc)

    def _exec(self, tx: Tx, sql: str, args: Sequence[Any] = ()) -> Any:
        """Run one statement in ``tx``; the cursor (a pipelined write's rowcount is not known)."""
        return tx.execute(self.dialect._sql(sql), tuple(args))

    def _many(self, tx: Tx, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        """Run one statement for each of ``rows`` in ``tx``; the cursor (``rowcount``)."""
        cursor = tx.cursor()
        cursor.executemany(self.dialect._sql(sql), rows)
        return cursor

    def _insert(self, tx: Tx, sql: str, args: Sequence[Any] = ()) -> int:
        """Run an INSERT into a table with an ``id`` column; the new row's id."""
        return self._exec(tx, sql + " RETURNING id", args).fetchone()[0]

    @abstractmethod
    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Rows of one query outside any write transaction; a failure is a LedgerError."""

    def _clock(self, tx: Tx) -> float:
        """Seconds since the epoch by the clock every runner reads (``tx`` may be None)."""
        return time.time()

    def _raw(self, text: str | None) -> Any:
        """A provider's raw text as the database keeps it, byte for byte."""
        return text

    def _admitting(self, tx: Tx, request_key: str) -> None:
        """Before ``tx`` reads whether ``request_key`` was admitted (whole or in part) to admit
        it: two writes admitting one request take turns, each reading what the other committed.
        SQLite's writes always do (``BEGIN IMMEDIATE``)."""
        return None

    def _admitting_all(self, tx: Tx, request_keys: Sequence[str]) -> None:
        """:meth:`_admitting` for many requests at once, in the one order every writer takes."""
        return None

    def _by_keys(self, sql: str, keys: Sequence[Any], tx: Tx = None,
                 before: tuple[Any, ...] = ()) -> list[Row]:
        """``sql`` with ``{marks}`` bound to ``keys`` a chunk (or one array) at a time, after the
        parameters ``before`` them (values are never spelled into a statement: each statement
        text is rendered and prepared once)."""
        rows: list[Row] = []
        keys, dialect = list(keys), self.dialect
        step = (len(keys) or 1) if dialect.keys_as_array else CHUNK
        for start in range(0, len(keys), step):
            marks, args = dialect._bind(keys[start:start + step])
            query, args = sql.format(marks=marks), before + args
            rows += (self._exec(tx, query, args).fetchall() if tx is not None
                     else self._read(query, args))
        return rows


@contextmanager
def _whole(guard: AbstractContextManager[None], tx: AbstractContextManager[Tx]) -> Iterator[Tx]:
    with guard, tx as db:
        yield db
