"""The live transport: ``concurrency`` workers resolve each request, or give up, within a fixed
allowance, taking requests from one queue; what another runner holds waits till the end."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential, wait_random

from .._acceptance import judge as acceptance
from .._content.tasks import Request
from .._errors import LedgerError, ProviderError
from .._ledger import Ledger
from .._ledger.store_calls import Owner
from .._providers.ratelimits import HEADER_LISTENER, limits_account, request_tokens
from .._providers.settings import call_output_cap
from .._sources import TRUNCATED
from .budget import Spender
from .calls import STOPPED, Caller, Judged, NotSent
from .pacing import COUNT_SECONDS, HostShare, Pacer
from .plan import Outcome, Plan, Transport
from .settle import (
    HALVE,
    NONE,
    Tried,
    cut_off_error,
    fail,
    next_attempt,
    provider_error,
    rest_tried,
)

Item = tuple[Request, int]  # a queued request and its split depth
FEED = 500  # requests taken from a stream into the queue at once
# The pause before each look at requests other runners hold, growing while nothing changes.
HELD_POLL = (0.02, 0.25)
SAY_WAIT = 5.0  # a rate-limit wait longer than this is said in the run's progress


class Replayer(Caller):
    """Drives every unresolved request of a plan concurrently through provider and acceptance."""

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, spender: Spender,
                 transport: Transport, concurrency: int,
                 on_progress: Callable[[int], None] | None = None, *,
                 session_id: str = "session", pacer: Pacer | None = None,
                 hosts: HostShare | None = None,
                 on_wait: Callable[[str], Any] | None = None) -> None:
        super().__init__(plan, ledger, provider, spender, transport)
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
        if self._feed is None:
            return
        requests = list(islice(self._feed, FEED))
        if len(requests) < FEED:
            self._feed = None
        keys = [r.key for r in requests]
        counts, stopped, parted = self.store.attempts_so_far(keys)
        self._parted.update(parted)
        self.attempts.update(counts)
        self._cut_off.update(key for key, stops in stopped.items() if TRUNCATED in stops)
        self._queue.extend((r, 0) for r in requests)

    async def _worker(self) -> None:
        changed = self.control.changed
        while self.control.stop is None:
            if len(self._queue) < self.concurrency and self._feed is not None:
                self._fill()
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
        if request.key in self._parted:  # accepted in part before (another revision, a batch)
            return self._replace(request, self.plan.keys.apart(
                request, self._parted.pop(request.key)), depth)
        chain: list[Tried] = []
        step = next_attempt(self.plan, request, chain, depth=depth,
                            tried=self.attempts.get(request.key, 0) > 0,
                            cut_off=request.key in self._cut_off)
        done: Judged | None = None
        while step.kind not in (HALVE, NONE):
            self.outcome.repairs_made += step.kind == "repair"
            got = await self._attempt(request, step.kind, step.prompt)
            if isinstance(got, NotSent):
                return self._not_sent(got, (request, depth))
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
            self._replace(request, self.plan.keys.split(request), depth + 1)
        elif step.why == TRUNCATED:
            self._cut_short(request, done)
        elif done is not None:
            self._judged(request, done)
            self.attempts.pop(request.key, None)  # done with in this run: held no longer

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
        elif why.why == "out_of_budget":
            return self._give_up(request, [{"type": "budget_exhausted", "task_id": None,
                                            "message": "the budget ran out before this "
                                            f"request was resolved ({why.detail})"}])
        else:
            return self._release(request)
        self._sweep()

    def _judged(self, request: Request, done: Judged) -> None:
        verdict = done.verdict
        if verdict.accepted:  # its claim goes with the run's release
            return self._accepted(request)
        self._give_up(request, verdict.errors, done.raw)
        crash = next((e for e in verdict.errors if e.get("type") == "validator_error"), None)
        if crash is not None and self.control.stop is None:
            self.control.halt(RuntimeError(_first_line(crash)))
            self.outcome.stopped = (f"the validator crashed ({_first_line(crash)}); no further "
                                    "calls were opened. Fix the validator and re-run.")

    def _cut_short(self, request: Request, done: Judged | None) -> None:
        """A request cut off at the output ceiling (``done``; None: in an earlier run)."""
        self._give_up(request, [cut_off_error(request, self.provider, done is None)],
                      done.raw if done is not None else None)

    def _give_up(self, request: Request, errors: list[dict[str, Any]],
                 raw: str | None = None) -> None:
        self._release(request)
        self._progress(request)
        fail(self.outcome, request, errors, raw)

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
        done: Judged | NotSent = STOPPED  # the tries end by returning one, or by raising
        try:
            async for attempt in self.retrying.copy():
                with attempt:
                    if failed is not None:
                        exc, failed = failed, None
                        raise exc
                    done = await self._paced_call(request, kind, prompt)
        except ProviderError as exc:
            return self._failed(exc, request)
        return done

    def _failed(self, exc: ProviderError, request: Request) -> Judged:
        """A provider failure past its retries as a verdict; a host down or broken source stops."""
        down = self.host_down(exc, request.key)  # if so, the run stopped naming it
        if not down and exc.fatal and self.control.fatal is None:  # a broken source
            self.control.halt(exc, fatal=True)  # nothing more is sent
        return Judged(acceptance.Verdict(False, errors=[provider_error(exc)]), None)

    async def _paced_call(self, request: Request, kind: str,
                          prompt: str) -> Judged | NotSent:
        """One call within the pacer's limits; its headers teach the pacer, a 429 pauses all."""
        pacer, call = self.pacer, self.make(request, kind, prompt)
        if pacer is None:
            return await self.call(request, kind, call)
        # counted as the provider's limiter counts it: the prompt and the ceiling the call asks
        cap = call_output_cap(self.provider, call.answer_chars)
        await pacer.acquire(1, request_tokens(self.system, prompt, cap))
        listening = HEADER_LISTENER.set(pacer.observe)
        answered = False
        try:
            done = await self.call(request, kind, call)
            answered = isinstance(done, Judged)
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


def _first_line(error: Mapping[str, Any]) -> str:
    """The first line of a validator crash: where it happened when the error says, else why."""
    for key in ("traceback", "where", "message"):
        value = error.get(key)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str) and value.strip():
            return value.strip().splitlines()[0]
    return "validator_error"
