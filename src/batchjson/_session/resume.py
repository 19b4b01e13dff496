"""Resuming a completed run from a tasks file without reading its tasks again.

Checking a million tasks costs about a third of running them against an instant provider, so
a resume that re-read every task could never be cheap. A JSON Lines file's bytes decide its
tasks, so the ledger remembers, by the SHA-256 of those bytes (fed as they were read and
checked), the ``tasks`` component they gave, their count and field names. A later run of the
same file under the same rules finds its revision by that component; when the revision is
current and every request of it has an accepted return, nothing could be sent, and the result
is read from the ledger as it stands. Anything else (a new file, a change of rules, work still
owed, judging a fingerprint cannot fully see) takes the full path, which reads and checks
every task. The validator is fingerprinted and registered as a full run does it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._content.schema import compile_schema
from .._content.spool import file_digest, is_task_file
from .._content.tasks import (
    Request,
    compose_contents,
    normalize_identity,
    revision_fingerprint,
)
from .._errors import BatchJsonError
from .._fingerprint.fingerprint import fingerprint_function
from .._ledger.store import Store
from .._providers.base import answer_source
from .._replay.plan import Outcome
from .fit import check_fit
from .registry import ValidatorVersion
from .spec import RunSpec

if TYPE_CHECKING:
    from .result import BatchResult
    from .session import Session

UNKNOWN = object()  # a validator whose fingerprint cannot see all it reads


def remember_file(store: Store, digest: str, tasks_component: str,
                  tasks: Sequence[Mapping[str, Any]]) -> None:
    """Record what the tasks file of ``digest`` holds, once its run has opened a revision."""
    fields: dict[str, None] = {}
    for task in tasks:
        fields.update(dict.fromkeys(task))
    store.record_task_file(digest, tasks_component, len(tasks), list(fields))


def resumed_requests(store: Store, revision_id: int, tasks: Sequence[dict[str, Any]],
                     pack: int) -> list[Request]:
    """The leaf requests of a revision being run again, their tasks the run's own objects
    where a request is a whole pack (as the first run made them) rather than a second copy
    decoded from the ledger; a split half, or a pack whose task ids differ, is decoded."""
    out = []
    for row in store.leaf_rows(revision_id):
        start = row["position"] * pack
        request = None
        if row["parent_key"] is None:
            request = Request(row["key"], tuple(tasks[start:start + pack]), row["position"],
                              tasks_json=row["tasks"])
        if request is None or request.task_ids_json != row["task_ids"]:
            request = Request(row["key"], tuple(json.loads(row["tasks"])), row["position"],
                              row["parent_key"], tasks_json=row["tasks"])
        out.append(request)
    return out


def completed_from_file(session: Session, spec: RunSpec,
                        registered: ValidatorVersion | None) -> BatchResult | None:
    """The result of ``spec`` when its tasks file was seen before and its revision is complete
    (nothing would be sent); None when the full path must run."""
    if not is_task_file(spec.tasks):
        return None
    store = session.ledger.store
    digest = file_digest(spec.tasks)
    memo = store.task_file(digest) if digest else None
    if memo is None:
        return None
    try:
        schema = compile_schema(spec.schema)
    except BatchJsonError:  # the full path says what is wrong, in its own order
        return None
    validator = _validator_digest(spec, registered)
    if schema.unseen or validator is UNKNOWN:
        return None
    tasks_component, count, fields = memo
    ident = normalize_identity(spec.identity)
    provider = session.provider
    components, _, _ = compose_contents(
        (), schema, validator, spec.pack, spec.instructions, ident, spec.mode,
        answer_source(provider), digest=tasks_component)
    done = store.completed_revision(spec.name, revision_fingerprint(components))
    if done is None:
        return None
    changed = _register(session, spec, registered)  # as the full path would have, content equal
    revision_id, number, leaves = done
    result = session._result(spec.name, number, count, (), schema, Outcome(), resumed=leaves,
                             revision_id=revision_id)
    notes = check_fit(provider, session.ledger, spec.name, schema, [], ident, spec.mode)
    return session._described(result, spec, ident, [dict.fromkeys(fields)], provider, notes,
                              changed=changed)


def _validator_digest(spec: RunSpec, registered: ValidatorVersion | None) -> Any:
    """The validator's fingerprint digest ("none" without one), or UNKNOWN when what it
    reads cannot all be seen (its answers are re-judged on every run)."""
    if spec.validator is None:
        return "none"
    if registered is not None and registered.fn is spec.validator:
        fingerprint = registered.fingerprint
    else:
        fingerprint = fingerprint_function(spec.validator)
    return UNKNOWN if fingerprint.partial else fingerprint.digest


def _register(session: Session, spec: RunSpec, registered: ValidatorVersion | None) -> str | None:
    """Register the validator as a full run does (a strict session may refuse a change); the
    message when its name now has another version."""
    if spec.validator is None or (registered is not None and registered.fn is spec.validator):
        return None
    definition = session.validators.register(spec.validator, name=spec.validator_name)
    return definition.message if definition.kind == "changed" else None
