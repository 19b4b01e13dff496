"""The PostgreSQL store (psycopg 3): only what is PostgreSQL's own. Transactions that read before
they write take one advisory lock; the writes of calls run side by side (docs/scale.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import lru_cache, partialmethod
from typing import Any

from .._errors import ConfigError, LedgerError
from .._secrets import Secrets, public_url
from .records import now
from .store import Store
from .store_base import MERGED, POSTGRES, Later, Row, Tx, _version_problem
from .store_calls import (
    ACCEPTED,
    CLAIM_INTO,
    COMPLETE_SQL,
    HELD,
    MINE,
    OVER,
    PARTED,
    RECEIPT_COLUMNS,
    RECEIPT_INTO,
    InFlight,
    Owner,
    _already_accepted,
    _owner_gone,
)
from .store_runs import REQUESTS_SQL, SEEN_SQL

# The one lock of transactions that read before they write ("batchjson" in ASCII).
SERIAL_LOCK = "SELECT pg_advisory_xact_lock(7089063493536607342)"
# Admissions of one request key take turns (the pair of int4 keys: a space apart from the above);
# two keys sharing a hash only wait for each other.
ADMIT_LOCK = "SELECT pg_advisory_xact_lock(1651663213, hashtext(?))"
CLOCK = POSTGRES.now

# Both hot paths lock the request's lowest row (``job``) unless another runner decides on it,
# and claim it (``claimed``: for which receipt) if it is free or ours and not accepted, whole
# or in part (``_SETTLED``: a partial return's request is never claimed again).
_JOB = """job AS (
    SELECT id FROM requests WHERE id = (SELECT MIN(id) FROM requests WHERE key = %(key)s)
    FOR UPDATE SKIP LOCKED)"""
_SETTLED = ("EXISTS (SELECT 1 FROM attempts WHERE request_key = %(key)s AND status IN "
            "('accepted', 'partial'))")
_SETTLED_AS = _SETTLED.replace("EXISTS (SELECT 1", "(SELECT MIN(status)")  # accepted first
_CLAIM_AS = CLAIM_INTO + """
    SELECT %(key)s, %(owner)s, %(host)s, %(pid)s, %(session)s, {claimed},
           {CLOCK} + %(lease)s, %(stamp)s FROM free
    ON CONFLICT (request_key) DO"""
_BUDGETED = "EXISTS (SELECT 1 FROM budget WHERE id = 1)"

# Every call's: the receipt first; and whether the ledger has a budget of its own.
_RECEIPT = RECEIPT_INTO + ", ".join(f"%({column})s" for column in RECEIPT_COLUMNS) + ")"
OPEN = f"""
WITH receipt AS ({_RECEIPT} RETURNING id), {_JOB},
free AS (SELECT 1 FROM job WHERE NOT {_SETTLED}),
fresh AS ({_CLAIM_AS.format(claimed="(SELECT id FROM receipt)", CLOCK=CLOCK)}
    NOTHING RETURNING 1),
again AS (
    UPDATE claims SET attempt_id = (SELECT id FROM receipt),
                      lease_expires_at = {CLOCK} + %(lease)s
    WHERE request_key = %(key)s AND owner = %(owner)s AND EXISTS (SELECT 1 FROM free)
    RETURNING 1)
SELECT (SELECT id FROM receipt), EXISTS (SELECT 1 FROM job),
       EXISTS (SELECT 1 FROM fresh) OR EXISTS (SELECT 1 FROM again), {_BUDGETED}
"""

# Without a ledger budget: the claim first (decided by its key), then its receipt, nothing
# written unless it is won; nothing is read before COMMIT (a group claims in one round trip).
_RECEIPT_NAMED = ("INSERT INTO attempts(id, status, " + ", ".join(RECEIPT_COLUMNS) + ") SELECT "
                  "attempt_id, 'in_flight', " + ", ".join(f"%({c})s" for c in RECEIPT_COLUMNS))
_NEXT_ID = "nextval(pg_get_serial_sequence('attempts', 'id'))"
CLAIM = f"""
WITH {_JOB},
free AS (SELECT 1 FROM job WHERE NOT {_SETTLED} AND NOT {_BUDGETED}),
claim AS ({_CLAIM_AS.format(claimed=_NEXT_ID, CLOCK=CLOCK)}
    UPDATE SET attempt_id = excluded.attempt_id,
        lease_expires_at = excluded.lease_expires_at WHERE claims.owner = excluded.owner
    RETURNING attempt_id),
receipt AS ({_RECEIPT_NAMED} FROM claim RETURNING id)
SELECT (SELECT id FROM receipt), EXISTS (SELECT 1 FROM job), {_BUDGETED}, {_SETTLED_AS},
       c.owner, c.host, c.pid, c.lease_expires_at, {CLOCK}
FROM (SELECT 1) AS one LEFT JOIN claims c ON c.request_key = %(key)s
"""

# An accepted return in one statement, nothing read back: its checkpoint rows unless another
# runner's are there (or its request was accepted in part meanwhile: the parts hold its items),
# else its receipt kept as a paid return naming the one admitted.
_ADMITTED = "(? OR EXISTS (SELECT 1 FROM added))"  # ?: the return has no items
_PARTED = "FROM attempts WHERE request_key = ? AND status = 'partial'"
ACCEPT = (
    "WITH added AS (INSERT INTO checkpoint(batch_id, request_key, task_id, attempt_id, item, "
    "committed_at) SELECT ?, ?, t.task_id, ?, t.item, ? FROM unnest(?[]::text[], ?[]::text[]) "
    f"AS t(task_id, item) WHERE NOT EXISTS (SELECT 1 {_PARTED}) ON CONFLICT DO NOTHING "
    "RETURNING 1) " + COMPLETE_SQL.format(
        status=f"CASE WHEN {_ADMITTED} THEN 'accepted' ELSE 'rejected' END",
        errors=f"CASE WHEN {_ADMITTED} THEN '[]' ELSE replace(?, '{{first}}', COALESCE((SELECT "
        "MIN(attempt_id)::text FROM checkpoint WHERE request_key = ? AND batch_id = ?), "
        f"(SELECT MIN(id)::text {_PARTED}), chr(63))) END"))

# ``_many`` of these in one statement, each column one array (executemany runs once per row).
BULK = {
    REQUESTS_SQL: (
        "INSERT INTO requests(revision_id, key, position, parent_key, task_ids, tasks) SELECT "
        "r, k, p, pk, ti, t FROM unnest(?[]::bigint[], ?[]::text[], ?[]::bigint[], "
        "?[]::text[], ?[]::text[], ?[]::text[]) WITH ORDINALITY AS u(r, k, p, pk, ti, t, n) "
        "ORDER BY n ON CONFLICT DO NOTHING"),
    SEEN_SQL: ("INSERT INTO seen(request_key, seen_key) SELECT * FROM unnest(?[]::text[], "
               "?[]::text[]) ON CONFLICT DO NOTHING"),
}

POOL_SIZE = 4  # connections: the group commit's writer, and readers beside it
CONNECT_SECONDS = 10
TRANSIENT = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available


class _Row(tuple):
    """A row read by name or position, as ``sqlite3.Row`` is (``dict(row)`` works too)."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        return tuple.__getitem__(self, self._index[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self._index)


@lru_cache(maxsize=512)
def _row_class(names: tuple[str, ...]) -> type[_Row]:
    return type("Row", (_Row,), {"__slots__": (),
                                 "_index": {n: i for i, n in reversed(list(enumerate(names)))}})


def _rows(cursor: Any) -> Any:
    """Rows by name, their class keyed by the result's column names (read off the result, not
    ``cursor.description``, which builds a typed column for each, on every statement)."""
    result = cursor.pgresult
    count = result.nfields if result is not None else 0
    return _row_class(tuple(result.fname(i).decode() for i in range(count))) if count else tuple


class PostgresStore(Store):
    """The ledger in a PostgreSQL database, shared by runners on any number of hosts."""

    path = None
    dialect = POSTGRES

    def __init__(self, url: str) -> None:
        self.url = url
        self._public = public_url(url, user=False)
        self._secrets = Secrets(urls=[url], url_users=False)
        self._here = threading.local()  # this thread's open transaction: its connection
        try:
            import psycopg
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise ConfigError(f"ledger {self._public} is a PostgreSQL database, and that needs "
                              "psycopg 3 and psycopg-pool: pip install 'batchjson[postgres]'"
                              ) from None
        self._psycopg, self._failure = psycopg, psycopg.Error
        errors = psycopg.errors
        self.conflicts = (errors.SerializationFailure, errors.DeadlockDetected,
                          errors.LockNotAvailable)  # TRANSIENT's
        try:  # a wrong URL or a server down is named at once
            first = psycopg.connect(self.url, **self._options())
        except psycopg.Error as exc:
            raise self._error("could not connect (is the server running, and the URL right?)",
                              exc) from None
        try:
            if first.info.server_version < 160000:  # no pg_input_is_valid: JSON checked in Python
                self.dialect = replace(POSTGRES, json_valid="FALSE")
            self._schema(first)
        except psycopg.Error as exc:
            raise self._error("could not be prepared", exc) from None
        finally:
            first.close()
        self._pool = ConnectionPool(self.url, min_size=1, max_size=POOL_SIZE,
                                    timeout=CONNECT_SECONDS, kwargs=self._options(),
                                    configure=self._configure, name="batchjson-ledger", open=True)

    def __repr__(self) -> str:
        return f"PostgresStore({self._public})"

    def _options(self) -> dict[str, Any]:
        # a server that never answers is given up on, as libpq does not by itself
        wait = {} if "connect_timeout" in self.url else {"connect_timeout": CONNECT_SECONDS}
        return {"autocommit": True, "row_factory": _rows, **wait}

    def _configure(self, db: Any) -> None:
        """``bytea`` and ``numeric`` (SUM of whole numbers) read as SQLite hands them back."""
        from psycopg.adapt import Loader
        from psycopg.types.string import ByteaLoader

        class TextLoader(ByteaLoader):
            def load(self, data: Any) -> str:
                return super().load(bytes(data)).decode("utf-8", "surrogatepass")

        class NumberLoader(Loader):
            def load(self, data: Any) -> int | float:
                text = bytes(data)
                return int(text) if text.lstrip(b"-").isdigit() else float(text)

        db.adapters.register_loader("bytea", TextLoader)
        db.adapters.register_loader("numeric", NumberLoader)

    def _schema(self, db: Any) -> None:
        """Make the schema in an empty database, once, however many runners start at once."""
        with db.transaction():
            db.execute(SERIAL_LOCK)
            found = db.execute("SELECT to_regclass('batchjson_schema'), "
                               "to_regclass('attempts')").fetchone()
            if found[0] is not None:
                version = db.execute("SELECT MAX(version) FROM batchjson_schema").fetchone()[0]
                problem = _version_problem(version, None)
                if problem:
                    raise LedgerError(problem, path=self._public)
                return
            if found[1] is not None:
                raise LedgerError("the database has an 'attempts' table that batchjson did not "
                                  "make; give a database (or a schema, with ?options=-csearch_"
                                  "path%3DNAME) of its own to the ledger", path=self._public)
            db.execute(POSTGRES._schema)  # no parameters: many statements in one

    def _close(self) -> None:
        self._pool.close()

    def _tables(self) -> dict[str, list[Row]]:
        """What a merge brings in (``MERGED``)."""
        return {table: self._read(f"SELECT * FROM {table} ORDER BY {by}")
                for table, by in MERGED.items()}

    # -- transactions --------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, *, serial: bool) -> Iterator[Any]:
        """A lost server or connection is a LedgerError; a statement's own error or a transient
        conflict is raised as it is (the group commit retries each write alone)."""
        db = None
        try:
            with self._connection() as db:
                pipelined = not serial and self._psycopg.Pipeline.is_supported()
                with self._pipelined(db) if pipelined else db.transaction():
                    if serial:
                        db.execute(SERIAL_LOCK)
                    yield db
        except self._psycopg.Error as exc:  # a pool that cannot connect in time as well
            psycopg = self._psycopg
            lost = isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError,
                                    psycopg.InternalError)) or db is None or db.broken
            if lost and getattr(exc, "sqlstate", None) not in TRANSIENT:
                raise self._error("a write failed; the run stopped before any further "
                                  "call", exc) from exc
            raise

    _write_transaction = partialmethod(_transaction, serial=True)
    _calls_transaction = partialmethod(_transaction, serial=False)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        """This thread's open transaction's connection (it sees its writes), else the pool's."""
        held = getattr(self._here, "db", None)
        if held is not None:
            yield held
            return
        with self._pool.connection() as db:
            self._here.db = db
            try:
                yield db
            finally:
                self._here.db = None

    @contextmanager
    def _pipelined(self, db: Any) -> Iterator[None]:
        """BEGIN, the writes and COMMIT sent as one round trip (psycopg's transaction block
        waits at each end). A statement the server refused mid-pipeline can leave psycopg
        counting as prepared one the server dropped, failing every later use of that
        connection: after a failure it is rolled back and both sides forget their prepared
        statements (psycopg does on reading ``DEALLOCATE ALL``), else closed, and the pool
        replaces it."""
        failure: BaseException | None = None
        try:
            with db.pipeline():
                db.execute("BEGIN")
                try:
                    yield
                    db.execute("COMMIT")  # (where a refused write's error may surface)
                except BaseException as exc:  # raised once the pipeline is left: psycopg
                    failure = exc  # would log its own failure to end it beside this one
        except BaseException as exc:  # ending it: the first failure, or what followed it
            failure = failure or exc
        if failure is not None:
            try:
                db.rollback()
                db.execute("DEALLOCATE ALL")
            except Exception:  # noqa: BLE001 - a connection that cannot: replaced by the pool
                with suppress(self._psycopg.Error):
                    db.close()
            raise failure

    def _error(self, what: str, exc: BaseException) -> LedgerError:
        error = LedgerError(what, path=self._public, cause=exc)
        error.args = (self._secrets.mask(str(error)),)
        return error

    # -- statements ----------------------------------------------------------------------------
    def _many(self, tx: Tx, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        if sql in BULK and rows:
            return self._exec(tx, BULK[sql], [list(column) for column in zip(*rows, strict=True)])
        return super()._many(tx, sql, rows)

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        try:
            with self._connection() as db:
                return db.execute(self.dialect._sql(sql), tuple(args)).fetchall()
        except (self._psycopg.Error, LedgerError) as exc:
            raise self._error("could not be read", exc) from None

    def _clock(self, tx: Tx) -> float:
        return (self._read(f"SELECT {CLOCK}")[0][0] if tx is None
                else tx.execute(f"SELECT {CLOCK}").fetchone()[0])

    def _admitting(self, tx: Tx, request_key: str) -> None:
        """At READ COMMITTED, calls' writes run side by side: without a lock, two returns of one
        request (a late one after a takeover) would each read the other as not yet admitted."""
        self._exec(tx, ADMIT_LOCK, (request_key,))

    def _raw(self, text: str | None) -> Any:
        return None if text is None else text.encode("utf-8", "surrogatepass")

    # -- claims side by side -------------------------------------------------------------------
    def _claim_at_commit(self, tx: Tx, receipt: InFlight, owner: Owner) -> Later:
        """``CLAIM``, read once ``tx`` has committed; a gone holder's is taken over apart."""
        cursor = tx.execute(CLAIM, self._claim_args(receipt, owner))

        def committed() -> tuple[str, int | None]:
            attempt_id, locked, budgeted, settled, *holder = cursor.fetchone()
            if attempt_id is not None:
                return MINE, attempt_id
            if budgeted or settled:
                return (OVER if budgeted else ACCEPTED if settled == "accepted" else PARTED), None
            if not locked or holder[0] in (None, owner.id) or not _owner_gone(*holder):
                return HELD, None  # held, or released a moment ago: look again later
            with self.transaction(calls=True) as again:  # a gone holder's, taken over
                return self._begin(again, receipt, owner, None)()

        return Later(lambda: Later(committed))

    def _open(self, tx: Tx, receipt: InFlight, owner: Owner) -> Later:
        """``OPEN``: a row another runner locks is HELD; anything else not won :meth:`_decide`s."""
        cursor = tx.execute(OPEN, self._claim_args(receipt, owner))

        def found() -> tuple[int, str, bool | None]:
            attempt_id, locked, taken, budgeted = cursor.fetchone()
            state = (HELD if not locked else MINE if taken
                     else self._decide(tx, receipt, owner, attempt_id))
            return attempt_id, state, budgeted

        return Later(found)

    def _claim_args(self, receipt: InFlight, owner: Owner) -> dict[str, Any]:
        return {**receipt, "key": receipt["request_key"], "host": owner.host, "pid": owner.pid,
                "session": owner.session, "lease": self.lease_seconds,
                "stamp": receipt["started_at"]}

    def _accept_call(self, tx: Tx, attempt_id: int, batch_id: int, request_key: str,
                     items: Mapping[str, str], raw: str, usage: Mapping[str, Any],
                     sent_at: str | None, charge: float | None) -> None:
        """``ACCEPT``: as ``store_calls``'s, but nothing waits on the server (the lock too is
        only sent: it holds ``ACCEPT`` back while another write admits this request)."""
        self._admitting(tx, request_key)
        stamp, empty = now(), not items
        self._exec(tx, ACCEPT, (
            batch_id, request_key, attempt_id, stamp, list(items),
            list(items.values()), request_key, empty, empty,
            json.dumps(_already_accepted("{first}")), request_key, batch_id, request_key,
            *self._completion(tx, attempt_id, raw, usage, stamp, sent_at, charge)))
