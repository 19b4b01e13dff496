"""Running a revision again: a finished run of a tasks file found without reading its tasks, and a
revision's requests read back from the ledger.

Checking a million tasks costs about a third of running them, so the ledger remembers a JSON Lines
file by the SHA-256 of its bytes; the same file under the same rules, wholly accepted, reads its
result from the ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .._content.keys import Keys, answer_source
from .._content.schema import compile_schema
from .._content.spool import file_digest, is_task_file
from .._content.tasks import normalize_identity
from .._errors import BatchJsonError
from .._fingerprint.fingerprint import fingerprint_function
from .._ledger.ledger import Ledger
from .._ledger.store import Store
from .plan import RunPlan
from .runtime import Runtime
from .spec import CheckedRun, RunSpec


def remember_file(store: Store, digest: str, tasks_component: str,
                  tasks: Sequence[Mapping[str, Any]]) -> None:
    """Record what the tasks file of ``digest`` holds, once its run has opened a revision."""
    fields: dict[str, None] = {}
    for task in tasks:
        fields.update(dict.fromkeys(task))
    store.task_file(digest, (tasks_component, len(tasks), list(fields)))


def find_completed(rt: Runtime, spec: RunSpec) -> RunPlan | None:
    """The finished plan of ``spec`` when its tasks file was seen before and nothing of it is
    owed (its tasks unread); None when the full path must run."""
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
    provider = rt.provider
    plan = RunPlan(spec, CheckedRun(spec, [], [], schema, normalize_identity(spec.identity)),
                   provider, answer_source(provider), remembered=(count, fields))
    return finished(rt.ledger, keyed(plan, validator, digest=tasks_component))


def keyed(plan: RunPlan, validator: str, digest: str | None = None) -> RunPlan:
    """The run's keys (``digest``: its tasks' component, when they are not read) and what of
    its judging no fingerprint fully sees."""
    spec, content, version = plan.spec, plan.content, plan.version
    keys = Keys.compose(content.tasks, content.schema, validator, spec.pack, spec.instructions,
                        content.identity, spec.mode, plan.source, digest=digest)
    return replace(plan, keys=keys, blind=tuple(
        [f"validator: {u}" for u in (version.fingerprint.unseen if version else ())]
        + [f"schema: {u}" for u in content.schema.unseen]))


def finished(ledger: Ledger, plan: RunPlan) -> RunPlan | None:
    """The plan with its revision when the current revision of exactly its keys has every
    request accepted: the one "already done?" look before a survey, for a tasks file found by
    its bytes and for tasks read (a resume then builds no request and reads no key)."""
    done = ledger.store.completed_revision(plan.spec.name, plan.keys.revision)
    if done is None:
        return None
    revision_id, _, leaves = done
    return replace(plan, finished=ledger.revisions(revision_id=revision_id)[0], requests=leaves)


def _validator_digest(rt: Runtime, spec: RunSpec) -> str | None:
    """The validator's fingerprint digest ("none" without one), or None when what it reads
    cannot all be seen (its answers are re-judged on every run)."""
    if spec.validator is None:
        return "none"
    handed = rt.validators.handed_over(spec.validator, spec.validator_name)
    fingerprint = (handed.fingerprint if handed is not None else
                   fingerprint_function(spec.validator))
    return None if fingerprint.partial else fingerprint.digest
