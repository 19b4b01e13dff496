"""A run's plan (:class:`RunPlan`, the frozen value each pure step of ``run.py`` replaces), what
its steps use of the session (:class:`Runtime`), and the one "already done?" look, :func:`finished`
(for a tasks file by its bytes: checking a million tasks costs about a third of running them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._content.keys import Keys, answer_source
from .._content.schema import compile_schema
from .._content.tasks import Request, file_digest, is_task_file, normalize_identity
from .._errors import BatchJsonError
from .._fingerprint.fingerprint import fingerprint_function
from .._ledger.records import Revision
from .._loop import BackgroundLoop
from .._replay.budget import Budget, Tally
from .._replay.pacing import HostShare, Pacer
from .._replay.plan import Transport
from .accounts import Evidence
from .ledger import Ledger
from .registry import ValidatorRegistry, ValidatorVersion
from .spec import CheckedRun, RunSpec


@dataclass(frozen=True)
class RunPlan:
    """What is done, what is owed (``pending``), what is re-judged, what a person should hear."""

    spec: RunSpec
    content: CheckedRun  # no tasks when a tasks file's finished run was found by its bytes
    provider: Any
    source: str  # the provider's answer source, part of every key
    version: ValidatorVersion | None = None
    checker: Callable[[Any, Mapping[str, Any]], Any] | None = None
    notes: tuple[str, ...] = ()
    keys: Keys | None = None
    blind: tuple[str, ...] = ()  # judging no fingerprint fully sees
    existing: Revision | None = None  # the revision of this content already on record
    finished: Revision | None = None  # ... when every request of it is accepted: nothing owed
    remembered: tuple[int, list[str]] | None = None  # unread tasks file's count, field names
    requests: int = 0  # requests surveyed (a finished revision's leaves)
    pending: Sequence[Request] = ()  # what calls must resolve (a window.Pending: re-read)
    pending_tasks: int = 0
    largest: Request | None = None  # the pending request of the most tasks, as surveyed
    longest: Mapping[int, int] = field(default_factory=dict)  # of each number of tasks, the
    # longest pending request's text (characters), as surveyed: what the rate fit counts
    rechecked: tuple[tuple[Request, Any, dict[str, Any]], ...] = ()  # resolved by re-judging
    broken: tuple[dict[str, Any], ...] = ()  # a validator_error while re-judging
    owed: tuple[Request, ...] = ()  # kept when answers of unknown source exist
    sourceless_of: Mapping[str, str] = field(default_factory=dict)
    provider_notes: tuple[str, ...] = ()  # calls not sent as asked, and why
    client: Any = None  # the provider's batch API, when the run's transport is "batch"

    @property
    def total(self) -> int:
        return self.remembered[0] if self.remembered else len(self.content.tasks)

    @property
    def resumed(self) -> int:
        """Requests accepted before this run, taken as they are (a request re-judged in part
        stays pending: its rechecked part is no request of the survey)."""
        whole = sum("parted" not in origin.keys() for _, origin, _ in self.rechecked)
        return self.requests - len(self.pending) - whole


@dataclass(frozen=True)
class Runtime:
    """The session's machinery (shared by its runs) and its settings at a run's start."""

    session_id: str
    ledger: Ledger
    validators: ValidatorRegistry
    evidence: Evidence
    loop: BackgroundLoop  # one event loop for the session's life: runs are tasks on it
    used: list[Any]  # providers that ran on the loop, closed with it
    job_reservations: dict[int, float]  # batch lines' worst cases, by receipt
    job_schemas: dict[str, Any]  # fingerprint -> schema of the jobs this kernel ran
    pacer: Pacer
    hosts: HostShare
    tally: Tally
    budget: Budget
    transport: Transport
    concurrency: int
    repairs: int
    replays: int
    strict: bool
    job_poll: float
    on_note: Callable[[str], None] | None
    provider: Callable[[], Any]  # the session's provider, built on first use (or refused)

    def remember_provider(self, provider: Any) -> None:
        """A provider that runs on the session's loop, closed with it."""
        inner = getattr(provider, "inner", provider)  # the real provider, not a run's guard
        if not any(p is inner for p in self.used):
            self.used.append(inner)


def find_completed(rt: Runtime, spec: RunSpec) -> RunPlan | None:
    """The finished plan of a tasks file seen before with nothing owed (its tasks unread)."""
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
    fingerprint = None  # the validator's, which must be whole
    if spec.validator is not None:
        handed = rt.validators.handed_over(spec.validator, spec.validator_name)
        fingerprint = (handed.fingerprint if handed is not None else
                       fingerprint_function(spec.validator))
    if schema.unseen or (fingerprint is not None and fingerprint.partial):
        return None
    validator = "none" if fingerprint is None else fingerprint.digest
    tasks_component, count, fields = memo
    provider = rt.provider()
    plan = RunPlan(spec, CheckedRun([], schema, normalize_identity(spec.identity)),
                   provider, answer_source(provider), remembered=(count, fields))
    return finished(rt.ledger, keyed(plan, validator, digest=tasks_component))


def keyed(plan: RunPlan, validator: str, digest: str | None = None) -> RunPlan:
    """The run's keys (``digest``: its unread tasks' component) and what no fingerprint sees."""
    spec, content, version = plan.spec, plan.content, plan.version
    keys = Keys.compose(content.tasks, content.schema, validator, spec.pack, spec.instructions,
                        content.identity, spec.mode, plan.source, digest=digest)
    return replace(plan, keys=keys, blind=tuple(
        [f"validator: {u}" for u in (version.fingerprint.unseen if version else ())]
        + [f"schema: {u}" for u in content.schema.unseen]))


def finished(ledger: Ledger, plan: RunPlan) -> RunPlan | None:
    """The plan with its revision when the current one of its keys has every request accepted."""
    done = ledger.store.completed_revision(plan.spec.name, plan.keys.revision)
    if done is None:
        return None
    revision_id, _, leaves = done
    return replace(plan, finished=ledger.revisions(revision_id=revision_id)[0], requests=leaves)

