"""One call of the replay loop, one coroutine: reserve its worst case, claim the request and commit
the in-flight receipt, and only then send; judge the return and queue its record. What happened is
returned (:class:`Judged`, :class:`NotSent`); only a provider's failure is raised, to be retried."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._acceptance import judge as acceptance
from .._content.schema import wire_schema
from .._content.tasks import Request, shared_head
from .._errors import LedgerError, ProviderError
from .._ledger.ledger import Ledger
from .._ledger.records import now
from .._ledger.store_calls import ACCEPTED, MINE, OVER, Owner
from .._money import usd
from .._providers.base import Call, CallKind, Reply, estimate_tokens, input_bound, prefix_cacheable
from .._secrets import public_url
from .budget import Pricing, Spender, charge_of
from .groupcommit import GroupCommit
from .plan import Outcome, Plan, Transport, first_prompt, system_prompt
from .settle import Attempt, Settle, usage_of


@dataclass(frozen=True)
class NotSent:
    """Why a call was not sent, returned instead of raised: ``held`` by another live runner,
    ``resolved`` (accepted meanwhile), ``out_of_budget`` (``detail``: by how much), ``stopped``."""

    why: Literal["held", "resolved", "out_of_budget", "stopped"]
    detail: str = ""


@dataclass(frozen=True)
class Judged:
    """A call that was sent: the verdict on its return, and the return's text."""

    verdict: acceptance.Verdict
    raw: str | None


STOPPED = NotSent("stopped")


class Control:
    """Whether the run may open calls: ``stop`` says why not, ``fatal`` is what the run raises
    once every call has unwound; ``changed`` wakes workers waiting for work."""

    def __init__(self) -> None:
        self.stop: BaseException | None = None
        self.fatal: BaseException | None = None
        self.changed = asyncio.Event()
        self.workers: list[asyncio.Future] = []

    def halt(self, why: BaseException, *, fatal: bool = False) -> None:
        if fatal and self.fatal is None:
            self.fatal = why
        self.stop = why
        self.changed.set()

    def ledger_failed(self, exc: LedgerError) -> None:
        """No call is opened; calls in flight (their answers cannot be recorded) are cancelled."""
        self.halt(exc, fatal=True)
        current = asyncio.current_task()
        for worker in self.workers:
            if worker is not current:
                worker.cancel()


class HostProbe:
    """The first call that cannot connect probes the host alone (its own retries); every other
    call waits to hear whether the host is back before it is sent."""

    def __init__(self) -> None:
        self._up = asyncio.Event()
        self._up.set()
        self.prober: str | None = None  # the request whose retries probe an unreachable host

    def waits(self, key: str) -> bool:
        """Whether ``key``'s call must wait (:meth:`wait_turn`) to hear if the host is back."""
        return not self._up.is_set() and self.prober != key

    async def wait_turn(self, key: str) -> None:
        if self.waits(key):
            await self._up.wait()

    def failed(self, error: ProviderError, key: str) -> None:
        if not error.unreachable:
            self.back(key)
        elif self.prober is None:
            self.prober = key
            self._up.clear()

    def back(self, key: str) -> None:
        if self.prober == key:
            self.prober = None
            self._up.set()

    def give_up(self, key: str) -> bool:
        """Whether ``key``'s call was the probe; then waiting calls go on, to find the stop."""
        if self.prober != key:
            return False
        self._up.set()
        return True


class Caller(Settle):
    """A run's calls: :meth:`call` composes reserve -> claim -> send -> judge -> record; the live
    transport (``replay.Replayer``) drives them."""

    owner: Owner  # this run's, started when it runs

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, spender: Spender,
                 transport: Transport) -> None:
        super().__init__(plan, ledger.store, provider, spender, Outcome())
        self.ledger, self.transport = ledger, transport
        self.writes = GroupCommit(self.store)
        self.control = Control()
        self.attempts: dict[str, int] = {}  # each request's attempts so far (held while > 0)
        self.probe = HostProbe()
        self.settled = asyncio.Event()  # a reservation settled or was released
        self.system = system_prompt(plan)
        self.cached_prefix = plan.mode == "items" and prefix_cacheable(
            provider, self.system, shared_head(plan.instructions))
        self.provider_name = getattr(provider, "name", type(provider).__name__)
        self.model = getattr(provider, "model", None)
        # a provider's own client timeout at least as tight bounds every call: no second timer
        own = getattr(provider, "timeout", None) if getattr(
            provider, "enforces_timeout", False) else None
        self.needs_timer = not (isinstance(own, (int, float)) and own <= transport.timeout)

    def make(self, request: Request, kind: CallKind, prompt: str) -> Call:
        """The call for ``request``, numbered after its attempts so far; built before anything is
        reserved or written, so whatever fails here leaves no receipt."""
        return make_call(self.plan, self.system, request, kind, prompt,
                         self.attempts.get(request.key, 0), self.cached_prefix)

    async def call(self, request: Request, kind: CallKind, call: Call) -> Judged | NotSent:
        """Reserve, claim and commit the receipt of ``call``; then send it, judge and record the
        return. A provider's failure is raised after its receipt is queued."""
        if self.probe.waits(request.key):  # another call finds out if the host is up
            await self.probe.wait_turn(request.key)
        if self.control.stop is not None:
            return STOPPED
        opened = await self._open(request, kind, call, estimate_tokens(self.system + call.prompt))
        if isinstance(opened, NotSent):
            return opened
        reserved, claimed = opened
        self.attempts[request.key] = call.attempt + 1
        self.outcome.calls += 1
        self.outcome.calls_log.append(request.task_ids_json)
        attempt = Attempt(claimed, reserved, reserved, request, now(), billable=True)
        got: Reply | ProviderError | None = None
        try:
            got = await self._send(call)
            verdict, write = await self.settle(attempt, got)
            # queued, not awaited: the run flushes and checks every write before it returns
            self.writes.queue(write)
            if isinstance(got, ProviderError):
                raise got  # for the transport retries, its receipt queued
            assert verdict is not None
            return Judged(verdict, got.text)
        except BaseException as exc:  # cancellation, Ctrl-C, SystemExit: close the receipt
            if got is None:
                self.spender.settle(reserved, None)  # sent, answer unknown: the worst case
            if not isinstance(exc, ProviderError):
                # An answer that arrived but was interrupted while being judged is paid for:
                # its text and usage are kept, and a re-run judges it before asking again.
                why = ("interrupted" if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt))
                       else f"stopped by {type(exc).__name__}")
                self._close(claimed, why, attempt.sent_at, got if isinstance(got, Reply) else None,
                            reserved)
            raise

    def host_down(self, exc: ProviderError, key: str) -> bool:
        """The probing call's retries all failed to connect: the run stops, naming the host."""
        if not exc.unreachable or not self.probe.give_up(key):
            return False
        where = getattr(self.provider, "url", None) or getattr(self.provider, "base_url", None)
        target = public_url(where) if isinstance(where, str) else (
            f"the {self.provider_name} provider")
        self.control.fatal = ProviderError(
            f"cannot reach {target}: is the server running? The run stopped after "
            f"{self.transport.retries + 1} tries of one call, and no other request was sent "
            f"({exc})", retryable=False, unreachable=True)
        self.control.halt(self.control.fatal)
        return True

    async def _reserve(self, bound: int) -> float | NotSent:
        """Reserve ``bound`` when it did not fit at once: wait for calls in flight to settle before
        giving up, their real cost usually below their reservation."""
        spender = self.spender
        while spender.waiting_on_reservations and spender.stopped is None:
            self.settled.clear()
            await self.settled.wait()
            if self.control.stop is not None:
                return STOPPED
            reserved = spender.reserve(bound)
            if reserved is not None:
                return reserved
        return NotSent("out_of_budget", str(spender.shortfall(bound)))

    async def _open(self, request: Request, kind: CallKind, call: Call,
                    estimated: int) -> tuple[float, int] | NotSent:
        """Reserve, claim, commit the receipt: (reserved, receipt id), or why not, nothing kept."""
        store, plan = self.store, self.plan
        floor = self.spender.pricing.floor(estimated)  # for the account: an estimate
        bound = input_bound(self.provider, call) if self.spender.costed else 0
        pause: float | NotSent = 0.05
        while isinstance(pause, float):
            reserved = self.spender.reserve(bound)
            if reserved is None:
                reserved = await self._reserve(bound)
            if isinstance(reserved, NotSent):
                return reserved
            shared = reserved if self.spender.shared is not None else None
            begun = self.writes.submit(lambda tx, shared=shared: store.begin_call_later(
                tx, plan.batch_id, plan.revision_id, request, kind, self.provider_name,
                self.model, plan.source, owner=self.owner, estimated_input_tokens=estimated,
                cost_floor=floor, reserve=shared))
            try:
                state, attempt_id = await begun
            except asyncio.CancelledError:
                self.spender.release(reserved)
                if begun.done() and not begun.cancelled() and begun.exception() is None:
                    attempt = begun.result()[1]  # committed, but cancelled before we resumed
                    if attempt is not None:
                        self._close(attempt, "interrupted", None)
                raise
            except Exception as exc:
                self.spender.release(reserved)
                self.control.ledger_failed(exc if isinstance(exc, LedgerError) else LedgerError(
                    "the receipt of a call could not be written", path=self.ledger.where,
                    cause=exc))
                return STOPPED
            if state == MINE:
                assert attempt_id is not None
                if not self.probe.waits(request.key) and self.control.stop is None:
                    return reserved, attempt_id
                return await self._when_host_up(request, reserved, attempt_id)
            self.spender.release(reserved)  # nothing will be sent: its receipt was not kept
            if state != OVER:
                return NotSent("resolved" if state == ACCEPTED else "held")
            pause = await self._await_ledger_budget(reserved, pause)
        return pause

    async def _when_host_up(self, request: Request, reserved: float,
                            attempt_id: int) -> tuple[float, int] | NotSent:
        """A call failed to connect meanwhile: send only if its host is back and the run goes on."""
        try:
            await self.probe.wait_turn(request.key)
        except asyncio.CancelledError:
            self.spender.release(reserved)
            self._close(attempt_id, "interrupted", None)
            raise
        if self.control.stop is not None:  # stopped while the receipt was committed
            self.spender.release(reserved)
            self._close(attempt_id, "stopped before it was sent", None)
            return STOPPED
        return reserved, attempt_id

    async def _await_ledger_budget(self, worst: float, pause: float) -> float | NotSent:
        """The ledger's budget cannot hold a call: look again after ``pause`` (the next is returned)
        while calls in flight could make room; else give up, saying what is left."""
        if self.spender.shared is None:
            return NotSent("out_of_budget", "a cost budget was set on the ledger after this "
                           "run started, so its calls were not priced against it; re-run to "
                           "hold it")
        shared = self.ledger.budget()
        if shared is None:  # removed a moment ago: the next try holds nothing
            return pause
        if not shared["reserved"] or worst > shared["cost"] - shared["spent"]:
            return NotSent(
                "out_of_budget",
                f"one call for it may cost up to {usd(worst)} and the ledger's cost budget of "
                f"{usd(shared['cost'])} has {usd(shared['left'])} left "
                f"({usd(shared['reserved'])} held by calls in flight on every host)")
        await asyncio.sleep(pause)
        if self.control.stop is not None:
            return STOPPED
        return min(pause * 1.5, 1.0)

    def _close(self, attempt_id: int, why: str, sent_at: str | None,
               reply: Reply | None = None, reserved: float = 0.0) -> None:
        # ``reserved`` is charged, or a reply's cost. Synchronous: the loop may be unwinding. A
        # completed receipt is left as it is; if the ledger failed, it stays in flight.
        self.writes.flush_now()
        kept = reply is not None and isinstance(reply.text, str)
        charge = reserved if reply is None else charge_of(reserved, self.cost(reply))
        errors = [{"type": "cancelled", "task_id": None,
                   "message": (f"{why}; re-run to resume" if sent_at is None else
                               f"{why} before the return was judged; re-run to resume")
                   + (" (the answer is kept and is judged first)" if kept else "")}]
        try:
            with self.store.transaction(calls=True) as tx:
                self.store.complete_call(
                    tx, attempt_id, "cancelled", reply.text if kept else None,
                    usage_of(reply) if kept else {}, errors=errors, sent_at=sent_at,
                    charge=charge if self.spender.shared is not None else None)
        except LedgerError as exc:
            self.control.ledger_failed(exc)

    async def _send(self, call: Call) -> Reply | ProviderError:
        """The live transport: ``call``'s reply, or the provider's failure (a timeout, a bug)."""
        try:
            if not self.needs_timer:
                reply = await self.provider.complete(call)
            else:
                async with asyncio.timeout(self.transport.timeout):
                    reply = await self.provider.complete(call)
        except (ProviderError, TimeoutError) as exc:
            error = exc if isinstance(exc, ProviderError) else ProviderError(
                f"no answer within {self.transport.timeout:g}s", retryable=True)
            self.probe.failed(error, call.request_key)
            return error
        except Exception as exc:  # a provider bug (never a cancellation) is a failure too
            error = ProviderError(f"{type(exc).__name__}: {exc}", retryable=False)
            error.__cause__ = exc
            return error
        self.probe.back(call.request_key)
        return reply


def make_call(plan: Plan, system: str, request: Request, kind: CallKind, prompt: str,
              number: int, cached_prefix: bool = False) -> Call:
    """``cached_prefix``: the shared prefix is long enough to cache, so the wire schema is the
    batch's constant one (docs/providers.md); the provider gets its own copy of the tasks."""
    tasks = tuple(json.loads(request.tasks_json))
    shared = ""
    if plan.mode == "value":
        schema: Mapping[str, Any] = plan.schema.json_schema
    else:
        schema = wire_schema(plan.schema, tasks, plan.identity, pinned=not cached_prefix)
        shared = shared_head(plan.instructions)
    return Call(tasks=tasks, prompt=prompt, system=system, schema=schema, attempt=number,
                kind=kind, request_key=request.key, mode=plan.mode, identity=plan.identity,
                shared=shared if prompt.startswith(shared) else "",
                answer_chars=plan.answer_chars(tasks))


def cheapest_call(plan: Plan, provider: Any, pricing: Pricing,
                  requests: Sequence[Request]) -> Callable[[float], float | None]:
    """For ``Spender.refuse_if_short``: the worst case of the first pending call that fits what the
    cost budget has left, else the least worst case of all, which no call beats."""
    def cheapest(left: float) -> float | None:
        system, least = system_prompt(plan), None
        for request in requests:
            call = make_call(plan, system, request, "initial", first_prompt(plan, request), 0)
            worst = pricing.worst_case(input_bound(provider, call))
            if worst <= left:
                return worst
            least = worst if least is None else min(least, worst)
        return least

    return cheapest
