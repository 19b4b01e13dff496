"""One call of the replay loop: reserve its worst case, claim the request and commit the
in-flight receipt, and only then send; judge the return and queue its record.

A mixin of :class:`~batchjson._replay.replay.Replayer`, which owns the state used here (plan,
ledger, provider, spender, group commit, stop flags); kept apart so the loop's shape (queue,
workers, repairs and replays) reads on its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._acceptance import judge as acceptance
from .._content.schema import wire_schema
from .._content.tasks import Request, render_items_prompt, render_value_prompt
from .._errors import LedgerError, ProviderError
from .._ledger.claims import ACCEPTED, MINE, OVER, Owner
from .._ledger.records import now
from .._ledger.store import Store
from .._providers.base import Call, Reply, estimate_tokens, input_bound
from .budget import Pricing, Spender, charge_of, usd
from .groupcommit import GroupCommit
from .plan import Outcome, Plan, Transport, system_prompt


class OutOfBudget(Exception):
    """No call may be reserved any more; the request is left unresolved for this run."""


class Held(Exception):
    """Another live runner holds this request's claim: wait for its result instead."""


class Resolved(Exception):
    """The request was accepted meanwhile (by another runner): nothing to send."""


class Stopped(Exception):
    """The run stopped opening calls (validator crash, unreachable provider, ledger failure)."""


class CallSteps:
    """The steps of one call; the Replayer supplies the attributes declared here."""

    plan: Plan
    store: Store
    provider: Any
    spender: Spender
    transport: Transport
    outcome: Outcome
    writes: GroupCommit
    owner: Owner
    _attempts: dict[str, int]
    _system: str
    _provider_name: str
    _model: str | None
    _needs_timer: bool
    _stop: BaseException | None
    _fatal: BaseException | None
    _reachable: asyncio.Event | None
    _prober: str | None
    _settled: asyncio.Event | None
    _workers: list[asyncio.Future]
    _changed: asyncio.Event

    async def _reserve(self, call: Call) -> float:
        """Reserve this call's worst case (its input bound, computed only under a cost budget,
        plus its output ceiling); wait for calls in flight to settle before giving up, since
        their real cost is usually below their reservation."""
        assert self._settled is not None
        spender = self.spender
        bound = input_bound(self.provider, call) if spender.costed else 0
        while True:
            reserved = spender.reserve(bound)
            if reserved is not None:
                return reserved
            if not spender.waiting_on_reservations or spender.stopped is not None:
                raise OutOfBudget(spender.shortfall(bound))
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
        number = self._attempts.get(request.key, 0)
        # Built before anything is reserved or written: whatever fails here leaves no receipt.
        call = make_call(self.plan, self._system, request, kind, prompt, number)
        reserved, attempt_id = await self._open(request, kind, call,
                                                estimate_tokens(self._system + prompt))
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
        self._attempts[request.key] = number + 1
        self.outcome.calls += 1
        for task_id in request.task_ids:
            self.outcome.attempts_by_task[task_id] = (
                self.outcome.attempts_by_task.get(task_id, 0) + 1)
        sent_at = now()
        settled = False
        reply: Reply | None = None
        charge = reserved  # what the call costs until its reply says: its worst case
        try:
            try:
                reply, charge = await self._send(call, attempt_id, sent_at, reserved)
                settled = True
            except ProviderError:
                settled = True
                raise
            return await self._judge(request, reply, attempt_id, sent_at, charge)
        except BaseException as exc:  # cancellation, Ctrl-C, SystemExit: close the receipt
            if not settled:
                self.spender.settle(reserved, None)  # sent, answer unknown: the worst case
            if not isinstance(exc, ProviderError):
                # An answer that arrived but was interrupted while being judged is paid for:
                # its text and usage are kept, and a re-run judges it before asking again.
                self._close(attempt_id, _why(exc), sent_at, reply, charge)
            raise

    async def _open(self, request: Request, kind: str, call: Call,
                    estimated: int) -> tuple[float, int]:
        """Reserve the call's worst case, then claim the request and commit its receipt (and,
        on a ledger with a budget of its own, the same reservation there): (reserved, receipt
        id). A request held elsewhere or accepted meanwhile raises Held or Resolved, with
        nothing kept; a ledger budget that cannot hold the call is looked at again while calls
        in flight may make room, then given up on (OutOfBudget)."""
        store, plan, owner = self.store, self.plan, self.owner
        floor = self.spender.pricing.floor(estimated)  # for the account: an estimate
        pause = 0.05
        while True:
            reserved = await self._reserve(call)
            shared = reserved if self.spender.shared is not None else None
            begun = self.writes.submit(lambda tx, shared=shared: store.begin_call(
                tx, plan.batch_id, plan.revision_id, request, kind, self._provider_name,
                self._model, plan.source, owner=owner, estimated_input_tokens=estimated,
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
                error = exc if isinstance(exc, LedgerError) else LedgerError(
                    "the receipt of a call could not be written", path=store.where, cause=exc)
                self._stop_for(error)
                raise Stopped() from exc
            if state == MINE:
                assert attempt_id is not None
                return reserved, attempt_id
            self.spender.release(reserved)  # nothing will be sent: its receipt was not kept
            if state != OVER:
                raise Resolved() if state == ACCEPTED else Held()
            pause = await self._await_ledger_budget(reserved, pause)

    async def _await_ledger_budget(self, worst: float, pause: float) -> float:
        """The ledger's own budget cannot hold a call: while calls in flight (on any host) hold
        enough of it that their settling could make room, look again after ``pause`` (the next
        pause returned); else give up, saying what is left."""
        if self.spender.shared is None:
            raise OutOfBudget("a cost budget was set on the ledger after this run started, so "
                              "its calls were not priced against it; re-run to hold it")
        shared = self.store.shared_budget()
        if shared is None:  # removed a moment ago: the next try holds nothing
            return pause
        if not shared["reserved"] or worst > shared["cost"] - shared["spent"]:
            raise OutOfBudget(
                f"one call for it may cost up to {usd(worst)} and the ledger's cost budget of "
                f"{usd(shared['cost'])} has {usd(shared['left'])} left "
                f"({usd(shared['reserved'])} held by calls in flight on every host)")
        await asyncio.sleep(pause)
        if self._stop is not None:
            raise Stopped()
        return min(pause * 1.5, 1.0)

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

    def _close(self, attempt_id: int, why: str, sent_at: str | None,
               reply: Reply | None = None, charge: float = 0.0) -> None:
        # Synchronous on purpose: the loop may be unwinding. A receipt already completed is left
        # as it is (the update only touches in-flight rows). If the ledger itself has failed,
        # the receipt stays in flight (a possible call) and that failure is what is reported.
        self.writes.flush_now()
        kept = reply is not None and isinstance(reply.text, str)
        errors = [{"type": "cancelled", "task_id": None,
                   "message": (f"{why}; re-run to resume" if sent_at is None else
                               f"{why} before the return was judged; re-run to resume")
                   + (" (the answer is kept and is judged first)" if kept else "")}]
        try:
            with self.store.call_transaction() as tx:
                self.store.finish_call(tx, attempt_id, "cancelled", errors,
                                       reply.text if kept else None,
                                       _usage(reply) if kept else {}, sent_at=sent_at,
                                       charge=self._ledger_charge(charge))
        except LedgerError as exc:
            self._stop_for(exc)

    async def _send(self, call: Call, attempt_id: int, sent_at: str,
                    reserved: float) -> tuple[Reply, float]:
        """The reply and what the call was charged (its cost, or its worst case)."""
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
            # Nothing is billed for a request that never reached the server (connection
            # refused, no such host) or that the API refused before its model ran (a 4xx:
            # invalid, unauthorised, rate-limited). A 5xx (a gateway timing out after the model
            # ran) or a call cut off after it was sent may have been billed: it keeps its worst
            # case, and its receipt records the cost as unknown.
            billed = self.spender.pricing.cost(error.usage.get("input_tokens"),
                                               error.usage.get("output_tokens"))
            unbilled = error.unreachable or (error.status is not None
                                             and 400 <= error.status < 500)
            charge = self._settle(reserved, billed if billed is not None else
                                  (0.0 if unbilled else None), error.usage)
            self._record_provider_error(attempt_id, str(error), error.status, error.usage,
                                        sent_at, charge)
            raise error from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a provider bug must not leave an in-flight receipt
            message = f"{type(exc).__name__}: {exc}"
            self.spender.settle(reserved, None)
            self._record_provider_error(attempt_id, message, None, {}, sent_at, reserved)
            raise ProviderError(message, retryable=False) from exc
        self._reachable_again(call)
        return reply, self._settle(reserved, self._cost(reply), _usage(reply))

    def _settle(self, reserved: float, cost: float | None, usage: Mapping[str, Any]) -> float:
        """Settle the call's reservation, returning what it was charged; a call billed beyond
        it stops the cost budget opening calls, and the run says by how much (its receipt keeps
        the real cost)."""
        cap = self.spender.pricing.max_output_tokens

        def why() -> str:
            out = usage.get("output_tokens")
            if isinstance(out, int) and cap is not None and out > cap:
                return f"{out} output tokens against a ceiling of max_tokens={cap}"
            return (f"{usage.get('input_tokens')} input and {out} output tokens, answered by "
                    f"{usage.get('model') or self._model}")

        beyond = self.spender.settle(reserved, cost, why)
        if beyond:
            self.outcome.overrun += beyond
            self.outcome.stopped = self.spender.stopped
        return charge_of(reserved, cost)

    def _ledger_charge(self, charge: float) -> float | None:
        """What a completing receipt charges the ledger's own budget (None: the run reserved
        nothing there)."""
        return charge if self.spender.shared is not None else None

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

    async def _judge(self, request: Request, reply: Reply, attempt_id: int, sent_at: str,
                     charge: float) -> tuple[acceptance.Verdict, str | None]:
        """Judge now; the record joins the next group commit without holding up this worker.

        Nothing reads the checkpoint before the run ends, and the run flushes and checks every
        queued write before it returns, so a failed commit can never pass as success; a failed
        commit also fails every later receipt, so no further call is sent.
        """
        store, charged = self.store, self._ledger_charge(charge)
        usage = self._account(reply)
        verdict = await acceptance.judge(
            reply, request.tasks, mode=self.plan.mode, identity=self.plan.identity,
            schema=self.plan.schema, validator=self.plan.validator)
        if verdict.accepted:
            self.writes.queue(lambda tx: store.accept_call(
                tx, attempt_id, self.plan.batch_id, request.key, verdict.stored, reply.text,
                usage, sent_at, charged))
            self.outcome.accepted_returns += 1
        else:
            self.writes.queue(lambda tx: store.finish_call(
                tx, attempt_id, "rejected", verdict.errors, reply.text, usage, sent_at,
                charged))
            self.outcome.rejected_returns += 1
        return verdict, reply.text

    def _record_provider_error(self, attempt_id: int, message: str, status: int | None,
                               usage: Mapping[str, Any], sent_at: str, charge: float) -> None:
        self.outcome.provider_errors += 1
        errors = [{"type": "provider_error", "task_id": None, "message": message,
                   "status": status}]
        charged = self._ledger_charge(charge)
        self.writes.queue(lambda tx: self.store.finish_call(
            tx, attempt_id, "provider_error", errors, None, usage, sent_at, charged))

    def _account(self, reply: Reply) -> dict[str, Any]:
        out = self.outcome
        out.input_tokens += reply.input_tokens or 0
        out.output_tokens += reply.output_tokens or 0
        if reply.cost is None:
            out.cost = None
        elif out.cost is not None:
            out.cost += reply.cost
        return _usage(reply)


def first_prompt(plan: Plan, request: Request) -> str:
    """The prompt of a request's first call (and of its exact replays)."""
    if plan.mode == "value":
        return render_value_prompt(request.tasks[0])
    return render_items_prompt(request.tasks, plan.identity, plan.instructions,
                               request.tasks_json)


def make_call(plan: Plan, system: str, request: Request, kind: str, prompt: str,
              number: int) -> Call:
    if plan.mode == "value":
        schema: Mapping[str, Any] = plan.schema.json_schema
    else:
        schema = wire_schema(plan.schema, request.tasks, plan.identity)
    # The provider gets its own copy: acceptance compares against the ledger's request.
    return Call(tasks=tuple(json.loads(request.tasks_json)), prompt=prompt, system=system,
                schema=schema, attempt=number, kind=kind, request_key=request.key,
                mode=plan.mode, identity=plan.identity)


def cheapest_call(plan: Plan, provider: Any, pricing: Pricing,
                  requests: Sequence[Request]) -> Callable[[float], float | None]:
    """For ``Spender.refuse_if_short``: given what the cost budget has left, the worst case of
    the first pending call that fits in it (usually the first one looked at), else the least
    worst case of all of them, which no call beats."""
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


def _usage(reply: Reply) -> dict[str, Any]:
    return {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
            "cached_tokens": reply.cached_tokens, "cost": reply.cost, "model": reply.model}


def _why(exc: BaseException) -> str:
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return "interrupted"
    return f"stopped by {type(exc).__name__}"
