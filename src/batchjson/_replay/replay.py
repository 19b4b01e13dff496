"""The live transport: ``concurrency`` workers resolve each request, or give up, within a fixed
allowance, taking requests from one queue; what another runner holds waits till the end. Each call
is one coroutine (:meth:`Replayer.call`): reserve its worst case, claim the request and commit the
in-flight receipt, and only then send; judge the return and queue its record. What happened is
returned (:class:`Judged`, :class:`NotSent`); only a provider's failure is raised, to be retried."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, Literal

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential, wait_random

from .._acceptance import judge as acceptance
from .._content.tasks import Request, shared_head
from .._errors import LedgerError, ProviderError
from .._ledger import Ledger
from .._ledger.records import now
from .._ledger.store_calls import ACCEPTED, MINE, OVER, PARTED, Owner
from .._money import usd
from .._providers.base import Call, CallKind, Reply, estimate_tokens, input_bound, prefix_cacheable
from .._providers.ratelimits import HEADER_LISTENER, limits_account, request_tokens
from .._providers.settings import call_output_cap
from .._secrets import public_url
from .._sources import TRUNCATED
from .budget import Spender
from .groupcommit import GroupCommit, committed
from .pacing import COUNT_SECONDS, HostShare, Pacer
from .plan import Outcome, Plan, Transport, first_prompt, make_call, system_prompt
from .settle import (
    HALVE,
    NONE,
    Attempt,
    Settle,
    Tried,
    fail,
    next_attempt,
    provider_error,
    rest_tried,
    usage_of,
)

Item = tuple[Request, int]  # a queued request and its split depth
FEED = 500  # requests taken from a stream into the queue at once
# The pause before each look at requests other runners hold, growing while nothing changes.
HELD_POLL = (0.02, 0.25)
SAY_WAIT = 5.0  # a rate-limit wait longer than this is said in the run's progress
# A write waits at most this share of a call's time, and at most COMMIT_WAIT seconds, for the
# writes of other calls to share its transaction (GroupCommit.window); only while another call
# is due to answer meanwhile, by the calls in flight or by answers arriving bunched, so calls
# answering apart never wait.
COMMIT_SHARE = 0.02
COMMIT_WAIT = 0.005


@dataclass(frozen=True)
class NotSent:
    """Why a call was not sent, returned instead of raised: ``held`` by another live runner,
    ``resolved`` (accepted meanwhile), ``parted`` (accepted in part meanwhile: only its rejected
    tasks are owed), ``out_of_budget`` (``detail``: by how much), ``stopped``."""

    why: Literal["held", "resolved", "parted", "out_of_budget", "stopped"]
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
        """``key``'s call reached the host, or will not be sent: if it was probing, another
        call finds out next."""
        if self.prober == key:
            self.prober = None
            self._up.set()

    def give_up(self, key: str) -> bool:
        """Whether ``key``'s call was the probe; then waiting calls go on, to find the stop."""
        if self.prober != key:
            return False
        self._up.set()
        return True


class Replayer(Settle):
    """Drives every unresolved request of a plan concurrently through provider and acceptance,
    each call one coroutine: :meth:`call` composes reserve -> claim -> send -> judge -> record."""

    owner: Owner  # this run's, started when it runs

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, spender: Spender,
                 transport: Transport, concurrency: int,
                 on_progress: Callable[[int], None] | None = None, *,
                 session_id: str = "session", pacer: Pacer | None = None,
                 hosts: HostShare | None = None,
                 on_wait: Callable[[str], Any] | None = None) -> None:
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
        self.concurrency = concurrency
        self.on_progress = on_progress
        self.on_wait = on_wait  # says a long rate-limit wait in the progress ("" when over)
        self._limited_since: float | None = None  # this run's calls meet 429s since then
        self.session_id = session_id
        self.pacer = pacer
        self.hosts = hosts  # this session among the ledger's hosts: its share of the limits
        # whose limits the calls spend, when the provider reports them: kept in the ledger
        self.account = limits_account(provider) if pacer is not None else None
        if pacer is not None:
            pacer.set_ceiling(concurrency)
            if self.account is not None:
                pacer.learn()
        self._cut_off: set[str] = set()  # requests cut off before under the same settings
        self._parted: dict[str, list[str]] = {}  # requests accepted in part: the tasks rejected
        self.retrying = transport_retrying(transport)
        self._sending = 0  # calls sent and not yet answered
        self._call_seconds = 0.0  # a call's time at the provider, a moving average
        self._answered_at = 0.0  # when the last call answered (time.monotonic)
        self._reaped_at = 0.0  # when gone runners' calls were last looked for (time.monotonic)

    async def call(self, request: Request, kind: CallKind, call: Call) -> Judged | NotSent:
        """Reserve, claim and commit the receipt of ``call``; then send it, judge and record the
        return. A provider's failure is raised after its receipt is queued."""
        if self.probe.waits(request.key):  # another call finds out if the host is up
            await self.probe.wait_turn(request.key)
        if self.control.stop is not None:
            self.probe.back(request.key)  # a probing call not sent: the waiting calls go on
            return STOPPED
        opened = await self._open(request, kind, call, estimate_tokens(self.system + call.prompt))
        if isinstance(opened, NotSent):  # out of budget, held or done elsewhere: likewise
            self.probe.back(request.key)
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
            if verdict is not None and verdict.partial:
                verdict = await self._split(verdict, write)
            else:  # queued, not awaited: the run flushes and checks every write before it returns
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

    async def _split(self, verdict: acceptance.Verdict, write: Any) -> acceptance.Verdict:
        """A partial return committed before its rest is asked: when another runner's return
        admitted the request meanwhile (its claim taken over), it is done, its rest never asked."""
        try:  # shielded: interrupted, the write still runs (the receipt's close flushes it)
            split = await asyncio.shield(self.writes.submit(write))
        except Exception:  # noqa: BLE001 - a failed write: raised with the run's others
            return verdict
        return verdict if split else replace(verdict, accepted=True, errors=[])

    async def _reserve(self, bound: int) -> float | NotSent:
        """Reserve ``bound`` when it did not fit at once: wait for calls in flight to settle before
        giving up, their real cost usually below their reservation."""
        spender = self.spender
        while spender.costed and spender.outstanding and spender.stopped is None:
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
                return NotSent("resolved" if state == ACCEPTED else
                               "parted" if state == PARTED else "held")
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
        if shared["reserved"] and self._reaped():  # a gone host's calls held part of it: now
            return pause  # charged their worst case and freed, the next try sees what is left
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

    def _reaped(self) -> bool:
        """Whether runners found gone (their process dead, their lease expired) gave up calls
        in flight just now: their reservations are what a waiting call waits on, and no live
        runner would ever release them."""
        now = time.monotonic()
        if now - self._reaped_at < 1.0:  # every waiting call of the run asks: one looks a second
            return False
        self._reaped_at = now
        try:
            return bool(self.store.reap())
        except LedgerError as exc:
            self.control.ledger_failed(exc)
            return False

    def _close(self, attempt_id: int, why: str, sent_at: str | None,
               reply: Reply | None = None, reserved: float = 0.0) -> None:
        # ``reserved`` is charged, or a reply's cost. Synchronous: the loop may be unwinding. A
        # completed receipt is left as it is; if the ledger failed, it stays in flight.
        self.writes.flush_now()
        kept = reply is not None and isinstance(reply.text, str)
        charge = self.ledger_charge(reserved, None if reply is None else self.cost(reply))
        errors = [{"type": "cancelled", "task_id": None,
                   "message": (f"{why}; re-run to resume" if sent_at is None else
                               f"{why} before the return was judged; re-run to resume")
                   + (" (the answer is kept and is judged first)" if kept else "")}]
        try:
            committed(self.store, lambda tx: self.store.complete_call(
                tx, attempt_id, "cancelled", reply.text if kept else None,
                usage_of(reply) if kept else {}, errors=errors, sent_at=sent_at, charge=charge))
        except LedgerError as exc:
            self.control.ledger_failed(exc)

    async def _send(self, call: Call) -> Reply | ProviderError:
        """The live transport: ``call``'s reply, or the provider's failure (a timeout, a bug);
        its time at the provider sets how long writes wait for one another."""
        self._sending += 1
        sent = time.monotonic()
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
        finally:
            self._sending -= 1
            self._share_commits(time.monotonic() - sent)
        self.probe.back(call.request_key)
        return reply

    def _share_commits(self, seconds: float) -> None:
        """Let writes wait for others (:attr:`GroupCommit.window`) while another call is due
        within the wait: the calls in flight answer that often on average, or the answers come
        bunched (this one within the wait of the last, as calls sent together answer together).
        The wait is at most :data:`COMMIT_SHARE` of a call's time, by the last call's time when
        that is shorter than the average (a model that just sped up), and never over
        :data:`COMMIT_WAIT`; with no call in flight, nothing waits."""
        average = self._call_seconds
        average = seconds if not average else average + (seconds - average) / 16
        self._call_seconds = average
        pace = min(average, seconds)
        wait = min(COMMIT_WAIT, COMMIT_SHARE * pace)
        answered = time.monotonic()
        bunched = answered - self._answered_at <= wait
        self._answered_at = answered
        due = self._sending > 0 and (bunched or self._sending * wait >= pace)
        self.writes.window = wait if due else 0.0

    async def run(self, requests: Iterable[Request]) -> Outcome:
        """Drive every request of the stream, taken :data:`FEED` at a time as the queue runs low."""
        self.owner = Owner.start(self.session_id)
        self.spender.on_settle = self.settled.set
        self.store.reap()  # runners that are gone give up their claims before we start
        if self.hosts is not None:  # the share of the limits as it is now, before any call
            hosts, account = self.hosts, self.account
            await self.writes.submit(hosts.count if account is None else
                                     lambda tx: hosts.recall(tx, account))
        self._queue: deque[Item] = deque()
        self._feed: Iterator[Request] | None = iter(requests)
        self._fill()
        self._held: list[Item] = []
        self._turns = asyncio.Lock()  # the worker waiting for the pacer's next turn
        self._active = 0
        self._poll = HELD_POLL[0]
        self._polling = False
        self._next_sweep = 0.0  # when the queue may next be checked against the ledger
        # Splitting can turn one request into many: with split on, size the pool for tasks.
        work = (sum(len(item[0].tasks) for item in self._queue) if self.plan.split
                else len(self._queue))
        workers = [asyncio.ensure_future(self._worker()) for _ in range(
            self.concurrency if self._feed is not None else min(self.concurrency, work))]
        self.control.workers = workers
        lease = asyncio.ensure_future(self._renew())
        try:
            await asyncio.gather(*workers)
        except asyncio.CancelledError:
            if self.control.fatal is None:
                raise  # interrupted from outside; a ledger failure is raised below instead
        finally:
            for worker in workers:
                worker.cancel()
            # Let cancelled workers close their receipts before the run returns.
            if workers:  # none when every owed request is held elsewhere (a batch job)
                await asyncio.wait(workers)
            lease.cancel()
            self.writes.queue(lambda tx: self.store.claims(tx, self.owner, "release"))
            self.writes.flush_now()  # whatever was judged is committed before we return
            self.owner.stop()
        if self.control.fatal is not None:
            raise self.control.fatal
        try:
            self.writes.raise_failures()
        except LedgerError:
            raise
        except Exception as exc:  # a write that failed on its own: still a lost record
            raise LedgerError("a record of this run could not be written",
                              path=self.ledger.where, cause=exc) from exc
        return self.outcome

    async def _renew(self) -> None:
        """Renew this run's claims every third of the lease, and its host row every tick."""
        period = self.store.lease_seconds / 3
        tick = period if self.hosts is None else min(period, COUNT_SECONDS)
        waited = 0.0
        while True:
            await asyncio.sleep(tick)
            waited += tick
            if waited >= period - 1e-9:
                waited = 0.0
                self.writes.queue(lambda tx: self.store.claims(tx, self.owner, "renew"))
            if self.hosts is not None:
                self.writes.queue(self.hosts.count)

    def _fill(self) -> None:
        """The stream's next requests into the queue, with what the ledger knows of each."""
        assert self._feed is not None
        requests = list(islice(self._feed, FEED))
        if len(requests) < FEED:
            self._feed = None
        keys = [r.key for r in requests]
        counts, stopped, parted = self.store.attempts_so_far(keys)
        self._parted.update(parted)
        self.attempts.update(counts)
        self._cut_off.update(key for key, stops in stopped.items() if TRUNCATED in stops)
        self._queue.extend((r, 0) for r in self._own_share_first(requests))

    def _own_share_first(self, requests: list[Request]) -> list[Request]:
        """With other hosts on the ledger, which read the same requests in the same order: this
        host's share of them first (its place among the hosts alive), then each next host's share
        from its end, where that host comes last. Hosts then meet only where shares meet, instead
        of each asking for every request in turn and all but one being refused its claim."""
        hosts = self.pacer.hosts if self.pacer is not None and self.hosts is not None else 1
        if hosts < 2 or len(requests) < 2 * hosts:
            return requests
        size = -(-len(requests) // hosts)
        shares = [requests[start:start + size] for start in range(0, len(requests), size)]
        mine = self.hosts.rank % len(shares)
        return shares[mine] + [request for k in range(1, len(shares))
                               for request in reversed(shares[(mine + k) % len(shares)])]

    async def _worker(self) -> None:
        changed = self.control.changed
        while self.control.stop is None:
            if len(self._queue) < self.concurrency and self._feed is not None:
                self._fill()
            if (self._queue and self.pacer is not None and self.pacer.hosts > 1
                    and self.pacer.waits()):
                # Other hosts work on these requests too: one is chosen only once its turn has
                # come, so none waits in hand while they do it. One worker waits for the pacer
                # at a time, so none is left waiting once the queue is empty.
                async with self._turns:
                    if self._queue:
                        await self.pacer.turn(self._tokens_of(self._queue[0][0]))
                if not self._queue:  # taken meanwhile: the turn waits a slice for any call
                    continue
            if self._queue:
                item = self._queue.popleft()
            elif self._active or self._polling:
                changed.clear()
                await changed.wait()
                continue
            elif self._held:
                await self._wait_for_held()
                continue
            else:
                return
            self._active += 1
            try:
                await self._drive(*item)
            finally:
                self._active -= 1
                changed.set()

    async def _wait_for_held(self) -> None:
        """Everything else is done: after a growing pause, queue again what no one holds."""
        self._polling = True
        try:
            await asyncio.sleep(self._poll)
            still, free = self._taken(self._held)
            self._poll = (min(self._poll * 1.5, HELD_POLL[1]) if len(still) == len(self._held)
                          else HELD_POLL[0])
            self._queue.extend(free)
            self._held = still
        finally:
            self._polling = False
            self.control.changed.set()

    async def _drive(self, request: Request, depth: int) -> None:
        """Attempts as ``next_attempt`` says, until the request is accepted, given up or halved."""
        if request.key in self._parted:  # accepted in part before (another revision, a batch,
            # another runner): only its rejected tasks are asked again, never the whole pack
            return self._replace(request, self.plan.keys.apart(
                request, self._parted.pop(request.key)), depth)
        chain: list[Tried] = []
        step = next_attempt(self.plan, request, chain, depth=depth,
                            tried=self.attempts.get(request.key, 0) > 0,
                            cut_off=request.key in self._cut_off)
        done: Judged | None = None
        while step.kind not in (HALVE, NONE):
            got = await self._attempt(request, step.kind, step.prompt)
            if isinstance(got, NotSent) and chain and got.why == "stopped":
                self._release(request)  # its follow-up is not sent: its answer's own errors
                return fail(self.outcome, request, list(chain[-1].errors), chain[-1].raw)
            if isinstance(got, NotSent):
                return self._not_sent(got, (request, depth))
            self.outcome.repairs_made += step.kind == "repair"  # one sent, not one meant
            done = got
            if done.verdict.accepted:
                break
            tried = Tried(step.kind, done.verdict.errors, done.raw)
            if done.verdict.partial:  # committed in part: its chain goes on with the rest
                request, tried = self._partial(request, step.kind, done)
            chain.append(tried)
            step = next_attempt(self.plan, request, chain, tried=True, depth=depth)
        if step.kind == HALVE:
            self._release(request)
            return self._replace(request, self.plan.keys.split(request), depth + 1)
        self.attempts.pop(request.key, None)  # done with in this run: held no longer
        if done is not None and done.verdict.accepted:  # its claim goes with the run's release
            return self._accepted(request)
        self._release(request)
        self._progress(request)
        self.give_up(request, step, chain)
        if self.halted is not None and self.control.stop is None:  # (Settle.settle)
            self.control.halt(RuntimeError(self.halted))

    def _partial(self, request: Request, kind: str, done: Judged) -> tuple[Request, Tried]:
        """A return committed in part: its accepted part is reported, its rest's chain goes on."""
        kept, rest = self.plan.keys.apart(request, done.verdict.rejected_ids)
        self._release(request)
        self._accepted(kept)
        assert done.raw is not None
        return rest, rest_tried(kind, done.raw, rest, done.verdict.errors)

    def _not_sent(self, why: NotSent, item: Item) -> None:
        request = item[0]
        if why.why == "held":  # another runner works on this content too
            self._held.append(item)
        elif why.why == "resolved":
            self._resolved(request)
        elif why.why == "parted":
            return self._parted_elsewhere(item)
        elif why.why == "out_of_budget":
            self._release(request)
            self._progress(request)
            return self.out_of_budget(request, why.detail)
        else:
            return self._release(request)
        self._sweep()

    def _parted_elsewhere(self, item: Item) -> None:
        """Accepted in part by another runner since it was queued (held by it, say): never sent
        whole again; queued first to be replaced by its parts, as :meth:`_fill` would have."""
        request = item[0]
        self._release(request)  # (a claim kept from an earlier try of its own, if any)
        rejected = self.store.attempts_so_far([request.key])[2].get(request.key)
        if rejected is not None:  # (else forgotten meanwhile: its claim is decided again)
            self._parted[request.key] = rejected
        self._queue.appendleft(item)
        self.control.changed.set()

    def _sweep(self) -> None:
        """Drop from the queue what is accepted or held elsewhere, read at most five times a
        second, from a random place so that runners do not walk the queue in step."""
        now = time.monotonic()
        if now < self._next_sweep or not self._queue:
            return
        self._next_sweep = now + 0.2
        self._queue.rotate(-random.randrange(len(self._queue)))
        held, free = self._taken(self._queue)
        self._held += held
        self._queue = deque(free)

    def _taken(self, items: Sequence[Item]) -> tuple[list[Item], list[Item]]:
        """(held by another runner, free) of ``items``; those accepted elsewhere are resolved."""
        done, held = self.store.taken([item[0].key for item in items], self.owner)
        kept: list[Item] = []
        free: list[Item] = []
        for item in items:
            if item[0].key in done:
                self._resolved(item[0])
            else:
                (kept if item[0].key in held else free).append(item)
        return kept, free

    def _release(self, request: Request) -> None:
        owner = self.owner
        self.writes.queue(lambda tx: self.store.claims(tx, owner, "release", request.key))

    def _resolved(self, request: Request) -> None:
        """Accepted by another runner: its values are read from the ledger, nothing is paid."""
        self.outcome.taken_from_ledger += 1
        self._accepted(request)

    def _accepted(self, request: Request) -> None:
        """Errors of earlier attempts of its tasks are forgotten, and its tasks counted done."""
        for task_id in request.task_ids:
            self.outcome.errors.pop(task_id, None)
        self._progress(request)

    def _progress(self, request: Request) -> None:
        if self.on_progress is not None:
            self.on_progress(len(request.tasks))

    def _replace(self, request: Request, children: Sequence[Request], depth: int) -> None:
        """Replace the request by its parts, queued first so that they keep the batch's order."""
        self.writes.flush_now()  # a partial return's write recording this request goes first
        self.store.record_split(self.plan.revision_id, request, children)
        done = self.store.accepted_keys([c.key for c in children])
        for child in reversed(children):
            if child.key in done:  # accepted before (another revision): never paid twice
                self._accepted(child)
            else:
                self._queue.appendleft((child, depth))
        self.control.changed.set()

    async def _attempt(self, request: Request, kind: str, prompt: str) -> Judged | NotSent:
        """A first try, then only after a provider failure tenacity's retries (whose first
        re-raises it): a call that succeeds at once never pays for tenacity (~60 us)."""
        try:
            return await self._paced_call(request, kind, prompt)
        except ProviderError as exc:
            failed: ProviderError | None = exc
            last = exc  # the latest failure: what a retry the run stopped leaves it with
        done: Judged | NotSent = STOPPED  # the tries end by returning one, or by raising
        try:
            async for attempt in self.retrying.copy():
                with attempt:
                    if failed is not None:
                        exc, failed = failed, None
                        raise exc
                    try:
                        done = await self._paced_call(request, kind, prompt)
                    except ProviderError as exc:
                        last = exc
                        raise
        except ProviderError as exc:
            return self._failed(exc, request)
        if done == STOPPED:  # sent, failed, then stopped before a retry: that failure stands
            return Judged(acceptance.Verdict(False, errors=[provider_error(last)]), None)
        return done

    def _failed(self, exc: ProviderError, request: Request) -> Judged:
        """A provider failure past its retries as a verdict; a broken source stops the run, and
        so does the probing call's last failure to connect, naming the host."""
        if exc.unreachable and self.probe.give_up(request.key):
            where = getattr(self.provider, "url", None) or getattr(self.provider, "base_url", None)
            target = public_url(where) if isinstance(where, str) else (
                f"the {self.provider_name} provider")
            self.control.halt(ProviderError(
                f"cannot reach {target}: is the server running? The run stopped after "
                f"{self.transport.retries + 1} tries of one call, and no other request was sent "
                f"({exc})", retryable=False, unreachable=True), fatal=True)
        elif exc.fatal:  # nothing more is sent
            self.control.halt(exc, fatal=True)
        return Judged(acceptance.Verdict(False, errors=[provider_error(exc)]), None)

    def _tokens_of(self, request: Request) -> int:
        """The tokens a request's first call counts against the limits."""
        return self._counted(first_prompt(self.plan, request),
                             self.plan.answer_chars(request.tasks))

    def _counted(self, prompt: str, answer_chars: int | None) -> int:
        """A call's tokens as the provider's limiter counts them: the prompt and the ceiling
        the call asks."""
        return request_tokens(self.system, prompt, call_output_cap(self.provider, answer_chars))

    async def _paced_call(self, request: Request, kind: str,
                          prompt: str) -> Judged | NotSent:
        """One call within the pacer's limits; its headers teach the pacer, a 429 pauses all."""
        # numbered after its attempts so far; built before anything is reserved or written, so
        # whatever fails here leaves no receipt
        pacer, call = self.pacer, make_call(self.plan, self.system, request, kind, prompt,
                                            self.attempts.get(request.key, 0), self.cached_prefix)
        if pacer is None:
            return await self.call(request, kind, call)
        tokens = self._counted(prompt, call.answer_chars)
        turn = await pacer.acquire(1, tokens, probe=self.probe.prober == request.key)
        listening = HEADER_LISTENER.set(pacer.observe)
        answered = False
        try:
            done = await self.call(request, kind, call)
            answered = isinstance(done, Judged)
            if not answered:  # nothing sent (claimed elsewhere, say): the next call takes its turn
                pacer.unspent(tokens, turn)
            return done
        except ProviderError as exc:
            if exc.status == 429 and exc.retryable:
                self._rate_limited(exc)
            raise
        finally:
            HEADER_LISTENER.reset(listening)
            pacer.release(answered)
            hosts, account = self.hosts, self.account
            # what it newly heard of the limits goes to the ledger: the next session starts paced
            learnt = None if hosts is None or account is None else hosts.to_keep(account)
            if learnt is not None:
                self.writes.queue(lambda tx: hosts.keep(tx, account, learnt))
            if answered and self._limited_since is not None:
                self._limited_since = None
                self._say("")

    def _rate_limited(self, exc: ProviderError) -> None:
        """A 429: every call waits what the provider asks; after ``max_rate_wait`` the run ends."""
        now, most = time.monotonic(), self.transport.max_rate_wait
        if self._limited_since is None:
            self._limited_since = now
        left = self._limited_since + most - now
        if left <= 0:
            exc.retryable = False  # neither retried nor replayed: the run ends
            if self.control.stop is None:
                self.outcome.stopped = (
                    f"the provider's rate limit still refused calls after {most:g} s of waiting "
                    f"(max_rate_wait): {exc}. No further calls were opened; what was accepted "
                    "is kept and the rest stays owed: re-run later, or raise "
                    "Session(max_rate_wait=...)")
                self.control.halt(exc)
            return
        assert self.pacer is not None
        wait = min(self.pacer.slice_seconds if exc.retry_after is None else exc.retry_after, left)
        self.pacer.penalise(wait)
        if exc.retry_after is not None:
            exc.retry_after = wait  # the retry's own delay waits no longer
        if wait > SAY_WAIT:
            self._say(f"rate limited (HTTP 429): waiting {wait:.0f} s, at most "
                      f"{most:g} s in all (max_rate_wait)")

    def _say(self, text: str) -> None:
        if self.on_wait is not None:
            self.on_wait(text)


def transport_retrying(transport: Transport) -> AsyncRetrying:
    """``retries`` more tries after a retryable provider error, each after its Retry-After, else
    exponential backoff with jitter, capped at ``backoff_max`` (tenacity 8's strategies only)."""
    backoff = (wait_exponential(multiplier=transport.backoff_initial, max=transport.backoff_max)
               + wait_random(0, transport.backoff_initial))

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, ProviderError) and error.retry_after is not None:
            return min(max(0.0, error.retry_after), transport.backoff_max)
        return min(backoff(state), transport.backoff_max)

    return AsyncRetrying(stop=stop_after_attempt(transport.retries + 1), wait=wait, reraise=True,
                         retry=retry_if_exception(lambda e: isinstance(e, ProviderError)
                                                  and e.retryable))

