"""The bounded in-cell replay loop: resolve each request or give up within a fixed allowance.

Per failing request: up to ``repairs`` repair calls (original prompt + exact errors + raw return),
then up to ``replays`` exact fresh replays, then, with ``split``, deterministic halving. Transport
failures get their own receipts and backoff, and never count as repairs.

A pool of ``concurrency`` workers takes requests from one queue. For every call a worker reserves
its worst-case cost, claims the request and commits the in-flight receipt (the group commit
batches these writes across workers), and only then sends. A request another runner holds is set
aside and waited for at the end; its accepted result is read from the ledger.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections import deque
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential_jitter

from . import acceptance, claims
from .budget import Spender
from .errors import LedgerError, ProviderError
from .groupcommit import GroupCommit
from .ledger import Ledger, now
from .plan import Outcome, Plan, Transport, system_prompt
from .providers.base import Call, Reply, estimate_tokens
from .schema import wire_schema
from .tasks import (
    Request,
    render_items_prompt,
    render_repair_prompt,
    render_value_prompt,
    split_request,
)


class OutOfBudget(Exception):
    """No call may be reserved any more; the request is left unresolved for this run."""


class Held(Exception):
    """Another live runner holds this request's claim: wait for its result instead."""


class Resolved(Exception):
    """The request was accepted meanwhile (by another runner): nothing to send."""


class Stopped(Exception):
    """The run stopped opening calls (validator crash, unreachable provider, ledger failure)."""


Item = tuple[Request, int, "str | None"]  # a queued request, its split depth, its first kind


class Replayer:
    """Drives every unresolved request of a plan concurrently through provider and acceptance."""

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, spender: Spender,
                 transport: Transport, concurrency: int,
                 on_progress: Callable[[int], None] | None = None, *,
                 session_id: str = "session") -> None:
        self.plan = plan
        self.ledger = ledger
        self.provider = provider
        self.spender = spender
        self.transport = transport
        self.concurrency = concurrency
        self.on_progress = on_progress
        self.session_id = session_id
        self.outcome = Outcome()
        self._attempts: dict[str, int] = {}
        self.writes = GroupCommit(ledger)
        self._backoff = wait_exponential_jitter(multiplier=transport.backoff_initial,
                                                max=transport.backoff_max,
                                                jitter=transport.backoff_initial)
        self._system = system_prompt(plan)
        self._provider_name = getattr(provider, "name", type(provider).__name__)
        self._model = getattr(provider, "model", None)
        # A provider whose own client timeout is at least as tight bounds every call already;
        # a second asyncio timer per call would only cost time.
        own = getattr(provider, "timeout", None) if getattr(provider, "enforces_timeout",
                                                              False) else None
        self._needs_timer = not (isinstance(own, (int, float)) and own <= transport.timeout)
        self._stop: BaseException | None = None  # why no new call may be opened
        self._fatal: BaseException | None = None  # raised by run() once everything unwound
        self._reachable: asyncio.Event | None = None
        self._prober: str | None = None  # the request whose retries probe an unreachable host
        self._settled: asyncio.Event | None = None
        self._workers: list[asyncio.Future] = []

    async def run(self, requests: list[Request]) -> Outcome:
        """Drive every request with ``concurrency`` workers; each takes the next request as soon
        as its previous one is resolved or given up."""
        self.owner = claims.Owner.start(self.session_id)
        self._attempts = self.ledger.attempt_counts([r.key for r in requests])
        with self.ledger.transaction() as db:
            claims.reap(db)  # runners that are gone give up their claims before we start
        self._queue: deque[Item] = deque((r, 0, None) for r in requests)
        self._held: list[Item] = []
        self._active = 0
        self._poll = 0.05
        self._polling = False
        self._changed = asyncio.Event()
        self._reachable = asyncio.Event()
        self._reachable.set()
        self._settled = asyncio.Event()
        self.spender.on_settle = self._settled.set
        # Splitting can turn one request into many: with split on, size the pool for tasks.
        work = sum(len(r.tasks) for r in requests) if self.plan.split else len(requests)
        workers = [asyncio.ensure_future(self._worker()) for _ in range(min(self.concurrency,
                                                                             work))]
        self._workers = workers
        lease = asyncio.ensure_future(self._renew())
        # Every call allocates futures and records; the collector would otherwise rescan the
        # whole long-lived heap (a kernel's, say) many times a run. Frozen objects are skipped
        # until the run ends and hands them back.
        gc.freeze()
        try:
            await asyncio.gather(*workers)
        except asyncio.CancelledError:
            if self._fatal is None:
                raise  # interrupted from outside; a ledger failure is raised below instead
        finally:
            for worker in workers:
                worker.cancel()
            # Let cancelled workers close their receipts before the run returns.
            await asyncio.wait(workers)
            lease.cancel()
            self.writes.submit(lambda db: claims.release_all(db, self.owner))
            self.writes.flush_now()  # whatever was judged is committed before we return
            self.owner.stop()
            gc.unfreeze()
        if self._fatal is not None:
            raise self._fatal
        try:
            self.writes.raise_failures()
        except LedgerError:
            raise
        except Exception as exc:  # a write that failed on its own: still a lost record
            raise LedgerError("a record of this run could not be written",
                              path=self.ledger.path or ":memory:", cause=exc) from exc
        return self.outcome

    async def _renew(self) -> None:
        """Keep this run's claims alive while it runs."""
        while True:
            await asyncio.sleep(claims.LEASE_SECONDS / 3)
            self.writes.submit(lambda db: claims.renew(db, self.owner))

    async def _worker(self) -> None:
        while self._stop is None:
            if self._queue:
                item = self._queue.popleft()
            elif self._active or self._polling:
                self._changed.clear()
                await self._changed.wait()
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
                self._changed.set()

    async def _wait_for_held(self) -> None:
        """Everything else is done: look again at requests other runners hold, after a pause
        that grows while nothing changes. A claim whose owner is gone is taken over."""
        self._polling = True
        try:
            await asyncio.sleep(self._poll)
            self._poll = min(self._poll * 1.5, 1.0)
            self._queue.extend(self._held)
            self._held = []
        finally:
            self._polling = False
            self._changed.set()

    # -- one request -----------------------------------------------------------------------
    def _first_kind(self, request: Request, first_kind: str | None) -> str:
        return first_kind or ("initial" if self._attempts.get(request.key, 0) == 0 else "replay")

    async def _drive(self, request: Request, depth: int, first_kind: str | None = None) -> None:
        plan = self.plan
        prompt = self._prompt(request)
        kind = self._first_kind(request, first_kind)
        repairs_left, replays_left = plan.repairs, plan.replays
        try:
            verdict, raw = await self._attempt(request, kind, prompt)
            while not verdict.accepted:
                if verdict.errors and not verdict.repairable and raw is not None:
                    break  # a validator crash: reported, never retried
                if raw is None and not all(e.get("retryable", True) for e in verdict.errors):
                    break  # 400/401/403/404: asking again cannot help
                if raw is not None and verdict.repairable and repairs_left > 0:
                    repairs_left -= 1
                    self.outcome.repairs_made += 1
                    verdict, raw = await self._attempt(
                        request, "repair", render_repair_prompt(prompt, raw, verdict.errors))
                elif replays_left > 0:
                    replays_left -= 1
                    verdict, raw = await self._attempt(request, "replay", prompt)
                elif plan.split and len(request.tasks) > 1 and depth < plan.max_split_depth:
                    self._release(request)
                    return self._split(request, depth)
                else:
                    break
        except Held:
            self._held.append((request, depth, first_kind))
            return
        except Resolved:
            self._resolved(request)
            return
        except OutOfBudget:
            self._release(request)
            self._fail(request, [{"type": "budget_exhausted", "task_id": None,
                                  "message": "the budget ran out before this request "
                                  "was resolved"}])
            self._progress(request)
            return
        except Stopped:
            self._release(request)
            return
        if not verdict.accepted:  # an accepted request's claim goes with the run's release
            self._release(request)
        self._progress(request)
        if verdict.accepted:
            for task_id in request.task_ids:
                self.outcome.errors.pop(task_id, None)
            return
        self._fail(request, verdict.errors, raw)
        crash = next((e for e in verdict.errors if e.get("type") == "validator_error"), None)
        if crash is not None and self._stop is None:
            self._stop = Stopped(_first_line(crash))
            self.outcome.stopped = (f"the validator crashed ({_first_line(crash)}); no further "
                                    "calls were opened. Fix the validator and re-run.")

    def _release(self, request: Request) -> None:
        owner = self.owner
        self.writes.submit(lambda db: claims.release(db, request.key, owner))

    def _resolved(self, request: Request) -> None:
        """Accepted by another runner: its values are read from the ledger, nothing is paid."""
        self.outcome.taken_from_ledger += 1
        for task_id in request.task_ids:
            self.outcome.errors.pop(task_id, None)
        self._progress(request)

    def _progress(self, request: Request) -> None:
        if self.on_progress is not None:
            self.on_progress(len(request.tasks))

    def _split(self, request: Request, depth: int) -> None:
        """Replace the request by its halves, queued first so they keep the batch's order."""
        children = split_request(request, self.plan.content)
        self.ledger.record_split(self.plan.revision_id, request, children)
        done = self.ledger.accepted_keys([c.key for c in children])
        for child in reversed(children):
            if child.key in done:  # accepted before (another revision): never paid twice
                self._progress(child)
                for task_id in child.task_ids:
                    self.outcome.errors.pop(task_id, None)
            else:
                self._queue.appendleft((child, depth + 1, "split"))
        self._changed.set()

    def _fail(self, request: Request, errors: list[dict[str, Any]],
              raw: str | None = None) -> None:
        for task_id in request.task_ids:
            mine = [e for e in errors if e.get("task_id") in (task_id, None)]
            if not mine:
                mine = [{"type": "batch_rejected", "task_id": task_id,
                         "message": "this task's item was fine but another item of the same "
                         "request failed, so the whole return was rejected"}]
            extra = {"raw": raw[:1000]} if raw is not None else {}
            self.outcome.errors[task_id] = [{**e, "task_id": task_id, **extra} for e in mine]

    def _prompt(self, request: Request) -> str:
        if self.plan.mode == "value":
            return render_value_prompt(request.tasks[0])
        return render_items_prompt(request.tasks, self.plan.identity, self.plan.instructions,
                                   request.tasks_json)

    # -- one attempt (with transport retries) --------------------------------------------------
    async def _attempt(self, request: Request, kind: str,
                       prompt: str) -> tuple[acceptance.Verdict, str | None]:
        """One logical attempt: transport retries inside, acceptance on the text that arrives.

        The first try runs bare; tenacity's retry machinery is built only once a retryable
        transport failure has happened, which keeps the common path cheap.
        """
        try:
            try:
                return await self._call(request, kind, prompt)
            except ProviderError as first:
                if not first.retryable or self.transport.retries == 0:
                    raise
                await asyncio.sleep(self._delay(first, 1))
            retrying = AsyncRetrying(
                stop=stop_after_attempt(self.transport.retries),
                wait=lambda state: self._delay(state.outcome.exception(),
                                               state.attempt_number + 1),
                retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
                reraise=True,
            )
            async for attempt in retrying:
                with attempt:
                    return await self._call(request, kind, prompt)
        except ProviderError as exc:
            if exc.unreachable and self._prober == request.key:
                self._unreachable(exc)
            status = f" (HTTP {exc.status})" if exc.status else ""
            return acceptance.Verdict(False, errors=[{
                "type": "provider_error", "task_id": None, "retryable": exc.retryable,
                "message": f"provider failed{status}: {exc}"}]), None
        raise AssertionError("unreachable: tenacity either returns or re-raises")

    def _delay(self, error: BaseException | None, failures: int) -> float:
        """Retry-After when the provider gave one, else exponential backoff with jitter."""
        if isinstance(error, ProviderError) and error.retry_after is not None:
            return min(max(0.0, error.retry_after), self.transport.backoff_max)
        return self._backoff(SimpleNamespace(attempt_number=failures))

    def _unreachable(self, exc: ProviderError) -> None:
        """The probing call's retries all failed to connect: stop the run with one message."""
        where = getattr(self.provider, "url", None) or getattr(self.provider, "base_url", None)
        target = where or f"the {self._provider_name} provider"
        self._fatal = ProviderError(
            f"cannot reach {target}: is the server running? The run stopped after "
            f"{self.transport.retries + 1} tries of one call, and no other request was sent "
            f"({exc})", retryable=False, unreachable=True)
        self._stop = self._fatal
        self._changed.set()
        assert self._reachable is not None
        self._reachable.set()

    async def _reserve(self, input_tokens: int) -> float:
        """Reserve this call's worst case; under a cost budget, wait for calls in flight to
        settle before giving up, since their real cost is usually below their reservation."""
        assert self._settled is not None
        while True:
            reserved = self.spender.reserve(input_tokens)
            if reserved is not None:
                return reserved
            if not self.spender.waiting_on_reservations:
                raise OutOfBudget()
            self._settled.clear()
            await self._settled.wait()
            if self._stop is not None:
                raise Stopped()

    async def _call(self, request: Request,
                    kind: str, prompt: str) -> tuple[acceptance.Verdict, str | None]:
        """Reserve, claim and commit the receipt; then send, judge and record the return."""
        assert self._reachable is not None
        if not self._reachable.is_set() and self._prober != request.key:
            await self._reachable.wait()  # another call is finding out whether the host is up
        if self._stop is not None:
            raise Stopped()
        ledger, plan, owner = self.ledger, self.plan, self.owner
        estimated = estimate_tokens(self._system + prompt)
        reserved = await self._reserve(estimated)
        floor = self.spender.pricing.floor(estimated)

        def begin(db: Any) -> tuple[str, int | None]:
            state = claims.claim(db, request.key, owner)
            if state != claims.MINE:
                return state, None
            attempt_id = ledger.op_begin(db, plan.batch_id, plan.revision_id, request, kind,
                                         self._provider_name, self._model, owner=owner.id,
                                         estimated_input_tokens=estimated, cost_floor=floor)
            claims.hold(db, request.key, owner, attempt_id)
            return state, attempt_id

        begun = self.writes.submit(begin)
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
            error = exc if isinstance(exc, LedgerError) else LedgerError(
                "the receipt of a call could not be written", path=ledger.path or ":memory:",
                cause=exc)
            self._stop_for(error)
            raise Stopped() from exc
        if state != claims.MINE:
            self.spender.release(reserved)
            raise Resolved() if state == claims.ACCEPTED else Held()
        assert attempt_id is not None
        if not self._reachable.is_set() and self._prober != request.key:
            try:  # a call failed to connect meanwhile: send only if its host comes back
                await self._reachable.wait()
            except asyncio.CancelledError:
                self.spender.release(reserved)
                self._close(attempt_id, "interrupted", None)
                raise
        if self._stop is not None:  # stopped while the receipt was committed: never sent
            self.spender.release(reserved)
            self._close(attempt_id, "stopped before it was sent", None)
            raise Stopped()
        number = self._attempts.get(request.key, 0)
        self._attempts[request.key] = number + 1
        self.outcome.calls += 1
        for task_id in request.task_ids:
            self.outcome.attempts_by_task[task_id] = (
                self.outcome.attempts_by_task.get(task_id, 0) + 1)
        call = self._make_call(request, kind, prompt, number)
        sent_at = now()
        settled = False
        try:
            try:
                reply = await self._send(call, attempt_id, sent_at, reserved)
                settled = True
            except ProviderError:
                settled = True
                raise
            return await self._judge(request, reply, attempt_id, sent_at)
        except BaseException as exc:  # cancellation, Ctrl-C, SystemExit: close the receipt
            if not settled:
                self.spender.settle(reserved, None)  # sent, answer unknown: the worst case
            if not isinstance(exc, ProviderError):
                self._close(attempt_id, _why(exc), sent_at)
            raise

    def _stop_for(self, exc: LedgerError) -> None:
        """The ledger failed: no call is opened, and calls in flight (whose answers could not
        be recorded) are cancelled."""
        if self._fatal is None:
            self._fatal = exc
        self._stop = exc
        self._changed.set()
        current = asyncio.current_task()
        for worker in self._workers:
            if worker is not current:
                worker.cancel()

    def _close(self, attempt_id: int, why: str, sent_at: str | None) -> None:
        # Synchronous on purpose: the loop may be unwinding. A receipt already completed is left
        # as it is (the update only touches in-flight rows). If the ledger itself has failed,
        # the receipt stays in flight (a possible call) and that failure is what is reported.
        self.writes.flush_now()
        try:
            self.ledger.finish_attempt(attempt_id, "cancelled", sent_at=sent_at, errors=[{
                "type": "cancelled", "task_id": None,
                "message": f"{why} before the return was judged; re-run to resume"}])
        except LedgerError as exc:
            self._stop_for(exc)

    async def _send(self, call: Call, attempt_id: int, sent_at: str, reserved: float) -> Reply:
        try:
            if not self._needs_timer:
                reply = await self.provider.complete(call)
            else:
                async with asyncio.timeout(self.transport.timeout):
                    reply = await self.provider.complete(call)
        except (ProviderError, TimeoutError) as exc:
            error = exc if isinstance(exc, ProviderError) else ProviderError(
                f"no answer within {self.transport.timeout:g}s", retryable=True)
            self._provider_failed(error, call)
            # An HTTP error status or a refused connection is not billed; a call cut off after
            # it was sent may have been, so it keeps its worst case.
            billed = self.spender.pricing.cost(error.usage.get("input_tokens"),
                                               error.usage.get("output_tokens"))
            unbilled = error.unreachable or (error.status is not None and error.status >= 400)
            self.spender.settle(reserved, billed if billed is not None else
                                (0.0 if unbilled else None))
            self._record_provider_error(attempt_id, str(error), error.status, error.usage,
                                        sent_at)
            raise error from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a provider bug must not leave an in-flight receipt
            message = f"{type(exc).__name__}: {exc}"
            self.spender.settle(reserved, None)
            self._record_provider_error(attempt_id, message, None, {}, sent_at)
            raise ProviderError(message, retryable=False) from exc
        self._reachable_again(call)
        self.spender.settle(reserved, self._cost(reply))
        return reply

    def _provider_failed(self, error: ProviderError, call: Call) -> None:
        """The first call that cannot connect probes the host alone; the others wait for it."""
        assert self._reachable is not None
        if error.unreachable:
            if self._prober is None:
                self._prober = call.request_key
                self._reachable.clear()
        else:
            self._reachable_again(call)

    def _reachable_again(self, call: Call) -> None:
        if self._prober == call.request_key:
            self._prober = None
            assert self._reachable is not None
            self._reachable.set()

    def _cost(self, reply: Reply) -> float | None:
        if reply.cost is not None:
            return reply.cost
        return self.spender.pricing.cost(reply.input_tokens, reply.output_tokens)

    async def _judge(self, request: Request, reply: Reply, attempt_id: int,
                     sent_at: str) -> tuple[acceptance.Verdict, str | None]:
        """Judge now; the record joins the next group commit without holding up this worker.

        Nothing reads the checkpoint before the run ends, and the run flushes and checks every
        queued write before it returns, so a failed commit can never pass as success; a failed
        commit also fails every later receipt, so no further call is sent.
        """
        ledger = self.ledger
        usage = self._account(reply)
        verdict = await acceptance.judge(
            reply, request.tasks, mode=self.plan.mode, identity=self.plan.identity,
            schema=self.plan.schema, validator=self.plan.validator)
        if verdict.accepted:
            self.writes.submit(lambda db: ledger.op_accept(
                db, attempt_id, self.plan.batch_id, request.key, verdict.stored, reply.text,
                usage, sent_at))
            self.outcome.accepted_returns += 1
        else:
            self.writes.submit(lambda db: ledger.op_finish(
                db, attempt_id, "rejected", verdict.errors, reply.text, usage, sent_at))
            self.outcome.rejected_returns += 1
        return verdict, reply.text

    def _record_provider_error(self, attempt_id: int, message: str, status: int | None,
                               usage: Mapping[str, Any], sent_at: str) -> None:
        self.outcome.provider_errors += 1
        errors = [{"type": "provider_error", "task_id": None, "message": message,
                   "status": status}]
        self.writes.submit(lambda db: self.ledger.op_finish(
            db, attempt_id, "provider_error", errors, None, usage, sent_at))

    def _make_call(self, request: Request, kind: str, prompt: str, number: int) -> Call:
        plan = self.plan
        if plan.mode == "value":
            schema: Mapping[str, Any] = plan.schema.json_schema
        else:
            schema = wire_schema(plan.schema, request.tasks, plan.identity)
        # The provider gets its own copy: acceptance compares against the ledger's request.
        return Call(tasks=tuple(json.loads(request.tasks_json)), prompt=prompt,
                    system=self._system, schema=schema, attempt=number, kind=kind,
                    request_key=request.key, mode=plan.mode, identity=plan.identity)

    def _account(self, reply: Reply) -> dict[str, Any]:
        out = self.outcome
        out.input_tokens += reply.input_tokens or 0
        out.output_tokens += reply.output_tokens or 0
        if reply.cost is None:
            out.cost = None
        elif out.cost is not None:
            out.cost += reply.cost
        return {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                "cached_tokens": reply.cached_tokens, "cost": reply.cost, "model": reply.model}


def _why(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return "interrupted"
    return f"stopped by {type(exc).__name__}"


def _first_line(error: Mapping[str, Any]) -> str:
    """The first line of a validator crash: where it happened when the error says, else why."""
    for key in ("traceback", "where", "message"):
        value = error.get(key)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str) and value.strip():
            return value.strip().splitlines()[0]
    return "validator_error"
