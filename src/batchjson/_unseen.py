"""Judging the fingerprint cannot fully see: stored answers are re-judged, never reused on trust.

A validator (or a pydantic schema's validators) reading ``globals()["X"]`` or calling ``eval``
has a *partial* fingerprint: the same digest may hide different logic, so a request key built
from it cannot say whether stored answers still pass. Such a run adds an ``unseen`` component to
its revision: a token naming one *generation* of the judging. The latest generation is kept while
every answer it accepted still passes the rules as they are now (checked locally, no call);
otherwise a new generation opens, which re-judges earlier returns (see :mod:`batchjson._rejudge`)
and sends only what no longer passes. Runs whose fingerprints see everything are untouched.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _acceptance as acceptance
from ._ledger import Ledger
from ._ledger.records import Revision
from ._providers.base import Reply
from ._schema import ItemSchema

COMPONENT = "unseen"


def blind_spots(validator_unseen: Sequence[str], schema: ItemSchema) -> list[str]:
    """What the judging reads that no fingerprint can see, named for the user."""
    return ([f"validator: {u}" for u in validator_unseen]
            + [f"schema: {u}" for u in schema.unseen])


def generation(ledger: Ledger, name: str, components: Mapping[str, str], *,
               verify: Callable[[Revision], bool]) -> str:
    """The ``unseen`` token for this run: the latest generation of the same content if every
    answer it accepted passes now (``verify``), else a new one."""
    for revision in reversed(ledger.revisions(name)):
        theirs = revision.components
        if COMPONENT not in theirs or set(theirs) != set(components) | {COMPONENT}:
            continue
        if all(theirs[k] == v for k, v in components.items()):
            if verify(revision):
                return theirs[COMPONENT]
            break  # the latest generation no longer holds: open a new one
    return uuid.uuid4().hex


def still_passes(ledger: Ledger, revision: Revision, *, run: Callable[..., Any], mode: str,
                 identity: Sequence[str], schema: ItemSchema,
                 validator: Callable[..., Any] | None) -> bool:
    """Whether every answer ``revision`` accepted passes the current rules, giving the very
    values it committed (a schema that now coerces differently does not hold either)."""
    requests = ledger.leaves(revision.id)
    accepted = ledger.accepted_keys([r.key for r in requests])
    committed = ledger.checkpoint(revision.batch, revision.id)
    work = []
    for request in requests:
        if request.key not in accepted:
            continue
        found = ledger.store.accepted_return(request.key)
        if found is None:  # accepted without a raw text on record: nothing to re-judge
            return False
        work.append((request, found[0]["raw"]))

    async def judge_all() -> bool:
        for request, raw in work:
            verdict = await acceptance.judge(
                Reply(text=raw), request.tasks, mode=mode, identity=identity, schema=schema,
                validator=validator)
            if not verdict.accepted or any(
                    _json(verdict.stored.get(t)) != _json(committed.get(t))
                    for t in request.task_ids):
                return False
        return True

    return run(judge_all) if work else True


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
