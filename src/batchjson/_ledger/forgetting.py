"""Forgetting a batch: its evidence stops owing calls; its account stays whole.

An abandoned batch with unresolved requests owes calls forever (``%batch_status``,
``minimum_exact_retry_calls``, a strict session's validator, an RLM host's gate). Forgetting
marks every revision of the batch that still owes as forgotten, in one transaction, and records
who forgot it, when, how, and what it stopped owing. Receipts, costs and accepted values are
untouched. A forgetting covers the work there was when it was made: a forgotten revision owes
again once an attempt on it starts or ends after the forgetting (a run still going on, which
forgetting does not stop; a later run of the same content; attempts merged or imported later,
by their own times); new content opens a new revision as always.

Only a person forgets (``Ledger.forget``): ``batchjson forget`` and ``%batch_forget`` offer
it. No RLM helper does, and the ``Session`` has no method for it, so a model cannot clear its
own gate through the names it is given. Here: who forgot, and the words the faces say.
"""

from __future__ import annotations

import getpass
import socket
from typing import Any

from .._money import money


def _who() -> str:
    """``user@host`` for the record; a missing user name (some containers) is said so."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no USER/LOGNAME and no passwd entry
        user = "unknown-user"
    return f"{user}@{socket.gethostname() or 'unknown-host'}"


def forgotten_line(f: dict[str, Any]) -> str:
    """One line for status: what was forgotten, by whom, when, and whether it still stands."""
    revs = ", ".join(map(str, f["revisions"]))
    state = "" if f["in_effect"] else "; owed again since later work on it reopened it"
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
            f"({money(spend['cost'])}) stay in the account, and later work on {name!r} (a run, "
            "a merge) owes again." + (
                f" {spend['in_flight_calls']} of its call(s) are in flight (a run going on, or "
                "one that died): forgetting does not stop a run, and what it does from now on "
                "owes again; stop it first to leave the batch forgotten."
                if spend.get("in_flight_calls") else ""))
