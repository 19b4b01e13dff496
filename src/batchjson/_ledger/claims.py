"""Claims: one payer per request, across threads, sessions and processes sharing a ledger.

A runner claims a request in the same transaction as the in-flight receipt of its call, and keeps
the claim (renewing its lease) until the request is resolved or given up. Another runner of the
same content never sends a claimed request; it waits and takes the accepted result from the
ledger. A claim whose owner is gone is taken over at once, and that owner's in-flight receipts
become ``abandoned``: calls of unknown cost.

Here is who holds a claim and when a holder is gone; the statements that take, renew and
release claims are the store's (``store_calls.py``).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

# Who "this host" is: its host name, or BATCHJSON_HOST where machines share one (containers
# with the host's name but their own process ids): a process id is checked only on its host.
HOST = os.environ.get("BATCHJSON_HOST") or socket.gethostname()
LEASE_SECONDS = 30.0  # the default lease (Ledger(lease=)); renewed every third of it

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

    @property
    def id(self) -> str:
        return f"{self.host}/{self.pid}/{self.session}/{self.run}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _owner_gone(owner: str, host: str, pid: int, lease_expires_at: float | None,
               at: float) -> bool:
    """Same host: its process (or, in this process, its run) no longer exists. Any host: its
    lease expired, so it stopped renewing."""
    if host == HOST:
        if pid == os.getpid():
            with _live_lock:
                if owner not in _live_runs:
                    return True
        elif not _pid_alive(pid):
            return True
    return lease_expires_at is not None and lease_expires_at < at


def _parse(owner: str) -> tuple[str, int] | None:
    parts = owner.split("/")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def _gone_owners(holders: Sequence[tuple[str, str, int, float]], in_flight: Sequence[str],
                at: float) -> set[str]:
    """Which owners are gone: of the claim holders (owner, host, pid, lease expiry), those
    :func:`_owner_gone` says; of the owners with receipts in flight and no claim, those of this
    host whose process (or run) is gone."""
    gone = {owner for owner, host, pid, lease in holders
            if _owner_gone(owner, host, pid, lease, at)}
    for owner in in_flight:
        where = _parse(owner)
        if owner not in gone and where is not None and where[0] == HOST and _owner_gone(
                owner, where[0], where[1], None, at):
            gone.add(owner)
    return gone


ABANDONED = {"type": "abandoned", "task_id": None, "message": "its runner was killed or lost "
             "before the answer was recorded; the call may have been paid for"}

MINE, HELD, ACCEPTED = "mine", "held", "accepted"  # what _begin_call finds
OVER = "over"  # the ledger's own cost budget cannot hold the call
