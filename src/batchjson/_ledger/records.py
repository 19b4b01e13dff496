"""The ledger's rows as Python values: receipts, revisions, ids and timestamps.

Kept apart from the store (which writes and queries) so the shapes a reader meets, the one
timestamp format every record uses, and what is said about a ledger file that cannot be opened
live in one small place.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._secrets import masked, public_url

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
    source: str | None = None  # the answer source (_content.keys.answer_source)
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
    superseded_by: int | None = None  # the number of the revision that superseded it


_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/+")
POSTGRES_SCHEMES = ("postgresql", "postgres")


def _no_such_batch(names: list[str], name: str) -> str | None:
    """Why ``name`` is not among a ledger's batch ``names``, listing them; None when it is."""
    if name in names:
        return None
    return f"no batch named {name!r} in this ledger (batches: {', '.join(names) or 'none yet'})"


def ledger_path(value: Any) -> Path | str | None:
    """What ``Ledger(path)`` and ``Session(ledger=...)`` accept: a SQLite file path (str or
    ``os.PathLike``), a ``postgresql://`` URL (returned as the str), or None (in memory).
    Anything else is refused before a file is made or a server reached; a URL of another
    scheme is refused with its password masked."""
    if value is None:
        return None
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ConfigError(f"ledger must be a file path (a str or pathlib.Path), a "
                          f"postgresql:// URL, or None to keep it in memory, got "
                          f"{type(value).__name__}; e.g. Session(provider, "
                          "ledger='runs/ledger.sqlite')")
    found = _URL.match(text)  # "scheme://", or "scheme:/" once pathlib has folded the slashes
    if found:
        text = _URL.sub(lambda m: m.group(1) + "://", text, count=1)
        if found.group(1).lower() in POSTGRES_SCHEMES and isinstance(value, str):
            return text
        shown = masked(text) if len(text) > 200 else repr(public_url(text))
        raise ConfigError(f"ledger {shown} is a URL batchjson cannot keep a ledger at; pass a "
                          "file path (ledger='runs/ledger.sqlite') or a PostgreSQL URL as a "
                          "str (ledger='postgresql://user@host/db')")
    if "\x00" in text:  # no file system takes it: os.stat would raise a bare ValueError
        raise ConfigError(f"ledger path {text[:80]!r} holds a NUL character ('\\x00'), which "
                          "no file name can; pass the path without it, e.g. "
                          "ledger='runs/ledger.sqlite'")
    return Path(text).expanduser()  # "~/runs.sqlite" is the home directory, as in a shell


SQLITE_HEADER = b"SQLite format 3\x00"


def _unreadable(path: Path) -> str:
    """Why SQLite cannot open the ledger file at ``path``, said after its path, and what to do:
    not a SQLite file, a SQLite file cut short, a read-only place, or damage of another kind."""
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
    """What to do when a write to an open ledger failed because its place turned read-only
    (a remount, a permission change) or its disk is full, said after the failure; "" for
    other failures. SQLite keeps its temporary files in memory (``temp_store``), so a full
    disk is always the ledger's own, never TMPDIR's."""
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
    """How a SQLite file is shorter than its header says, or None (see sqlite.org/fileformat:
    the page size at offset 16, the page count at 28, valid when the counters at 24 and 92
    agree)."""
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


def _revision(row: Any) -> Revision:
    return Revision(row["id"], row["batch_id"], row["batch"], row["number"], row["fingerprint"],
                    json.loads(row["components"]), row["status"], row["supersede_reason"],
                    row["validator_name"], row["created_at"], row["superseded_by"])


def _receipt(row: Any) -> Receipt:
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
