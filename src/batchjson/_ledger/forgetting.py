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
own gate through the names it is given. Here: who forgot (what the faces say of it is
``_textview.py``'s).
"""

from __future__ import annotations

import getpass
import socket


def _who() -> str:
    """``user@host`` for the record; a missing user name (some containers) is said so."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no USER/LOGNAME and no passwd entry
        user = "unknown-user"
    return f"{user}@{socket.gethostname() or 'unknown-host'}"
