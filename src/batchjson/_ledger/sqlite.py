"""The SQLite store: one file in WAL mode (or memory), and what is SQLite's own: PRAGMAs, the
schema's version in ``user_version``, what an error means, what is said of a file SQLite cannot
open or write, and another ledger file read for a merge."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._errors import LedgerError
from .store import Store
from .store_base import MERGED, SCHEMA_VERSION, SQLITE, Row, Tx, _version_problem

# WAL pages before a commit copies them into the file (on the run's event loop): a call rewrites
# about seven mostly hot pages, so a long stretch copies each once where SQLite's 1,000 would
# eight times. The WAL grows to about 32 MB (removed on close); this connection's setting alone.
WAL_PAGES = 8000
OPEN_WAIT = 30.0  # seconds another process may hold a new ledger while creating it


class SQLiteStore(Store):
    """The ledger in one SQLite file (``path=None``: in memory), shared by threads and processes."""

    dialect = SQLITE
    _failure = sqlite3.Error

    def __init__(self, path: Path | None, *, busy_timeout: float = 30.0) -> None:
        self.path = path
        self._busy_timeout = busy_timeout
        target = ":memory:" if path is None else str(path)
        try:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None,
                                       timeout=busy_timeout)
            self._db.row_factory = sqlite3.Row
            self._lock = threading.RLock()
            self._budget_known: bool | None = None  # in the write transaction open now
            # a ledger at another version is refused before anything (WAL included) is changed
            _refuse_version(self._db.execute("PRAGMA user_version").fetchone()[0], path)
            if path is not None:
                self._wal()
            # temporary files in memory: a full TMPDIR is no ledger fault (cost: docs/api.md)
            for pragma in ("synchronous=NORMAL", f"wal_autocheckpoint={WAL_PAGES}",
                           "foreign_keys=ON", "temp_store=MEMORY"):
                self._db.execute(f"PRAGMA {pragma}")
            self._schema()  # no other thread has this store yet
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(_open_problem(path), path=self._where, cause=exc) from exc
        except LedgerError:
            self._db.close()
            raise

    def _wal(self) -> None:
        """Switch to WAL, waiting (within the busy timeout) for a ledger another process is
        creating: the switch needs the file to itself and SQLite does not wait for it."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _schema(self) -> None:
        """Make the schema in a new ledger; the version is read again under the write lock."""
        if self._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            _refuse_version(version, self.path)
            if version == 0:
                for statement in SQLITE._schema.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path or ':memory:'})"

    def _close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _write_transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: writers of every process take turns. A failure of the file is a
        LedgerError; a rollback never replaces its cause."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise self._stopped("could not start a write", exc) from exc
            self._budget_known = None
            try:
                yield self._db
            except BaseException as exc:
                self._rollback()
                if isinstance(exc, sqlite3.Error) and (
                        getattr(exc, "sqlite_errorname", None) or "").startswith(_FAULTS):
                    raise self._stopped("a write failed", exc) from exc
                raise
            try:
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                raise self._stopped("could not commit", exc) from exc

    def _rollback(self) -> None:
        """Undo what is left of a failed transaction; SQLite may already have undone it."""
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:  # the original failure is the one worth reporting
                pass

    def _stopped(self, what: str, exc: BaseException) -> LedgerError:
        return self._error(f"{what}; the run stopped before any further call"
                           f"{_write_problem(self.path, exc)}", exc)

    def _budgeted(self, tx: Tx) -> bool:
        """Read once a write transaction: only a transaction of its own adds or removes a budget."""
        if self._budget_known is None:
            self._budget_known = super()._budgeted(tx)
        return self._budget_known

    def _insert(self, tx: Tx, sql: str, args: Sequence[Any] = ()) -> int:
        """The new row's id as SQLite keeps it (``RETURNING`` would gather it in a b-tree)."""
        cursor = self._exec(tx, sql, args)
        if cursor.rowcount != 1:  # else lastrowid would be an earlier insert's
            raise sqlite3.IntegrityError(f"an insert wrote {cursor.rowcount} rows, not one")
        return cursor.lastrowid

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            try:
                return self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:  # closed, corrupt, locked: a batchjson error, named
                raise self._error("could not be read", exc) from exc


def _refuse_version(version: int, path: Path | None) -> None:
    """Refuse a ledger at a schema version this batchjson does not read (0: new or empty)."""
    problem = version and _version_problem(version, str(path) if path else "LEDGER")
    if problem:
        raise LedgerError(problem, path=path or ":memory:")


# The file or disk failed (not a bad statement): the run cannot keep records any more.
_FAULTS = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_BUSY", "SQLITE_LOCKED",
           "SQLITE_CANTOPEN", "SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_PERM", "SQLITE_NOMEM")


# -- what is said of a ledger file SQLite cannot open or write ------------------------------
SQLITE_HEADER = b"SQLite format 3\x00"


def _unreadable(path: Path) -> str:
    """Why SQLite cannot open the ledger file at ``path``, said after its path, and what to do."""
    try:
        with open(path, "rb") as file:
            header = file.read(100)
        size = path.stat().st_size
    except OSError as error:
        return f"cannot be read ({error.strerror or error}); check its permissions"
    if not header.startswith(SQLITE_HEADER):
        return (f"is not a SQLite file (it starts {header[:16]!r}), so not a batchjson ledger; "
                "pass the ledger's own file")
    cut = _cut_short(header, size)
    if cut:
        return (f"is a SQLite file cut short ({cut}), so it cannot be read; restore it from a "
                "backup or copy it again whole (a full disk, or a copy or download that "
                "stopped, leaves a file like this)")
    place = _read_only_place(path)
    if place:
        return (f"is {place}, and SQLite writes beside a ledger even to read it (the -wal and "
                "-shm files of its write-ahead log), so it cannot be opened there; copy it to "
                "a writable directory and use the copy, or make the place writable")
    return "is a SQLite file that SQLite cannot read; restore it from a backup"


def _open_problem(path: Path | None) -> str:
    """What ``Ledger(path)`` says when SQLite cannot open or create the file."""
    if path is None:
        return "could not open the ledger"
    if path.is_file():
        return f"could not open the ledger: it {_unreadable(path)}"
    place = _read_only_place(path)
    if place:
        return (f"could not create the ledger: its directory is {place.removeprefix('in a ')}"
                if place.startswith("in a ") else
                f"could not create the ledger: it would be {place}") + (
            "; pass a ledger path in a writable directory")
    return "could not open the ledger"


def _write_problem(path: Path | None, exc: BaseException) -> str:
    """What to do when a write failed because the ledger's place turned read-only or its disk
    is full (never TMPDIR's: ``temp_store``), said after the failure; "" for other failures."""
    if path is not None and getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL":
        return (f" (the disk holding {path.absolute().parent} is full: free space there, or "
                "move the ledger to a disk with room, and run again)")
    place = _read_only_place(path) if path is not None else None
    if place is None and "readonly" not in str(exc).replace("read-only", "readonly"):
        return ""
    where = f"it is {place}" if place else "the ledger file or its directory is read-only"
    return (f" ({where}: make it writable, or copy the ledger to a writable directory and "
            "run there)")


def _cut_short(header: bytes, size: int) -> str | None:
    """How a SQLite file is shorter than its header says, or None (sqlite.org/fileformat: page
    size at 16, page count at 28, valid when the counters at 24 and 92 agree)."""
    if len(header) < 100:
        return f"{size} bytes, less than its 100-byte header"
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(header[28:32], "big")
    valid = pages and header[24:28] == header[92:96]
    if valid and size < page * pages:
        return f"{size} of the {page * pages} bytes its header says it holds"
    if page and size % page:
        return f"{size} bytes, not a whole number of its {page}-byte pages"
    return None


def _read_only_place(path: Path) -> str | None:
    """"on a read-only file system" or "in a directory it cannot write to" when SQLite could
    not create its files beside ``path``; None when the place is writable."""
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:  # a directory still to be made
        folder = folder.parent
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "on a read-only file system"
    except (OSError, AttributeError):  # no statvfs (Windows)
        pass
    if not os.access(folder, os.W_OK):
        return "in a directory this process cannot write to"
    return None


# -- ledger files, read without opening them as a store ---------------------------------------
def file_problem(path: Path, *, create: bool = False) -> str | None:
    """Why the file at ``path`` (opened read-only) cannot be read as a ledger, or None; with
    ``create``, no file, an empty one, or one another process is making now (polled) is fine."""
    if not create:
        return _file_problem(path)
    deadline = time.monotonic() + OPEN_WAIT
    while path.exists():
        empty = _holds_nothing(path)
        problem = None if empty else _file_problem(path)
        if problem is None or empty is False or time.monotonic() > deadline:
            return problem
        time.sleep(0.05)  # busy: its schema may be being committed
    return None


def _file_problem(path: Path) -> str | None:
    if not path.exists():
        return f"no ledger at {path}"
    if path.is_dir():
        return f"{path} is a directory; pass --ledger with the ledger file inside it"
    try:
        db = _read_only(path)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return f"{path} {_unreadable(path)}"
    if version == 0 or "attempts" not in tables:
        return f"{path} is a SQLite file but not a batchjson ledger"
    problem = _version_problem(version, str(path))
    return f"{path}: {problem}" if problem else None


def _holds_nothing(path: Path) -> bool | None:
    """An empty file or a SQLite file without tables, nothing to lose; None: busy, ask again."""
    try:
        if path.stat().st_size == 0:
            return True
        db = _read_only(path, timeout=1.0)
        try:
            return db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
        finally:
            db.close()
    except sqlite3.OperationalError as exc:
        return None if "locked" in str(exc) or "busy" in str(exc) else False
    except (OSError, sqlite3.Error):
        return False


def _read_ledger_file(path: Path) -> dict[str, list[Row]]:
    """What a merge brings in (``MERGED``) from another ledger file, opened read-only; a file
    that is not a ledger of this schema is a LedgerError saying so."""
    problem = file_problem(path)
    if problem:
        raise LedgerError(problem, path=path)
    db = _read_only(path)
    db.row_factory = sqlite3.Row
    try:
        return {table: db.execute(f"SELECT * FROM {table} ORDER BY {by}").fetchall()
                for table, by in MERGED.items()}
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"cannot read {path}: {exc}", path=path, cause=exc) from None
    finally:
        db.close()


def _read_only(path: Path, timeout: float = 5.0) -> sqlite3.Connection:
    return sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=timeout)
