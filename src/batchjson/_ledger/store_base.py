"""What every store is made of: the ``store_*`` modules write their SQL once, each database's
``Dialect`` spells it, and its store opens transactions and runs statements."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from .._errors import LedgerError
from .store_schema import Dialect

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

    @abstractmethod
    def _exec(self, tx: Tx, sql: str, args: Sequence[Any] = ()) -> Any:
        """Run one statement in ``tx``; the cursor (a pipelined write's rowcount is not known)."""

    @abstractmethod
    def _many(self, tx: Tx, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        """Run one statement for each of ``rows`` in ``tx``; the cursor (``rowcount``)."""

    @abstractmethod
    def _insert(self, tx: Tx, sql: str, args: Sequence[Any] = ()) -> int:
        """Run an INSERT into a table with an ``id`` column; the new row's id."""

    @abstractmethod
    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Rows of one query outside any write transaction; a failure is a LedgerError."""

    def _clock(self, tx: Tx) -> float:
        """Seconds since the epoch by the clock every runner reads (``tx`` may be None)."""
        return time.time()

    def _raw(self, text: str | None) -> Any:
        """A provider's raw text as the database keeps it, byte for byte."""
        return text

    def _by_keys(self, sql: str, keys: Sequence[Any], tx: Tx = None) -> list[Row]:
        """``sql`` with ``{marks}`` bound to ``keys`` a chunk (or one array) at a time."""
        rows: list[Row] = []
        keys, dialect = list(keys), self.dialect
        step = (len(keys) or 1) if dialect.keys_as_array else CHUNK
        for start in range(0, len(keys), step):
            marks, args = dialect._bind(keys[start:start + step])
            query = sql.format(marks=marks)
            rows += (self._exec(tx, query, args).fetchall() if tx is not None
                     else self._read(query, args))
        return rows


@contextmanager
def _whole(guard: AbstractContextManager[None], tx: AbstractContextManager[Tx]) -> Iterator[Tx]:
    with guard, tx as db:
        yield db
