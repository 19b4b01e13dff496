"""Running a revision again: a finished run of a tasks file found without reading its tasks,
and the requests of a revision on record, their tasks read from the ledger's texts.

Checking a million tasks costs about a third of running them against an instant provider, so
a resume that re-read every task could never be cheap. A JSON Lines file's bytes decide its
tasks, so the ledger remembers, by the SHA-256 of those bytes (fed as they were read and
checked), the ``tasks`` component they gave, their count and field names. A later run of the
same file under the same rules finds its revision by that component; when the revision is
current and every request of it has an accepted return, nothing could be sent, and the result
is read from the ledger as it stands. Anything else (a new file, a change of rules, work still
owed, judging a fingerprint cannot fully see) takes the full path, which reads and checks
every task. The validator is registered as a full run registers it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._content.keys import Keys, answer_source
from .._content.schema import ItemSchema, compile_schema
from .._content.spool import file_digest, is_task_file
from .._content.tasks import Identity, normalize_identity
from .._errors import BatchJsonError
from .._fingerprint.fingerprint import fingerprint_function
from .._ledger.records import Revision
from .._ledger.store import Store
from .runtime import Runtime
from .spec import RunSpec


@dataclass(frozen=True)
class Completed:
    """A finished revision of a tasks file's run, found without reading the file's tasks."""

    revision: Revision
    leaves: int  # its leaf requests, every one accepted
    count: int  # its tasks
    fields: list[str]  # every field name its tasks use, in first-seen order
    schema: ItemSchema
    identity: Identity
    provider: Any
    source: str


def remember_file(store: Store, digest: str, tasks_component: str,
                  tasks: Sequence[Mapping[str, Any]]) -> None:
    """Record what the tasks file of ``digest`` holds, once its run has opened a revision."""
    fields: dict[str, None] = {}
    for task in tasks:
        fields.update(dict.fromkeys(task))
    store.record_task_file(digest, tasks_component, len(tasks), list(fields))


def find_completed(rt: Runtime, spec: RunSpec) -> Completed | None:
    """The finished revision of ``spec`` when its tasks file was seen before and nothing of
    it is owed; None when the full path must run."""
    if not is_task_file(spec.tasks):
        return None
    store = rt.ledger.store
    digest = file_digest(spec.tasks)
    memo = store.task_file(digest) if digest else None
    if memo is None:
        return None
    try:
        schema = compile_schema(spec.schema)
    except BatchJsonError:  # the full path says what is wrong, in its own order
        return None
    validator = _validator_digest(rt, spec)
    if schema.unseen or validator is None:
        return None
    tasks_component, count, fields = memo
    identity = normalize_identity(spec.identity)
    provider = rt.provider
    source = answer_source(provider)
    keys = Keys.compose((), schema, validator, spec.pack, spec.instructions, identity,
                        spec.mode, source, digest=tasks_component)
    done = store.completed_revision(spec.name, keys.revision)
    if done is None:
        return None
    revision_id, _, leaves = done
    return Completed(store.revision_by_id(revision_id), leaves, count, fields, schema,
                     identity, provider, source)


def _validator_digest(rt: Runtime, spec: RunSpec) -> str | None:
    """The validator's fingerprint digest ("none" without one), or None when what it reads
    cannot all be seen (its answers are re-judged on every run)."""
    if spec.validator is None:
        return "none"
    handed = rt.validators.handed_over(spec.validator, spec.validator_name)
    fingerprint = (handed.fingerprint if handed is not None else
                   fingerprint_function(spec.validator))
    return None if fingerprint.partial else fingerprint.digest
