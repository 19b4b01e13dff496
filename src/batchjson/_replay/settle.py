"""The one settle step of both transports: a reply (or a provider's failure) is charged to the
budget, counted, judged and turned into the write that completes its receipt.

A live call settles here as it returns (``calls.py``), a job's line as its job is collected
(``jobs.py``): one account of cost and usage, one shape for each error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._acceptance import judge as acceptance
from .._content.tasks import Request
from .._errors import ProviderError
from .._ledger.store import Store
from .._providers.base import Reply
from .budget import Spender, charge_of, charge_unreserved
from .plan import Outcome, Plan

Write = Callable[[Any], None]  # completes one receipt inside a ledger transaction


@dataclass
class Settle:
    """Settles the replies of one run: its plan, ledger, provider, budget and counters."""

    plan: Plan
    store: Store
    provider: Any
    spender: Spender
    outcome: Outcome

    def cost(self, reply: Reply) -> float | None:
        """What a reply cost: as its provider priced it, else by the run's prices."""
        if reply.cost is not None:
            return reply.cost
        return self.spender.pricing.cost(reply.input_tokens, reply.output_tokens)

    def charge(self, reserved: float | None, cost: float | None,
               usage: Mapping[str, Any]) -> float:
        """Settle a call's reservation (None: a job line another process reserved, charged as
        it stands), returning what it was charged; a call billed beyond it stops the cost
        budget opening calls, and the run says by how much (its receipt keeps the real cost)."""
        spender, cap = self.spender, self.spender.pricing.max_output_tokens
        if reserved is None:
            return charge_unreserved(spender, cost)

        def why() -> str:
            out = usage.get("output_tokens")
            if isinstance(out, int) and cap is not None and out > cap:
                return f"{out} output tokens against a ceiling of max_tokens={cap}"
            return (f"{usage.get('input_tokens')} input and {out} output tokens, answered by "
                    f"{usage.get('model') or getattr(self.provider, 'model', None)}")

        beyond = spender.settle(reserved, cost, why)
        if beyond:
            self.outcome.overrun += beyond
            self.outcome.stopped = spender.stopped
        return charge_of(reserved, cost)

    def ledger(self, charged: float) -> float | None:
        """What a completing receipt charges the ledger's own budget (None: the run reserved
        nothing there)."""
        return charged if self.spender.shared is not None else None

    async def judge(self, request: Request, reply: Reply, attempt_id: int, charged: float,
                    sent_at: str | None = None) -> tuple[acceptance.Verdict, Write]:
        """Count the reply's usage, judge it, and the write that records it."""
        store, plan, out = self.store, self.plan, self.outcome
        out.odd_usage += "unreadable_usage" in reply.extra
        out.input_tokens += reply.input_tokens or 0
        out.output_tokens += reply.output_tokens or 0
        out.cost = None if out.cost is None or reply.cost is None else out.cost + reply.cost
        usage, text, ledger = usage_of(reply), reply.text, self.ledger(charged)
        verdict = await acceptance.judge(reply, request.tasks, mode=plan.mode,
                                         identity=plan.identity, schema=plan.schema,
                                         validator=plan.validator)
        if verdict.accepted:
            out.accepted_returns += 1
            stored = verdict.stored
            return verdict, lambda tx: store.accept_call(
                tx, attempt_id, plan.batch_id, request.key, stored, text, usage, sent_at, ledger)
        out.rejected_returns += 1
        errors = verdict.errors
        return verdict, lambda tx: store.finish_call(
            tx, attempt_id, "rejected", errors, text, usage, sent_at, ledger)

    def failed(self, attempt_id: int, error: ProviderError, charged: float,
               sent_at: str | None = None) -> Write:
        """Count a provider's failure; the write that records it."""
        self.outcome.provider_errors += 1
        errors, usage, ledger = [provider_error(error)], error.usage, self.ledger(charged)
        return lambda tx: self.store.finish_call(tx, attempt_id, "provider_error", errors, None,
                                                 usage, sent_at, ledger)


def provider_error(exc: ProviderError) -> dict[str, Any]:
    """A provider's failure as a receipt and a result show it, on either transport."""
    status = f" (HTTP {exc.status})" if exc.status else ""
    error = {"type": "provider_error", "task_id": None, "status": exc.status,
             "retryable": exc.retryable, "message": f"provider failed{status}: {exc}"}
    if exc.kind != "provider_error":  # the source's own type (droste's error types)
        error["kind"] = exc.kind
    return error


def fail(outcome: Outcome, request: Request, errors: list[dict[str, Any]],
         raw: str | None = None) -> None:
    """Each task's errors; what all of a request's tasks share (an error about the whole
    return, a bystander's) is one dict for them all (the result names the task on read)."""
    extra = {"request": request.key, **({"raw": raw} if raw is not None else {})}
    shared = [{**e, **extra} for e in errors if e.get("task_id") is None]
    bystander = [{"type": "batch_rejected", **extra,
                  "message": "this task's item was fine but another item of the same "
                  "request failed, so the whole return was rejected"}]
    for task_id in request.task_ids:
        own = any(e.get("task_id") == task_id for e in errors)
        outcome.errors[task_id] = ([{**e, **extra} for e in errors if e.get(
            "task_id") in (task_id, None)] if own else shared or bystander)


def usage_of(reply: Reply) -> dict[str, Any]:
    return {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
            "cached_tokens": reply.cached_tokens, "cost": reply.cost, "model": reply.model}
