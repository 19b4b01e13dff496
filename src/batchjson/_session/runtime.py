"""What a run's steps use of the session, handed to them whole: the machinery that outlives a run
and the settings as they are at its start. Steps read this, never the session's private names, so
nothing below the session imports it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._loop import BackgroundLoop
from .._replay.budget import Budget, Tally
from .._replay.hosts import HostShare
from .._replay.pacing import Pacer
from .._replay.plan import Transport
from .evidence import Evidence
from .ledger import Ledger
from .registry import ValidatorRegistry


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
    configured: Callable[[], Any]  # the session's provider, built on first use

    @property
    def provider(self) -> Any:
        """The configured provider; refused (ProviderNotConfigured) when there is none."""
        return self.configured()

    def remember_provider(self, provider: Any) -> None:
        """A provider that runs on the session's loop, closed with it."""
        inner = getattr(provider, "inner", provider)  # the real provider, not a run's guard
        if not any(p is inner for p in self.used):
            self.used.append(inner)
