"""The bounded in-cell replay loop: resolve each request or give up within a fixed allowance.

Per failing request: up to ``repairs`` repair calls (original prompt + exact errors + raw return),
then up to ``replays`` exact fresh replays, then, with ``split``, deterministic halving. Transport
failures get their own receipts and backoff, and never count as repairs.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential_jitter

from . import acceptance
from .budget import Spender
from .errors import ProviderError
from .groupcommit import GroupCommit
from .ledger import Ledger
from .plan import Outcome, Plan, Transport, system_prompt
from .providers.base import Call, Reply
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


Item = tuple[Request, int, "str | None"]  # a queued request, its split depth, its first kind


@dataclass
class Opened:
    """A call whose budget is reserved and whose in-flight receipt is submitted, not yet sent."""

    request: Request
    kind: str
    prompt: str
    call: Call
    begun: asyncio.Future


@dataclass
class Lane:
    """One worker. ``ahead`` is its next request, opened while the current call is in flight,
    so the receipt's commit is off the path from one answer to the next send."""

    ahead: tuple[Item, Opened] | None = None


class Replayer:
    """Drives every unresolved request of a plan concurrently through provider and acceptance."""

    def __init__(self, plan: Plan, ledger: Ledger, provider: Any, spender: Spender,
                 transport: Transport, concurrency: int,
                 on_progress: Callable[[int], None] | None = None) -> None:
        self.plan = plan
        self.ledger = ledger
        self.provider = provider
        self.spender = spender
        self.transport = transport
        self.concurrency = concurrency
        self.on_progress = on_progress
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

    async def run(self, requests: list[Request]) -> Outcome:
        """Drive every request with ``concurrency`` workers; each takes the next request as soon
        as its previous call is judged, the way a bare client loop would."""
        self._attempts = self.ledger.attempt_counts([r.key for r in requests])
        self._queue: deque[Item] = deque((r, 0, None) for r in requests)
        self._active = 0
        self._changed = asyncio.Event()
        # Splitting can turn one request into many: with split on, size the pool for tasks.
        work = sum(len(r.tasks) for r in requests) if self.plan.split else len(requests)
        self._lanes = [Lane() for _ in range(min(self.concurrency, work))]
        # Opening calls ahead reserves budget early, so it is done only while the budget is
        # nowhere near its end; near the end, calls are reserved exactly as they are sent.
        self._ahead_margin = 4 * len(self._lanes) * (1 + self.plan.repairs + self.plan.replays)
        workers = [asyncio.ensure_future(self._worker(lane)) for lane in self._lanes]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            # Let cancelled workers close their receipts: a worker thread's loop is closed as
            # soon as this returns, and would drop them half-unwound, receipts in flight.
            await asyncio.wait(workers)
            self.writes.flush_now()  # whatever was judged is committed before we return
        self.writes.raise_failures()
        return self.outcome

    async def _worker(self, lane: Lane) -> None:
        try:
            while True:
                opened = None
                if lane.ahead is not None:
                    (item, opened), lane.ahead = lane.ahead, None
                elif self._queue:
                    item = self._queue.popleft()
                else:  # a busy worker's next request is fair game for an idle one
                    busy = next((other for other in self._lanes if other.ahead), None)
                    if busy is not None:
                        (item, opened), busy.ahead = busy.ahead, None
                    elif self._active == 0:
                        return
                    else:  # another worker may still split a request into more work
                        self._changed.clear()
                        await self._changed.wait()
                        continue
                self._active += 1
                try:
                    await self._drive(lane, *item, opened=opened)
                finally:
                    self._active -= 1
                    self._changed.set()
        finally:
            if lane.ahead is not None:  # stopped early: the opened call is never sent
                self._withdraw(lane.ahead[1])
                lane.ahead = None

    def _fill(self, lane: Lane) -> None:
        """Open this lane's next call now, while its current one is in flight."""
        if lane.ahead is not None or not self._queue or not self.spender.ample(
                self._ahead_margin):
            return
        item = self._queue.popleft()
        request, _, first_kind = item
        try:
            opened = self._open(request, self._first_kind(request, first_kind),
                                self._prompt(request), ahead=True)
        except OutOfBudget:
            self._queue.appendleft(item)
            return
        lane.ahead = (item, opened)
        self._changed.set()  # an idle worker may take it at once

    def _withdraw(self, opened: Opened) -> None:
        """Undo an opened call that will never be sent: refund it and drop its receipt."""
        self.spender.refund()
        self._attempts[opened.request.key] -= 1
        if not opened.begun.done():
            opened.begun.cancel()  # never written: the group commit skips cancelled writes
        elif not opened.begun.cancelled() and opened.begun.exception() is None:
            self.ledger.withdraw_attempt(opened.begun.result())

    # -- one request -----------------------------------------------------------------------
    def _first_kind(self, request: Request, first_kind: str | None) -> str:
        return first_kind or ("initial" if self._attempts.get(request.key, 0) == 0 else "replay")

    async def _drive(self, lane: Lane, request: Request, depth: int,
                     first_kind: str | None = None, opened: Opened | None = None) -> None:
        plan = self.plan
        prompt = opened.prompt if opened else self._prompt(request)
        kind = opened.kind if opened else self._first_kind(request, first_kind)
        repairs_left, replays_left = plan.repairs, plan.replays
        try:
            verdict, raw = await self._attempt(lane, request, kind, prompt, opened)
            while not verdict.accepted:
                if verdict.errors and not verdict.repairable and raw is not None:
                    break  # a validator crash: reported, never retried
                if raw is None and not all(e.get("retryable", True) for e in verdict.errors):
                    break  # 400/401/403/404: asking again cannot help
                if raw is not None and verdict.repairable and repairs_left > 0:
                    repairs_left -= 1
                    self.outcome.repairs_made += 1
                    verdict, raw = await self._attempt(
                        lane, request, "repair", render_repair_prompt(prompt, raw, verdict.errors))
                elif replays_left > 0:
                    replays_left -= 1
                    verdict, raw = await self._attempt(lane, request, "replay", prompt)
                elif plan.split and len(request.tasks) > 1 and depth < plan.max_split_depth:
                    return self._split(request, depth)
                else:
                    break
        except OutOfBudget:
            self._fail(request, [{"type": "budget_exhausted", "task_id": None,
                                  "message": "the call budget ran out before this request "
                                  "was resolved"}])
            self._progress(request)
            return
        self._progress(request)
        if verdict.accepted:
            for task_id in request.task_ids:
                self.outcome.errors.pop(task_id, None)
            return
        self._fail(request, verdict.errors, raw)

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
            extra = {"request": request.key, **({"raw": raw} if raw is not None else {})}
            self.outcome.errors[task_id] = [{**e, "task_id": task_id, **extra} for e in mine]

    def _prompt(self, request: Request) -> str:
        if self.plan.mode == "value":
            return render_value_prompt(request.tasks[0])
        return render_items_prompt(request.tasks, self.plan.identity, self.plan.instructions,
                                   request.tasks_json)

    # -- one attempt (with transport retries) --------------------------------------------------
    async def _attempt(self, lane: Lane, request: Request, kind: str, prompt: str,
                       opened: Opened | None = None) -> tuple[acceptance.Verdict, str | None]:
        """One logical attempt: transport retries inside, acceptance on the text that arrives.

        The first try runs bare; tenacity's retry machinery is built only once a retryable
        transport failure has happened, which keeps the common path cheap.
        """
        try:
            try:
                return await self._call_once(lane, opened or self._open(request, kind, prompt))
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
                    return await self._call_once(lane, self._open(request, kind, prompt))
        except ProviderError as exc:
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

    def _open(self, request: Request, kind: str, prompt: str, *, ahead: bool = False) -> Opened:
        """Reserve the call and submit its in-flight receipt; nothing is sent yet.

        A call opened ``ahead`` lets its receipt ride with the next group commit; any other is
        about to be sent, so its receipt is committed on the next turn of the loop.
        """
        ledger, plan = self.ledger, self.plan
        if not self.spender.reserve():
            raise OutOfBudget()
        number = self._attempts.get(request.key, 0)
        self._attempts[request.key] = number + 1
        begun = self.writes.submit(lambda db: ledger.op_begin(
            db, plan.batch_id, plan.revision_id, request, kind, self._provider_name,
            self._model, plan.source), urgent=not ahead)
        return Opened(request, kind, prompt, self._make_call(request, kind, prompt, number),
                      begun)

    async def _call_once(self, lane: Lane,
                         opened: Opened) -> tuple[acceptance.Verdict, str | None]:
        """Wait for the receipt, call, then judge and record the return."""
        request, begun = opened.request, opened.begun
        if not begun.done():
            self.writes.hurry()  # opened ahead, its receipt not yet written: write it now
        try:
            attempt_id = await begun
        except asyncio.CancelledError as exc:  # committed, but cancelled before we resumed
            if begun.done() and not begun.cancelled() and begun.exception() is None:
                self._cancelled(begun.result(), exc)
            raise
        self.outcome.calls += 1
        for task_id in request.task_ids:
            self.outcome.attempts_by_task[task_id] = (
                self.outcome.attempts_by_task.get(task_id, 0) + 1)
        try:
            self._fill(lane)
            reply = await self._send(opened.call, attempt_id)
            return await self._judge_and_record(request, reply, attempt_id)
        except BaseException as exc:  # cancellation, Ctrl-C, SystemExit: close the receipt
            self._cancelled(attempt_id, exc)
            raise

    def _cancelled(self, attempt_id: int, exc: BaseException) -> None:
        # Synchronous on purpose: the loop may be unwinding. A receipt already completed is left
        # as it is (the update only touches in-flight rows).
        why = ("interrupted" if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt))
               else f"stopped by {type(exc).__name__}")
        self.ledger.finish_attempt(attempt_id, "cancelled", errors=[{
            "type": "cancelled", "task_id": None,
            "message": f"{why} before the return was judged; re-run to resume"}])

    async def _send(self, call: Call, attempt_id: int) -> Reply:
        try:
            if not self._needs_timer:
                return await self.provider.complete(call)
            async with asyncio.timeout(self.transport.timeout):
                return await self.provider.complete(call)
        except (ProviderError, TimeoutError) as exc:
            error = exc if isinstance(exc, ProviderError) else ProviderError(
                f"no answer within {self.transport.timeout:g}s", retryable=True)
            await self._record_provider_error(attempt_id, str(error), error.status, error.usage)
            raise error from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a provider bug must not leave an in-flight receipt
            message = f"{type(exc).__name__}: {exc}"
            await self._record_provider_error(attempt_id, message, None, {})
            raise ProviderError(message, retryable=False) from exc

    async def _judge_and_record(self, request: Request, reply: Reply,
                          attempt_id: int) -> tuple[acceptance.Verdict, str | None]:
        """Judge now; the record joins the next group commit without holding up this worker.

        Nothing reads the checkpoint before the run ends, and the run flushes and checks every
        queued write before it returns, so a failed commit can never pass as success.
        """
        ledger = self.ledger
        usage = self._account(reply)
        verdict = await acceptance.judge(
            reply, request.tasks, mode=self.plan.mode, identity=self.plan.identity,
            schema=self.plan.schema, validator=self.plan.validator)
        if verdict.accepted:
            self.writes.submit(lambda db: ledger.op_accept(
                db, attempt_id, self.plan.batch_id, request.key, verdict.stored, reply.text,
                usage),
                urgent=False)
            self.outcome.accepted_returns += 1
        else:
            self.writes.submit(lambda db: ledger.op_finish(
                db, attempt_id, "rejected", verdict.errors, reply.text, usage), urgent=False)
            self.outcome.rejected_returns += 1
        return verdict, reply.text

    async def _record_provider_error(self, attempt_id: int, message: str, status: int | None,
                                     usage: Mapping[str, Any]) -> None:
        self.outcome.provider_errors += 1
        errors = [{"type": "provider_error", "task_id": None, "message": message,
                   "status": status}]
        await self.writes.run(lambda db: self.ledger.op_finish(
            db, attempt_id, "provider_error", errors, None, usage))

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
        self.spender.add_cost(reply.cost)
        return {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                "cached_tokens": reply.cached_tokens, "cost": reply.cost, "model": reply.model}
