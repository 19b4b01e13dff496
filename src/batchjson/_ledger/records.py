"""The ledger's rows as Python values, and what a ledger may be (a path, a URL, or memory)."""

from __future__ import annotations

import getpass
import json
import os
import random
import re
import socket
import time
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._secrets import masked, public_url


def now() -> str:
    """ISO 8601 UTC with microseconds (``isoformat``'s form), the second formatted once."""
    second, fraction = divmod(time.time_ns() // 1000, 1_000_000)
    return f"{_second(second)}.{fraction:06d}+00:00"


@lru_cache(maxsize=1)
def _second(second: int) -> str:
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")


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


def ledger_path(value: Any) -> Path | str | None:
    """A SQLite file path, a ``postgresql://`` URL (the str) or None (memory); anything else is
    refused before a file is made or a server reached, a password masked."""
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


def _revision(row: Any) -> Revision:
    return Revision(**{**dict(row), "components": json.loads(row["components"])})


def _receipt(row: Any) -> Receipt:
    return Receipt(**{f.name: row[f.name] for f in fields(Receipt)} | {
        "task_ids": tuple(json.loads(row["task_ids"])),
        "errors": json.loads(row["errors"]) if row["errors"] else []})


def _uid() -> str:
    """A receipt's global id (for merges): time-ordered, so it appends to its index, then 64
    random bits (reseeded in a forked child): unique, not secret, cheap."""
    return f"{time.time_ns():016x}{random.getrandbits(64):016x}"


def _who() -> str:
    """``user@host``: who set a budget or forgot a batch."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no USER/LOGNAME and no passwd entry
        user = "unknown-user"
    return f"{user}@{socket.gethostname() or 'unknown-host'}"
