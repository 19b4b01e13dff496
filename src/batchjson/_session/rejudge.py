"""Re-judge before re-asking: the one way an answer on record is judged again (:class:`Judging`,
the judge a call's return goes through), locally and free; what passes is a cost-0 ``recheck``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .._acceptance import judge as acceptance
from .._canon import canonical_json as _json
from .._canon import digest
from .._content.schema import ItemSchema
from .._content.tasks import Request
from .._ledger.store import Store
from .._providers.reply import Reply
from .._replay.groupcommit import committed
from .._sources import stop_types

MAX_CANDIDATES = 8  # earlier returns tried per request: bounded local work
UNSEEN = "unseen"  # the revision component of judging no fingerprint fully sees

Passed = tuple[Request, Any, dict[str, str]]  # request, the stored return's row, its items' texts
Apart = Callable[[Request, Sequence[str]], tuple[Request, Request]]  # ``Keys.apart``


@dataclass(frozen=True)
class Judging:
    """How returns are judged, and ``run``, which runs a coroutine from sync code (the loop)."""

    mode: str
    identity: Sequence[str]
    schema: ItemSchema
    validator: Callable[..., Any] | None
    run: Callable[..., Any]
    # "items": judged item by item, as an imported partial receipt was (a run's re-judging
    # under accept="items" too: ``first_passing``'s ``apart``)
    accept: str = "whole"

    async def _judge(self, raw: Any, tasks: Sequence[Mapping[str, Any]]) -> acceptance.Verdict:
        return await acceptance.judge(Reply(text=raw), tasks, mode=self.mode,
                                      identity=self.identity, schema=self.schema,
                                      validator=self.validator, accept=self.accept)

    def verdict(self, raw: str, tasks: Sequence[Mapping[str, Any]]) -> acceptance.Verdict:
        return self.run(lambda: self._judge(raw, tasks))

    def first_passing(self, candidates: Sequence[tuple[Request, Sequence[Any]]],
                      broken: list[dict[str, Any]] | None = None,
                      apart: Apart | None = None) -> list[Passed]:
        """Each request's first stored return passing now; a crash (``broken``) ends it. With
        ``apart`` (``accept="items"``), a request none passes whole: the return passing most of
        it in part, committed as a live one is (:func:`in_part`), its rest owed."""
        return self.run(lambda: self.passing(candidates, broken, apart)) if candidates else []

    async def passing(self, candidates: Sequence[tuple[Request, Sequence[Any]]],
                      broken: list[dict[str, Any]] | None = None,
                      apart: Apart | None = None) -> list[Passed]:
        """:meth:`first_passing` on the loop it runs on (a transport's, mid-run)."""
        judging = self if apart is None else replace(self, accept="items")
        passed = []
        for request, rows in candidates:
            part = None
            for row in rows[:MAX_CANDIDATES]:
                verdict = await judging._judge(row["raw"], request.tasks)
                if verdict.accepted:
                    passed.append((request, row, verdict.stored))
                    break
                if verdict.partial and (part is None or len(verdict.stored) > len(
                        part[1].stored)):
                    part = (row, verdict)
                crashed = [e for e in verdict.errors if e["type"] == "validator_error"]
                if crashed and broken is not None:
                    broken.append(crashed[0])
                    return passed
            else:
                if part is not None and apart is not None:
                    passed.append(in_part(request, *part, apart))
        return passed


def in_part(request: Request, row: Any, verdict: acceptance.Verdict, apart: Apart) -> Passed:
    """A stored return passing ``request`` in part, as a live partial return is recorded: its
    accepted part a request of its own answered by its own items (a cost-0 recheck), the stored
    return a 'partial' recheck of ``request`` naming the rest, which a run then asks alone."""
    kept, rest = apart(request, verdict.rejected_ids)
    origin = {"id": row["id"], "raw": acceptance.sub_return(row["raw"], kept.task_ids),
              "provider": row["provider"], "model": row["model"], "kind": row["kind"],
              "parted": (request, rest, verdict.errors, row["raw"])}
    return kept, origin, verdict.stored


def earlier_candidates(store: Store, pending: Sequence[Request], *, seen_of: Mapping[str, str],
                       sourceless_of: Mapping[str, str], same_key: bool = False
                       ) -> list[tuple[Request, list[Any]]]:
    """Each pending request's stored returns that may resolve it, sourceless last."""
    if not pending:
        return []
    earlier: dict[str, list[Any]] = {}
    imported: dict[str, list[Any]] = {}
    returns, sourceless = store.earlier_returns(
        [seen_of[r.key] for r in pending],
        [sourceless_of[r.key] for r in pending] if sourceless_of else ())
    for row in returns:
        earlier.setdefault(row["seen_key"], []).append(row)
    for row in sourceless:
        imported.setdefault(row["seen_key"], []).append(row)
    out = []
    for request in pending:
        # A return under this very key was judged by these rules already, unless its judging
        # did not end (cancelled with its text kept; the validator crashed on it) or reads what
        # no fingerprint sees.
        rows = [row for row in earlier.get(seen_of[request.key], [])
                if (same_key or row["request_key"] != request.key or row["status"] == "cancelled"
                    or _validator_crashed(row["errors"]))
                and not stop_types(row["errors"])]  # the provider's word: never an answer
        rows += imported.get(sourceless_of.get(request.key, ""), [])
        if rows:
            out.append((request, rows))
    return out


def _validator_crashed(errors: str | None) -> bool:
    """Whether a receipt was rejected because the validator raised (a bug, a timeout): a
    judgement that never ended, so its paid return is judged again before anything is asked."""
    if not errors or "validator_error" not in errors:
        return False
    try:
        listed = json.loads(errors)
    except ValueError:
        return False
    return isinstance(listed, list) and any(
        isinstance(e, dict) and e.get("type") == "validator_error" for e in listed)


def unseen_token(store: Store, judging: Judging, requests: Sequence[Request],
                 previous: str | None) -> str | None:
    """None when every accepted answer still passes as committed; else an ``unseen`` part."""
    accepted = store.accepted_keys([r.key for r in requests])
    found = {r.key: store.accepted_return(r.key) for r in requests if r.key in accepted}
    passed = judging.first_passing([(r, [found[r.key][0]]) for r in requests
                                    if found.get(r.key) is not None])
    same = {r.key for r, _, stored in passed
            if _json({t: json.loads(text) for t, text in stored.items()}) == _json(found[r.key][1])}
    failing = sorted(set(found) - same)
    return digest("batchjson:unseen:1", [previous, failing]) if failing else None


def clear_sourceless(store: Store, judging: Judging, owed: Sequence[Request],
                     sourceless_of: Mapping[str, str], source: str | None) -> int:
    """Clear (cost-0 ``recheck``) imported requests of unknown source ``owed`` answers."""
    accepted = store.accepted_keys([r.key for r in owed])
    by_sourceless = {sourceless_of[r.key]: r for r in owed
                     if r.key in accepted and r.key in sourceless_of}
    if not by_sourceless:
        return 0
    candidates, where = [], {}
    for row in store.sourceless_unresolved(list(by_sourceless)):
        found = store.accepted_return(by_sourceless[row["key"]].key)
        if found is not None:
            imported = Request(row["key"], tuple(json.loads(row["tasks"])), 0)
            candidates.append((imported, [found[0]]))
            where[row["key"]] = (row["batch_id"], row["revision_id"])
    passed = judging.first_passing(candidates)
    for entry in passed:
        commit_rechecks(store, *where[entry[0].key], [entry], source)
    return len(passed)


def commit_rechecks(store: Store, batch_id: int, revision_id: int,
                    entries: Sequence[tuple[Request, Any, Mapping[str, str]]],
                    source: str | None) -> None:
    """What passed, committed in one transaction of its own (run again if it meets another
    host's write in a deadlock: it takes the admission locks live returns take)."""
    committed(store, lambda tx: store.commit_rechecks(tx, batch_id, revision_id, entries,
                                                      source), calls=False)
