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
CLOCK = POSTGRES.now
# The calls' writes read by key alone, whatever the arrays they are given: a plan made once per
# connection serves them all (a plan made for each group's arrays costs more than running it).
GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"

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

# Without a ledger budget, a transaction's claims in one statement (each column of their
# receipts and claims one array; their keys distinct): each request's claim first (decided by
# its key), then its receipt, nothing written unless it is won and nothing read before COMMIT;
# a row of the answer for each, in their order. Every table is read by one key at a time (a
# subquery per key, never a join the planner could make a scan of a table that only grows).
_NEXT_ID = "nextval(pg_get_serial_sequence('attempts', 'id'))"
_TYPES = {"batch_id": "bigint", "revision_id": "bigint", "estimated_input_tokens": "bigint",
          "cost_floor": "float8", "reserved": "float8", "pid": "bigint"}
_GROUP_COLUMNS = (*RECEIPT_COLUMNS, "host", "pid", "session")
_GROUP_INPUT = ("input AS (SELECT * FROM unnest(" + ", ".join(
    f"%b::{_TYPES.get(c, 'text')}[]" for c in _GROUP_COLUMNS) + ") WITH ORDINALITY AS i("
    + ", ".join(_GROUP_COLUMNS) + ", n))")
CLAIMS = f"""
WITH {_GROUP_INPUT},
job AS (SELECT id, key FROM requests WHERE id = ANY (ARRAY(SELECT (SELECT MIN(r.id) FROM
    requests r WHERE r.key = i.request_key) FROM input i)) FOR UPDATE SKIP LOCKED),
free AS (SELECT i.* FROM input i JOIN job ON job.key = i.request_key
    WHERE {_SETTLED_AS.replace("%(key)s", "i.request_key")} IS NULL AND NOT {_BUDGETED}),
claim AS ({CLAIM_INTO} SELECT request_key, owner, host, pid, session, {_NEXT_ID},
        {CLOCK} + %s, started_at FROM free ORDER BY n
    ON CONFLICT (request_key) DO UPDATE SET attempt_id = excluded.attempt_id,
        lease_expires_at = excluded.lease_expires_at WHERE claims.owner = excluded.owner
    RETURNING request_key, attempt_id),
receipt AS (INSERT INTO attempts(id, status, {", ".join(RECEIPT_COLUMNS)}) SELECT c.attempt_id,
    'in_flight', {", ".join("f." + c for c in RECEIPT_COLUMNS)} FROM claim c JOIN free f
    ON f.request_key = c.request_key RETURNING id, request_key)
SELECT (SELECT id FROM receipt r WHERE r.request_key = i.request_key),
       EXISTS (SELECT 1 FROM job WHERE job.key = i.request_key), {_BUDGETED},
       {_SETTLED_AS.replace("%(key)s", "i.request_key")},
       c.owner, c.host, c.pid, c.lease_expires_at, {CLOCK}
FROM input i LEFT JOIN LATERAL (SELECT owner, host, pid, lease_expires_at FROM claims
    WHERE request_key = i.request_key OFFSET 0) AS c ON TRUE ORDER BY i.n
"""

# Accepted returns next to each other in a transaction, in two statements: their requests'
# admission locks, in one order (taken before the returns' own statement starts, so it sees the
# rows of a write that held one), then their checkpoint rows (unless another runner's are there,
# or the request was accepted in part meanwhile: the parts hold its items), each receipt kept
# as accepted or, if none of its rows went in, as a paid return naming the one admitted (read
# by key, as ``CLAIMS`` reads).
# Admissions of one request key take turns (the pair of int4 keys: a space apart from the
# serial lock); two keys sharing a hash only wait for each other.
ADMIT_ALL = ("SELECT pg_advisory_xact_lock(1651663213, h) FROM (SELECT DISTINCT hashtext(k) AS "
             "h FROM unnest(%b::text[]) AS k) AS keys ORDER BY h")
_ACCEPT_COLUMNS = {"id": "bigint", "batch_id": "bigint", "request_key": "text", "stamp": "text",
                   "empty": "bool", "raw": "bytea", "input_tokens": "bigint",
                   "output_tokens": "bigint", "cached_tokens": "bigint", "cost": "float8",
                   "model": "text", "sent_at": "text"}
_ADMITTED = "(a.empty OR a.id IN (SELECT attempt_id FROM added))"
_PARTED = "FROM attempts p WHERE p.request_key = a.request_key AND p.status = 'partial'"
ACCEPTS = f"""
WITH a AS (SELECT * FROM unnest({", ".join(f"%b::{t}[]" for t in _ACCEPT_COLUMNS.values())})
    AS a({", ".join(_ACCEPT_COLUMNS)})),
added AS (INSERT INTO checkpoint(batch_id, request_key, task_id, attempt_id, item, committed_at)
    SELECT a.batch_id, a.request_key, t.task_id, a.id, t.item, a.stamp
    FROM unnest(%b::bigint[], %b::text[], %b::text[]) AS t(attempt_id, task_id, item)
    JOIN a ON a.id = t.attempt_id WHERE (SELECT MIN(p.id) {_PARTED}) IS NULL
    ON CONFLICT DO NOTHING RETURNING attempt_id)
UPDATE attempts SET status = CASE WHEN {_ADMITTED} THEN 'accepted' ELSE 'rejected' END,
    errors = CASE WHEN {_ADMITTED} THEN '[]' ELSE replace(%s, '{{first}}', COALESCE(
        (SELECT MIN(c.attempt_id)::text FROM checkpoint c WHERE c.request_key = a.request_key
         AND c.batch_id = a.batch_id), (SELECT MIN(p.id)::text {_PARTED}), chr(63))) END,
    raw = a.raw, input_tokens = a.input_tokens, output_tokens = a.output_tokens,
    cached_tokens = a.cached_tokens, cost = a.cost, model = COALESCE(a.model, attempts.model),
    finished_at = a.stamp, sent_at = COALESCE(a.sent_at, attempts.sent_at)
FROM a WHERE attempts.id = a.id AND attempts.status IN ('in_flight', 'abandoned')
"""
_FIRST = json.dumps(_already_accepted("{first}"))

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


class _Claims:
    """The claims of one transaction, sent as one ``CLAIMS`` statement (one more for each time
    a key comes again: one statement cannot claim a row twice) when an outcome is first read,
    before a statement of another kind, or before a return of one of their requests; each
    statement's rows read once."""

    def __init__(self, lease: float) -> None:
        self.lease = lease  # seconds each claim holds
        self._rounds: list[list[tuple[InFlight, Owner]]] = []
        self._keys: list[set[str]] = []
        self._cursors: list[Any] = []  # of the rounds sent, in order
        self._rows: dict[int, list[Any]] = {}

    def add(self, receipt: InFlight, owner: Owner) -> tuple[int, int]:
        """Queue a claim: its (round, place) in the answers."""
        key = receipt["request_key"]
        at = next((i for i in range(len(self._cursors), len(self._rounds))
                   if key not in self._keys[i]), len(self._rounds))
        if at == len(self._rounds):
            self._rounds.append([])
            self._keys.append(set())
        self._rounds[at].append((receipt, owner))
        self._keys[at].add(key)
        return at, len(self._rounds[at]) - 1

    def waiting(self, key: str) -> bool:
        """Whether a claim of ``key`` is queued and not yet sent."""
        return any(key in keys for keys in self._keys[len(self._cursors):])

    def send(self, tx: Tx) -> None:
        for claims in self._rounds[len(self._cursors):]:
            self._cursors.append(tx.execute(CLAIMS, (*_columns(claims), self.lease)))

    def row(self, slot: tuple[int, int]) -> Any:
        """A claim's answer, read after COMMIT."""
        at, place = slot
        if at not in self._rows:
            self._rows[at] = self._cursors[at].fetchall()
        return self._rows[at][place]


def _columns(claims: list[tuple[InFlight, Owner]]) -> list[list[Any]]:
    """``_GROUP_COLUMNS`` of ``claims``, one list each."""
    rows = [(*receipt.values(), owner.host, owner.pid, owner.session)
            for receipt, owner in claims]
    kinds = {"float8": float, "bigint": int}  # a number array's elements of one type
    return [[None if v is None else kinds[_TYPES[name]](v) for v in column]
            if name in _TYPES else list(column)
            for name, column in zip(_GROUP_COLUMNS, zip(*rows, strict=True), strict=True)]


class _Accepts:
    """Accepted returns of one transaction: sent (``ADMIT_ALL``, then ``ACCEPTS``) before a
    statement of another kind, or a claim or another return of one of their requests."""

    def __init__(self) -> None:
        self._returns: list[tuple[Any, ...]] = []
        self._items: tuple[list[int], list[str], list[str]] = ([], [], [])
        self._keys: set[str] = set()

    def add(self, tx: Tx, attempt_id: int, batch_id: int, request_key: str,
            items: Mapping[str, str], completion: tuple[Any, ...]) -> None:
        if request_key in self._keys:
            self.send(tx)
        raw, inp, out, cached, cost, model, stamp, sent_at, _ = completion
        self._returns.append((attempt_id, batch_id, request_key, stamp, not items, raw,
                              *(None if n is None else int(n) for n in (inp, out, cached)),
                              None if cost is None else float(cost), model, sent_at))
        self._keys.add(request_key)
        ids, task_ids, texts = self._items
        ids += [attempt_id] * len(items)
        task_ids += items
        texts += items.values()

    def waiting(self, key: str) -> bool:
        return key in self._keys

    def send(self, tx: Tx) -> None:
        if not self._returns:
            return
        returns, (ids, task_ids, texts) = self._returns, self._items
        self._returns, self._items, self._keys = [], ([], [], []), set()
        tx.execute(ADMIT_ALL, ([r[2] for r in returns],))
        tx.execute(ACCEPTS, (*(list(c) for c in zip(*returns, strict=True)), ids, task_ids,
                             texts, _FIRST))


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
            self._generic = first.info.server_version >= 120000
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
        db, outer = None, (getattr(self._here, "claims", None),
                           getattr(self._here, "accepts", None))
        try:
            with self._connection() as db:
                pipelined = not serial and self._psycopg.Pipeline.is_supported()
                with self._pipelined(db) if pipelined else db.transaction():
                    if serial:
                        db.execute(SERIAL_LOCK)
                    elif self._generic:
                        db.execute(GENERIC_PLANS)
                    self._here.claims, self._here.accepts = claims, accepts = (
                        _Claims(self.lease_seconds), _Accepts())
                    yield db
                    accepts.send(db)
                    claims.send(db)  # those whose outcome nobody read before COMMIT
        except self._psycopg.Error as exc:  # a pool that cannot connect in time as well
            psycopg = self._psycopg
            lost = isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError,
                                    psycopg.InternalError)) or db is None or db.broken
            if lost and getattr(exc, "sqlstate", None) not in TRANSIENT:
                raise self._error("a write failed; the run stopped before any further "
                                  "call", exc) from exc
            raise
        finally:
            self._here.claims, self._here.accepts = outer

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
    def _before(self, tx: Tx) -> Tx:
        """``tx``, the accepted returns and then the claims waiting in it sent (a statement of
        any other kind may read what they write). Where both wait for one request, its return
        was made first (a return made after a claim of its request sends the claim), and
        those of different requests write different rows: every write takes effect as in the
        order it was made."""
        accepts, claims = getattr(self._here, "accepts", None), getattr(self._here, "claims",
                                                                         None)
        if accepts is not None:
            accepts.send(tx)
            claims.send(tx)
        return tx

    def _exec(self, tx: Tx, sql: str, args: Sequence[Any] = ()) -> Any:
        return super()._exec(self._before(tx), sql, args)

    def _many(self, tx: Tx, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        self._before(tx)
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
                else self._before(tx).execute(f"SELECT {CLOCK}").fetchone()[0])

    def _admitting(self, tx: Tx, request_key: str) -> None:
        """At READ COMMITTED, calls' writes run side by side: without a lock, two returns of one
        request (a late one after a takeover) would each read the other as not yet admitted."""
        self._admitting_all(tx, [request_key])

    def _admitting_all(self, tx: Tx, request_keys: Sequence[str]) -> None:
        if request_keys:
            self._before(tx).execute(ADMIT_ALL, (list(request_keys),))

    def _raw(self, text: str | None) -> Any:
        return None if text is None else text.encode("utf-8", "surrogatepass")

    # -- claims side by side -------------------------------------------------------------------
    def _claim_at_commit(self, tx: Tx, receipt: InFlight, owner: Owner) -> Later:
        """A row of ``CLAIMS``, sent with the transaction's other claims (``_Claims``) and read
        once ``tx`` has committed; a gone holder's claim is taken over apart."""
        claims = self._here.claims
        slot = claims.add(receipt, owner)

        def committed() -> tuple[str, int | None]:
            attempt_id, locked, budgeted, settled, *holder = claims.row(slot)
            if attempt_id is not None:
                return MINE, attempt_id
            if budgeted or settled:
                return (OVER if budgeted else ACCEPTED if settled == "accepted" else PARTED), None
            if not locked or holder[0] in (None, owner.id) or not _owner_gone(*holder):
                return HELD, None  # held, or released a moment ago: look again later
            with self.transaction(calls=True) as again:  # a gone holder's, taken over
                return self._begin(again, receipt, owner, None)()

        return Later(lambda: (self._before(tx), Later(committed))[1])

    def _open(self, tx: Tx, receipt: InFlight, owner: Owner) -> Later:
        """``OPEN``: a row another runner locks is HELD; anything else not won :meth:`_decide`s."""
        cursor = self._before(tx).execute(OPEN, self._claim_args(receipt, owner))

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
        """As ``store_calls``'s, but nothing waits on the server: sent with the accepted returns
        next to it in ``tx`` (``_Accepts``), its admission lock holding it back while another
        write admits its request."""
        completion = self._completion(tx, attempt_id, raw, usage, now(), sent_at, charge)
        if self._here.claims.waiting(request_key):
            self._before(tx)  # a claim of the request goes first (after any return before it)
        self._here.accepts.add(tx, attempt_id, batch_id, request_key, items, completion)
