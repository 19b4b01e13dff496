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

The same path reuses answers of unknown source: a receipt imported from another system
cannot say which answer source produced it, so it is keyed by the same content without one;
a live run looks its accepted returns up under that key and re-judges them under its rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._acceptance import judge as acceptance
from .._canon import digest
from .._content.schema import ItemSchema
from .._content.tasks import Request
from .._providers.base import Reply
from .store import Store
from .store_runs import stop_types

MAX_CANDIDATES = 8  # earlier returns tried per request: bounded local work
UNSEEN = "unseen"  # the revision component of judging no fingerprint fully sees


def rejudge(store: Store, pending: Sequence[Request], *, run: Callable[..., Any],
            seen_of: Mapping[str, str], sourceless_of: Mapping[str, str], mode: str,
            identity: Sequence[str], schema: ItemSchema,
            validator: Callable[..., Any] | None, same_key: bool = False,
            broken: list[dict[str, Any]] | None = None,
            ) -> list[tuple[Request, Any, dict[str, Any]]]:
    """(request, earlier attempt row, stored items) for each pending request that an earlier
    raw return now passes, judged against the ledger's own copy of the request's tasks.
    ``sourceless_of`` maps a request key to the key of its content without an answer source,
    under which imported answers of unknown source are found (empty: there are none).
    ``same_key``: returns under the very same key count too (the judging reads what its
    fingerprint cannot see, so the same key may judge differently now). A ``validator_error``
    ends the re-judging and is appended to ``broken``: the validator is broken (or hangs), and
    no call could be judged by it either."""
    if not pending:
        return []
    candidates: dict[str, list[Any]] = {}
    for row in store.earlier_returns([seen_of[r.key] for r in pending]):
        candidates.setdefault(row["seen_key"], []).append(row)
    imported: dict[str, list[Any]] = {}
    if sourceless_of:
        for row in store.sourceless_returns([sourceless_of[r.key] for r in pending]):
            imported.setdefault(row["seen_key"], []).append(row)
    work = []
    for request in pending:
        # A return under this very key was judged by these rules already, unless its judging
        # was interrupted (cancelled with its text kept) or reads what no fingerprint sees.
        rows = [row for row in candidates.get(seen_of[request.key], [])
                if (same_key or row["request_key"] != request.key or row["status"] == "cancelled")
                and not stop_types(row["errors"])]  # the provider's word: never an answer
        rows += imported.get(sourceless_of.get(request.key, ""), [])
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


def unseen_token(store: Store, requests: Sequence[Request], previous: str | None, *,
                 run: Callable[..., Any], mode: str, identity: Sequence[str],
                 schema: ItemSchema, validator: Callable[..., Any] | None) -> str | None:
    """None when every accepted answer among ``requests`` passes the rules as they are now with
    the very values it committed; else the ``unseen`` component of the revision to run instead,
    naming ``previous`` (this one's) and the requests whose answers fail."""
    accepted = store.accepted_keys([r.key for r in requests])
    failing: list[str] = []
    work = []
    for request in requests:
        found = store.accepted_return(request.key) if request.key in accepted else None
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


def clear_sourceless(store: Store, accepted: Sequence[Request],
                     sourceless_of: Mapping[str, str], source: str | None) -> int:
    """Imported requests of unknown answer source that a return accepted now answers: the same
    tasks under the same schema, validator and instructions, judged by rules at least as
    strict. Each gets a cost-0 ``recheck`` of that return, so an imported request a strict
    session keeps counting (its receipt was rejected on import) is cleared instead of owing on
    a key no live run computes as its own. Returns how many were cleared."""
    by_sourceless = {sourceless_of[r.key]: r for r in accepted if r.key in sourceless_of}
    if not by_sourceless:
        return 0
    cleared = 0
    for row in store.sourceless_unresolved(list(by_sourceless)):
        found = store.accepted_return(by_sourceless[row["key"]].key)
        if found is None:
            continue
        origin, items = found
        imported = Request(row["key"], tuple(json.loads(row["tasks"])), 0)
        store.commit_rechecks(row["batch_id"], row["revision_id"], [(imported, origin, items)],
                              source)
        cleared += 1
    return cleared
