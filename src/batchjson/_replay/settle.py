"""The one settle step of both transports: each turns what it sent into ``(Attempt, Reply or
ProviderError)`` pairs, and :meth:`Settle.settle` charges, counts and judges each, returning the
write that completes its receipt; :func:`next_attempt` is their one policy for what comes next."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._acceptance import judge as acceptance
from .._acceptance.judge import REPAIRABLE
from .._content.tasks import Request, render_repair_prompt
from .._errors import ProviderError
from .._ledger.store import Store
from .._providers.base import Reply
from .._providers.reply import failure_usage
from .._providers.settings import declared_output_cap
from .._sources import REFUSED, STOP_ERRORS, TRUNCATED
from .budget import Spender, charge_of
from .plan import Outcome, Plan, first_prompt

Write = Callable[[Any], None]  # completes one receipt inside a ledger transaction


@dataclass(frozen=True)
class Attempt:
    """One sent attempt: ``reserved`` this session's (None: another process's), ``held`` the
    ledger's; ``request`` None: a job line, nothing to judge; ``billable``: reached a server."""

    id: int
    reserved: float | None
    held: float
    request: Request | None = None
    sent_at: str | None = None
    billable: bool = False


@dataclass(eq=False)
class Settle:
    """Settles the replies of one run: its plan, ledger, provider, budget and counters; each
    transport (``Replayer``, ``JobRunner``) is one."""

    plan: Plan
    store: Store
    provider: Any
    spender: Spender
    outcome: Outcome
    # why the run opens no further call on either transport (what is in flight finishes): a
    # validator crash; what it did not get to is reported not_attempted, saying so
    halted: str | None = None
    splits = True  # whether split=True halves a request this transport sends (jobs: never)

    def cost(self, reply: Reply) -> float | None:
        """What a reply cost: as its provider priced it, else by the run's prices."""
        return reply.cost if reply.cost is not None else self.spender.pricing.cost(
            reply.input_tokens, reply.output_tokens)

    async def settle(self, attempt: Attempt, got: Reply | ProviderError
                     ) -> tuple[acceptance.Verdict | None, Write]:
        """Charge, count and judge ``got``: its verdict (None: a provider's failure) and the write
        that completes its receipt."""
        failed = isinstance(got, ProviderError)
        usage = failure_usage(got.usage) if failed else usage_of(got)
        cost = self.failure_cost(attempt, got, usage) if failed else self.cost(got)
        self.charge(attempt.reserved, cost, usage)
        store, plan, out, key = self.store, self.plan, self.outcome, attempt.id
        sent_at, ledger = attempt.sent_at, self.ledger_charge(attempt.held, cost)
        if failed:
            out.provider_errors += 1
            if cost == 0.0 and "cost" not in usage and (got.refused or got.unreachable
                                                         or got.never_ran):
                usage = {**usage, "cost": 0.0}  # the model never ran it: a known $0
            if usage.get("input_tokens") or usage.get("output_tokens") or "cost" in usage:
                # billed, yet failed: counted as a reply is, by the provider's own cost (unknown
                # without one), as its receipt keeps it
                self._count(usage.get("input_tokens"), usage.get("output_tokens"),
                            usage.get("cost"))
            errors = [provider_error(got)]
            return None, lambda tx: store.complete_call(
                tx, key, "provider_error", None, usage, errors=errors, sent_at=sent_at,
                charge=ledger)
        assert attempt.request is not None  # a reply is judged against what was asked
        out.odd_usage += "unreadable_usage" in got.extra
        self._count(got.input_tokens, got.output_tokens, got.cost)
        request, text = attempt.request, got.text
        verdict = await acceptance.judge(got, request.tasks, mode=plan.mode,
                                         identity=plan.identity, schema=plan.schema,
                                         validator=plan.validator, accept=plan.accept)
        status, accepted, parts = "rejected", None, None
        if verdict.partial:  # its passing items committed, the rest asked again (apart)
            out.partial_returns += 1
            kept, rest = plan.keys.apart(request, verdict.rejected_ids)
            status, accepted = "partial", (plan.batch_id, kept.key, verdict.stored)
            parts = (plan.revision_id, request, kept, rest,
                     acceptance.sub_return(text, kept.task_ids))
        elif verdict.accepted:
            out.accepted_returns += 1
            status, accepted = "accepted", (plan.batch_id, request.key, verdict.stored)
        else:
            out.rejected_returns += 1
            count_thrown_away(out, request, verdict.errors, cost, usage)
            crash = next((e for e in verdict.errors if e.get("type") == "validator_error"), None)
            if crash is not None:  # it would most likely crash on every other return too
                self.halted = self.halted or (f"the validator crashed ({first_line(crash)}); no "
                                              "further calls were opened. Fix the validator "
                                              "and re-run.")
                out.stopped = out.stopped or self.halted  # the first reason stands
        return verdict, lambda tx: store.complete_call(
            tx, key, status, text, usage, errors=verdict.errors, accepted=accepted, parts=parts,
            sent_at=sent_at, charge=ledger)

    def _count(self, inp: int | None, out: int | None, cost: float | None) -> None:
        """A call's billed tokens and cost in the run's totals (a None cost: theirs unknown)."""
        outcome = self.outcome
        outcome.input_tokens += inp or 0
        outcome.output_tokens += out or 0
        outcome.cost = None if outcome.cost is None or cost is None else outcome.cost + cost

    def give_up(self, request: Request, step: Next, chain: Sequence[Tried]) -> None:
        """Report ``request`` given up after this run's ``chain``, alike on either transport: cut
        off at the output ceiling, why it is not asked again and the fix (``chain`` empty: cut off
        in an earlier run); else its last attempt's errors. Either way with the last answer."""
        last = chain[-1] if chain else Tried("", ())  # empty only when cut off before
        if step.why != TRUNCATED:
            return fail(self.outcome, request, list(last.errors), last.raw)
        cap = declared_output_cap(self.provider)
        limit = (f"more than max_tokens={cap} output tokens" if cap is not None else
                 "more output tokens than the provider's limit")
        before = "" if chain else ("an earlier return of this request was cut off at this "
                                   "provider's output limit; ")
        fix = "raise max_tokens"
        if len(request.tasks) > 1:  # a batch job never splits a request; split=True live does
            fix += (", or pack fewer tasks per call (a batch job never splits a request)"
                    if not self.splits else ", pack fewer tasks per call, or pass split=True"
                    if not self.plan.split else ", or pack fewer tasks per call")
        fail(self.outcome, request, [{"type": TRUNCATED, "task_id": None, "message": (
            f"{before}the answer needs {limit}, and asking again under the same limit would be "
            f"cut off again (not re-asked): {fix}")}], last.raw)

    def out_of_budget(self, request: Request, detail: str) -> None:
        """Report ``request`` left unresolved for want of budget (``detail``: by how much), alike
        on either transport."""
        fail(self.outcome, request, [{
            "type": "budget_exhausted", "task_id": None,
            "message": f"the budget ran out before this request was resolved ({detail})"}])

    def ledger_charge(self, held: float, cost: float | None) -> float | None:
        """What settles a call on the ledger's own budget (None: it has none): its cost, or what
        the ledger held for it when that is unknown."""
        return charge_of(held, cost) if self.spender.shared is not None else None

    def failure_cost(self, attempt: Attempt, error: ProviderError,
                     usage: Mapping[str, Any]) -> float | None:
        """What a failure cost (``usage``: its own, read as :func:`failure_usage` reads it): the
        provider's figure, else its billed tokens at the run's prices; nothing when the model
        never ran (unreachable, a 4xx, a job line without an answer); unknown (None) when it
        may have been billed (a 5xx, a cut-off call, tokens at no known price)."""
        if "cost" in usage:
            return usage["cost"]
        billed = self.spender.pricing.cost(usage.get("input_tokens"), usage.get("output_tokens"))
        if billed is not None or "input_tokens" in usage or "output_tokens" in usage:
            return billed
        return 0.0 if not attempt.billable or error.unreachable or error.refused else None

    def charge(self, reserved: float | None, cost: float | None,
               usage: Mapping[str, Any]) -> None:
        """Settle a call's reservation (None: another process's); a call billed beyond it stops
        the cost budget opening calls."""
        spender, cap = self.spender, self.spender.pricing.max_output_tokens

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


def provider_error(exc: ProviderError) -> dict[str, Any]:
    """A provider's failure as a receipt and a result show it, on either transport."""
    status = f" (HTTP {exc.status})" if exc.status else ""
    error = {"type": "provider_error", "task_id": None, "status": exc.status,
             "retryable": exc.retryable, "message": f"provider failed{status}: {exc}"}
    if exc.kind != "provider_error":  # the source's own type (droste's error types)
        error["kind"] = exc.kind
    return error


def rest_tried(kind: str, raw: str, rest: Request,
               errors: Sequence[Mapping[str, Any]]) -> Tried:
    """The rejected part of a partial return as the attempt its chain goes on from (its own items
    and errors), so a repair asks for those tasks alone."""
    return Tried(kind, [e for e in errors if e.get("task_id") in rest.task_ids],
                 acceptance.sub_return(raw, rest.task_ids))


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


def count_thrown_away(outcome: Outcome, request: Request, errors: Sequence[Mapping[str, Any]],
                      cost: float | None, usage: Mapping[str, Any]) -> None:
    """The valid answers a return rejected only for some items' schema or validator faults threw
    away, and their share of its cost and tokens (other faults trust no part of a return)."""
    if not errors or any(e.get("type") not in acceptance.ITEM_FAULTS for e in errors):
        return
    failed = {e.get("task_id") for e in errors}
    fine = [t for t in request.task_ids if t not in failed]
    if not fine:
        return
    share = len(fine) / len(request.task_ids)
    outcome.thrown_away += len(fine)
    outcome.thrown_tasks.update(fine)
    outcome.thrown_cost = (None if outcome.thrown_cost is None or cost is None
                           else outcome.thrown_cost + share * cost)
    outcome.thrown_tokens += share * sum(usage.get(k) or 0 for k in ("input_tokens",
                                                                      "output_tokens"))


def first_line(error: Mapping[str, Any]) -> str:
    """The first line of a validator crash: where it happened when the error says, else why."""
    lines = str(error.get("traceback") or error.get("message") or "").strip().splitlines()
    return lines[0] if lines else "validator_error"


def usage_of(reply: Reply) -> dict[str, Any]:
    return {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
            "cached_tokens": reply.cached_tokens, "cost": reply.cost, "model": reply.model}


HALVE, NONE = "halve", "none"


@dataclass(frozen=True)
class Tried:
    """One judged, rejected attempt of a request, on either transport (a provider error too)."""

    kind: str
    errors: Sequence[Mapping[str, Any]]
    raw: str | None = None


@dataclass(frozen=True)
class Next:
    """What a request does next: an attempt ``kind`` with its ``prompt``, :data:`HALVE`, or
    :data:`NONE` (given up); ``why``: the error type that ends it (a HALVE's too), or ``spent``."""

    kind: str
    prompt: str = ""
    why: str = ""


def next_attempt(plan: Plan, request: Request, chain: Sequence[Tried], *, tried: bool,
                 depth: int = 0, cut_off: bool = False) -> Next:
    """The next attempt of ``request`` after this run's ``chain`` of its rejected attempts
    (``tried``: it has earlier receipts; ``cut_off``: one was cut off under this ceiling)."""
    prompt = first_prompt(plan, request)
    halves = plan.split and len(request.tasks) > 1 and depth < plan.max_split_depth
    if not chain:
        if cut_off:  # asking again under the same limit would be cut off again
            return Next(HALVE if halves else NONE, why=TRUNCATED)
        return Next("split" if depth else "replay" if tried else "initial", prompt)
    last = chain[-1]
    errors, raw = last.errors, last.raw
    stop = next((e["type"] for e in errors if e.get("type") in STOP_ERRORS), None)
    if stop == TRUNCATED:
        return Next(HALVE if halves else NONE, why=TRUNCATED)
    if stop == REFUSED and not plan.reask_refusals:
        return Next(NONE, why=REFUSED)
    repairable = bool(errors) and all(e.get("type") in REPAIRABLE for e in errors)
    if errors and not repairable and raw is not None and not stop:  # a validator crash
        return Next(NONE, why=str(errors[0].get("type")))
    if raw is None and not all(e.get("retryable", True) for e in errors):
        return Next(NONE, why="provider_error")  # 400/401/403/404: asking again cannot help
    if raw is not None and repairable and sum(t.kind == "repair" for t in chain) < plan.repairs:
        return Next("repair", render_repair_prompt(prompt, raw, list(errors)))
    if sum(t.kind == "replay" for t in chain[1:]) < plan.replays:
        return Next("replay", prompt)
    if halves and not any(e.get("status") == 429 for e in errors):
        return Next(HALVE)  # the limits of the day split no pack: a 429 is not halved
    return Next(NONE, why="spent")
