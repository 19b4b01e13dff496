"""Re-judge before re-asking: when only how returns are judged changed, reuse what was returned.

A request key covers both what the model saw (prompt, system text, wire schema, answer source:
the *seen key*) and how its return is judged (schema fingerprint, validator, identity rules). A
new revision that changed only the second part first re-judges, locally and for free, the raw
returns of earlier exact attempts that saw the same thing; those that pass are committed as
receipts of kind ``recheck`` with cost 0, and only the rest are sent.

Judging a fingerprint cannot fully see (a validator reading ``globals()["X"]``) re-judges on
every run, since the same key may judge differently now: stored answers are never reused on
trust. A revision is kept only while every answer it accepted passes the rules as they are now;
else the run moves to a revision whose ``unseen`` component names the one before and the requests
whose answers fail there, where those are asked again and the rest re-judged (the same rules
reach the same revision again, and rules changed back reach the first).

The same path keeps ledgers written before the answer source joined the key resuming: their
accepted returns are found under the old key, from the same provider name and model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _acceptance as acceptance
from . import _seen as seen
from ._canon import digest
from ._ledger import Ledger
from ._providers.base import Reply
from ._schema import ItemSchema
from ._tasks import Request

MAX_CANDIDATES = 8  # earlier returns tried per request: bounded local work
UNSEEN = "unseen"  # the revision component of judging no fingerprint fully sees


def rejudge(ledger: Ledger, pending: Sequence[Request], *, run: Callable[..., Any],
            seen_of: Mapping[str, str],
            legacy_of: Mapping[str, str], provider: str | None, model: str | None, mode: str,
            identity: Sequence[str], schema: ItemSchema,
            validator: Callable[..., Any] | None, same_key: bool = False,
            broken: list[dict[str, Any]] | None = None,
            ) -> list[tuple[Request, Any, dict[str, Any]]]:
    """(request, earlier attempt row, stored items) for each pending request that an earlier
    raw return now passes, judged against the ledger's own copy of the request's tasks.
    ``same_key``: returns under the very same key count too (the judging reads what its
    fingerprint cannot see, so the same key may judge differently now). A ``validator_error``
    ends the re-judging and is appended to ``broken``: the validator is broken (or hangs), and
    no call could be judged by it either."""
    if not pending:
        return []
    candidates: dict[str, list[Any]] = {}
    for row in seen.earlier_returns(ledger, [seen_of[r.key] for r in pending]):
        candidates.setdefault(row["seen_key"], []).append(row)
    legacy: dict[str, list[Any]] = {}
    if legacy_of:
        old_keys = [legacy_of[r.key] for r in pending]
        for row in seen.legacy_returns(ledger, old_keys, provider, model):
            legacy.setdefault(row["seen_key"], []).append(row)
    work = []
    for request in pending:
        # A return under this very key was judged by these rules already, unless its judging
        # was interrupted (cancelled with its text kept) or reads what no fingerprint sees.
        rows = [row for row in candidates.get(seen_of[request.key], [])
                if same_key or row["request_key"] != request.key or row["status"] == "cancelled"]
        rows += legacy.get(legacy_of.get(request.key, ""), [])
        if rows:
            work.append((request, rows[:MAX_CANDIDATES]))
    if not work:
        return []

    async def judge_all() -> list[tuple[Request, Any, dict[str, Any]]]:
        passed = []
        for request, rows in work:
            for row in rows:
                verdict = await acceptance.judge(
                    Reply(text=row["raw"]), request.tasks, mode=mode, identity=identity,
                    schema=schema, validator=validator)
                if verdict.accepted:
                    passed.append((request, row, verdict.stored))
                    break
                crashed = [e for e in verdict.errors if e["type"] == "validator_error"]
                if crashed:
                    if broken is not None:
                        broken.append(crashed[0])
                    return passed
        return passed

    return run(judge_all)  # on the session's loop: validators may be async


def unseen_token(ledger: Ledger, requests: Sequence[Request], previous: str | None, *,
                 run: Callable[..., Any], mode: str, identity: Sequence[str],
                 schema: ItemSchema, validator: Callable[..., Any] | None) -> str | None:
    """None when every accepted answer among ``requests`` passes the rules as they are now with
    the very values it committed; else the ``unseen`` component of the revision to run instead,
    naming ``previous`` (this one's) and the requests whose answers fail."""
    accepted = ledger.accepted_keys([r.key for r in requests])
    failing: list[str] = []
    work = []
    for request in requests:
        found = seen.accepted_return(ledger, request.key) if request.key in accepted else None
        if found is not None:
            work.append((request, found))
        elif request.key in accepted:  # accepted without a raw text on record: no re-judging
            failing.append(request.key)

    async def judge_all() -> None:
        for request, (row, items) in work:
            verdict = await acceptance.judge(
                Reply(text=row["raw"]), request.tasks, mode=mode, identity=identity,
                schema=schema, validator=validator)
            if not verdict.accepted or _json(verdict.stored) != _json(items):
                failing.append(request.key)

    if work:
        run(judge_all)  # on the session's loop: validators may be async
    return digest("batchjson:unseen:1", [previous, sorted(failing)]) if failing else None


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def clear_legacy(ledger: Ledger, accepted: Sequence[Request], legacy_of: Mapping[str, str],
                 source: str | None) -> int:
    """Old-style requests (keyed before the answer source joined the key) that a return accepted
    now answers: the same tasks under the same schema, validator and instructions, judged by
    rules at least as strict. Each gets a cost-0 ``recheck`` of that return, so evidence a strict
    session keeps counting is cleared instead of being stuck on a key nothing computes any
    more. Returns how many were cleared."""
    by_old = {legacy_of[r.key]: r for r in accepted if r.key in legacy_of}
    if not by_old:
        return 0
    cleared = 0
    for row in seen.legacy_unresolved(ledger, list(by_old)):
        found = seen.accepted_return(ledger, by_old[row["key"]].key)
        if found is None:
            continue
        origin, items = found
        old = Request(row["key"], tuple(json.loads(row["tasks"])), 0)
        seen.commit_rechecks(ledger, row["batch_id"], row["revision_id"], [(old, origin, items)],
                               source)
        cleared += 1
    return cleared
