"""A run's plan: one frozen value saying what the run found before anything is recorded or spent.
``run.py``'s pure steps each return a new plan; recording, sending and reporting only read it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._content.keys import Keys
from .._content.tasks import Request
from .._ledger.records import Revision
from .registry import ValidatorVersion
from .spec import CheckedRun, RunSpec


@dataclass(frozen=True)
class RunPlan:
    """What is done (``finished``, or the requests accepted), what is owed (``pending``), what
    is re-judged (``rechecked``, ``broken``) and what a person should hear (``notes``)."""

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
    rechecked: tuple[tuple[Request, Any, dict[str, Any]], ...] = ()  # resolved by re-judging
    broken: tuple[dict[str, Any], ...] = ()  # a validator_error while re-judging
    owed: tuple[Request, ...] = ()  # kept when answers of unknown source exist
    sourceless_of: Mapping[str, str] = field(default_factory=dict)
    provider_notes: tuple[str, ...] = ()  # calls not sent as asked, and why
    client: Any = None  # the provider's batch API, when the run's transport is "batch"

    @property
    def total(self) -> int:
        """The run's tasks."""
        return self.remembered[0] if self.remembered else len(self.content.tasks)

    @property
    def resumed(self) -> int:
        """Requests accepted before this run, taken as they are."""
        return self.requests - len(self.pending) - len(self.rechecked)
