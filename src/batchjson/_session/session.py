"""A session: one ledger, one validator registry, one provider, and the budgets over them; every
face runs through ``Session.run``."""

from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._errors import InvalidBatch
from .._ledger.ledger import Ledger as StoredLedger
from .._loop import BackgroundLoop
from .._providers.base import close_provider
from .._providers.select import make_provider, provider_label
from .._replay.budget import Budget, Tally
from .._replay.pacing import HostShare, Pacer, RateLimits
from .._replay.plan import Transport
from . import structured
from .accounts import Evidence
from .advice import advise
from .estimate import Estimate, estimate_run
from .ledger import Ledger
from .plan import Runtime
from .registry import ValidatorRegistry
from .result import BatchResult
from .run import run_spec
from .spec import Accept, OnExhausted, RunSpec, SessionOptions, TransportName


class Session:
    """Holds what must outlive a cell: the ledger, the validator registry and the budget."""

    def __init__(
        self,
        provider: Any = None,
        *,
        ledger: str | Path | Ledger | None = None,
        strict: bool = False,
        budget: Budget | Mapping[str, Any] | int | None = None,
        concurrency: int = 16,
        repairs: int = 1,
        replays: int = 1,
        transport_retries: int = 3,
        timeout: float = 120.0,
        model: str | None = None,
        rate_limits: RateLimits | Mapping[str, int] | tuple[int, int] | None = None,
        max_rate_wait: float = 60.0,
    ) -> None:
        options = SessionOptions(**{k: v for k, v in locals().items()  # checked first
                                    if k not in ("self", "provider", "ledger", "rate_limits")})
        # One pacer for every run of the session (docs/providers.md, "Rate limits").
        self.pacer = Pacer(RateLimits.of(rate_limits), options.concurrency)
        self.ledger = ledger if isinstance(ledger, StoredLedger) else Ledger(ledger)
        self.strict = options.strict
        self.budget = options.budget
        self.concurrency = options.concurrency
        self.repairs = options.repairs
        self.replays = options.replays
        self.transport = Transport(retries=options.transport_retries, timeout=options.timeout,
                                   max_rate_wait=options.max_rate_wait)
        self.model = model
        self._provider_spec = provider
        self._provider: Any = None
        store = self.ledger.store
        self.validators = ValidatorRegistry(
            strict=self.strict,
            unresolved_under=lambda digest: len(store.unresolved(validator=digest)),
            numbering=lambda v: store.number_validator(
                v.name, v.fingerprint.digest, v.where, v.fingerprint.by_identity))
        self.evidence = Evidence(self.ledger)
        self.tally = Tally()  # charged as calls are reserved, by every run and thread
        # Told things a person should hear before anything is spent (e.g. a supersession).
        self.on_note: Callable[[str], None] | None = None
        # One event loop for the session's life: runs are tasks on it, connections are reused.
        self.id = uuid.uuid4().hex[:12]
        self._loop = BackgroundLoop(f"batchjson-{self.id}")
        self._used: list[Any] = []  # providers that ran on the loop, closed with it
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._used)
        # A live host of the ledger: the sessions on it share the account's rate limits.
        self.hosts = HostShare(store, self.id, self.pacer)
        self.hosts.join()
        weakref.finalize(self, self.hosts.owner.stop)  # a collected session is gone at once
        self.job_poll = 1.0  # seconds between looks at a batch job while a run waits on it
        self._job_reservations: dict[int, float] = {}  # batch lines' worst cases, by receipt
        self._job_schemas: dict[str, Any] = {}  # fingerprint -> schema jobs of this kernel use

    @property
    def rate_limits(self) -> RateLimits:
        """The limits the session paces to (those set; learnt ones are ``pacer.learnt``)."""
        return self.pacer.limits

    @rate_limits.setter
    def rate_limits(self, value: Any) -> None:
        limits = RateLimits.of(value)  # refused here, on the caller's thread
        self._loop.call(lambda: self.pacer.set_limits(limits))  # where the runs pace

    @property
    def spent_calls(self) -> int:
        return self.tally.calls

    @property
    def spent_cost(self) -> float:
        """USD charged to the cost budget by settled calls: each at its real cost, or at its
        worst case when its cost is unknown (the ledger records that cost as unknown)."""
        return self.tally.cost

    def __repr__(self) -> str:
        spec = self._provider if self._provider is not None else self._provider_spec
        return (f"Session(provider={'None' if spec is None else provider_label(spec)}, "
                f"ledger={self.ledger!r}, strict={self.strict}, {self.evidence!r})")

    @property
    def provider(self) -> Any:
        """The configured provider, built on first use so a missing one fails before spending."""
        if self._provider is None:
            self._provider = make_provider(self._provider_spec, model=self.model)
        return self._provider

    @provider.setter
    def provider(self, spec: Any) -> None:
        self._provider_spec = spec
        self._provider = None

    def close(self) -> None:
        """Close pooled provider connections, stop the session's event loop, close the ledger."""
        self._finalizer()
        self.hosts.leave()
        self.ledger.close()

    def run_batch(
        self,
        name: str,
        tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
        schema: Any,
        *,
        validator: Callable[..., Any] | None = None,
        identity: Sequence[str] | str | None = None,
        pack: int = 1,
        instructions: str | None = None,
        repairs: int | None = None,
        replays: int | None = None,
        split: bool = False,
        max_calls: int | None = None,
        on_exhausted: OnExhausted = "raise",
        progress: bool | None = None,
        reask_refusals: bool = False,
        transport: TransportName = "live",
        wait: bool = False,
        accept: Accept = "whole",
    ) -> BatchResult:
        """Resolve every task of batch ``name`` or say exactly what is still owed.

        Identical content resumes (accepted requests are not paid again); changed content opens a
        new revision, which first re-judges earlier returns when only the judging changed.
        ``validator(item, task)`` (a dict, or a model instance for a pydantic schema; sync or
        ``async def``) raises ValueError or returns False to reject an item. ``identity=None``
        compares ``task_id`` and every other task field an item echoes; a list compares exactly
        those fields. ``tasks`` is a list, any iterable (read once) or the path of a JSON Lines
        file. ``transport="batch"``: provider batch jobs at batch prices (docs/providers.md).
        ``progress=None`` shows it on a terminal or in a notebook, not in a pipe or a log.
        ``accept="items"`` commits the items of a return that pass, and asks again for the
        others (docs/design.md, "Item-level acceptance")."""
        options = {k: v for k, v in locals().items() if k != "self"}  # the arguments, as given
        return self.run(RunSpec(**options))

    def estimate(self, name: str, tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
                 schema: Any, **options: Any) -> Estimate:
        """What ``run_batch`` with the same arguments would send and spend (an :class:`Estimate`),
        with nothing sent or recorded. ``tasks`` given as an iterator is read here (pass a list
        or a file to run it after)."""
        return estimate_run(self.runtime(), RunSpec(name=name, tasks=tasks, schema=schema,
                                                    **options))

    def llm_batch_json(self, prompts: Sequence[str], schema: Any,
                       contexts: Sequence[str] | None = None, max_repair_attempts: int = 1,
                       validator: Callable[[Any, int], Any] | None = None, *,
                       name: str | None = None) -> dict[str, Any]:
        """droste's ``llm_batch_json`` contract, with content-keyed evidence in the ledger."""
        return structured.llm_batch_json(self, prompts, schema, contexts, max_repair_attempts,
                                         validator, name=name)

    def run(self, spec: RunSpec) -> BatchResult:
        """Run one :class:`RunSpec`: every face ends here."""
        if not isinstance(spec, RunSpec):
            raise InvalidBatch(f"Session.run takes a RunSpec, got {type(spec).__name__}")
        return run_spec(self.runtime(), spec)

    def runtime(self) -> Runtime:
        """What a run's steps use of this session: its machinery, its settings as they are."""
        return Runtime(
            self.id, self.ledger, self.validators, self.evidence, self._loop, self._used,
            self._job_reservations, self._job_schemas, self.pacer, self.hosts, self.tally,
            self.budget, self.transport, self.concurrency, self.repairs, self.replays,
            self.strict, self.job_poll, self.on_note, lambda: self.provider)

    def advise(self, name: str, **options: Any) -> dict[str, Any]:
        """Pack-size advice for batch ``name`` (docs/recovery.md); options: candidates=, modes=,
        max_unresolved=, resamples=."""
        options.setdefault("repairs", self.repairs)
        options.setdefault("replays", self.replays)
        return advise(self.ledger, name, **options)


def _shutdown(loop: BackgroundLoop, providers: list[Any]) -> None:
    """Close what the providers pooled on the session's loop, then stop it (at exit too)."""
    async def close_all() -> None:
        for provider in providers:
            try:
                await close_provider(provider)
            except Exception:  # noqa: BLE001 - one provider failing to close must not stop
                pass

    loop.close(close_all)


_default: Session | None = None


def default_session(*, create: bool = True) -> Session | None:
    """The session the ``validator`` decorator and faces use when none is given; with
    ``create=False``, None when there is none yet (a face restoring the previous one)."""
    global _default
    if _default is None and create:
        _default = Session(provider=os.environ.get("BATCHJSON_PROVIDER") or None)
    return _default


def set_default_session(session: Session | None) -> None:
    global _default
    _default = session


def validator(fn: Callable | None = None, *, name: str | None = None) -> Any:
    """Register a validator once per session (``@validator``, ``@validator(name="x")`` or
    ``validator(fn)``): re-running the defining cell hands back the first function object while its
    content is unchanged, so identity-keyed code downstream sees one validator."""
    return default_session().validators.define(fn, name=name)
