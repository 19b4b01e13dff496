"""Pack-size advice: expected calls, tokens and cost per usable result, from the ledger.

The model (stated in full in docs/recovery.md): a pack of ``k`` tasks costs ``S + t*k`` input
and ``O + u*k`` output tokens, part of the input read from the prompt cache; a return is broken
whole with probability ``c``, else each item is faulty with probability ``p``, so
``s(k) = (1 - c) * (1 - p)**k``; a request gets ``1 + repairs + replays`` attempts, then halves
when splitting. Everything is fitted from the batch's own receipts, except prices."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidBatch
from .._ledger import Ledger
from .._providers.pricing import price_for
from .accounts import cost_summary

CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50)
CALL_FAULTS = frozenset({"json", "coverage"})
ITEM_FAULTS = frozenset({"identity", "schema", "validation"})
MAX_SPLIT_DEPTH = 4


@dataclass(frozen=True)
class Fit:
    """What the receipts say about this batch."""

    tasks: int
    returns: int
    call_fault_rate: float  # c
    item_fault_rate: float  # p
    provider_error_rate: float
    shared_input: float  # S
    input_per_task: float  # t
    shared_output: float  # O
    output_per_task: float  # u
    repair_extra_input: float  # R
    input_price: float | None  # USD per token
    output_price: float | None
    cached_input: float = 0.0  # C: input tokens per call read from the prompt cache
    cached_price: float | None = None  # USD per cached input token (None: the input price)


def _least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of y on x, or None when x does not vary."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - slope * mx, slope


def _item_rate(returns: Sequence[tuple[int, bool]]) -> float:
    """Maximum-likelihood per-item fault rate from (size, accepted) of returns whose envelope
    was sound; with no item fault observed, half a fault over everything seen (not zero)."""
    if not returns:
        return 0.0
    if all(ok for _, ok in returns):
        return 0.5 / max(1, sum(k for k, _ in returns))

    def loglik(p: float) -> float:
        total = 0.0
        for k, ok in returns:
            good = (1 - p) ** k
            total += k * math.log1p(-p) if ok else math.log(max(1e-300, 1 - good))
        return total

    lo, hi = 1e-7, 1 - 1e-7
    for _ in range(200):  # golden-section search: the likelihood is unimodal in p
        a, b = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        if loglik(a) < loglik(b):
            lo = a
        else:
            hi = b
    return (lo + hi) / 2


def fit(ledger: Ledger, name: str) -> Fit:
    """Fit the model's parameters from every receipt of batch ``name``."""
    rows = ledger.store.fit_rows(name)
    tasks = cost_summary(ledger.store, name)["total"]["tasks"]
    judged, item_returns, fresh_in, outs, repairs_extra, chars = [], [], [], [], [], []
    cached: list[int] = []
    provider_errors, call_faults, models, priced = 0, 0, set(), []
    for r in rows:
        k = len(json.loads(r["task_ids"]))
        if r["status"] == "provider_error":
            provider_errors += 1
            continue
        if r["status"] not in ("accepted", "rejected"):
            continue
        kinds = {e.get("type") for e in json.loads(r["errors"] or "[]")}
        judged.append(k)
        if r["status"] == "accepted":
            item_returns.append((k, True))
        elif kinds & CALL_FAULTS:
            call_faults += 1
        elif kinds & ITEM_FAULTS:
            item_returns.append((k, False))
        if r["input_tokens"] is not None and r["kind"] != "repair":
            fresh_in.append((k, r["input_tokens"]))
            cached.append(min(r["cached_tokens"] or 0, r["input_tokens"]))
            if r["chars"]:
                chars.append(r["chars"] / k / 4)
        if r["output_tokens"] is not None and r["status"] == "accepted":
            outs.append((k, r["output_tokens"]))
        if r["model"]:
            models.add(r["model"])
        if r["cost"] is not None and r["input_tokens"] is not None:
            priced.append((r["input_tokens"], r["output_tokens"] or 0, r["cost"]))
    if not judged:
        raise InvalidBatch(f"batch {name!r} has no judged returns yet, so there is nothing to "
                           "fit: run it (or a small pilot of it) first")
    shared, per = _split_tokens(fresh_in, chars)
    out_shared, out_per = _split_tokens(outs, [])
    for r in rows:
        if r["kind"] == "repair" and r["input_tokens"] is not None:
            k = len(json.loads(r["task_ids"]))
            repairs_extra.append(r["input_tokens"] - (shared + per * k))
    in_price, out_price = _prices(models, priced)
    calls = len(judged) + provider_errors
    return Fit(tasks=tasks, returns=len(judged), call_fault_rate=call_faults / len(judged),
               item_fault_rate=_item_rate(item_returns),
               provider_error_rate=provider_errors / calls if calls else 0.0,
               shared_input=shared, input_per_task=per, shared_output=out_shared,
               output_per_task=out_per,
               repair_extra_input=(sum(repairs_extra) / len(repairs_extra) if repairs_extra
                                   else out_shared + out_per * (sum(judged) / len(judged))),
               input_price=in_price, output_price=out_price,
               cached_input=min(shared, sum(cached) / len(cached)) if cached else 0.0,
               cached_price=_cached_price(models))


def _cached_price(models: set[str]) -> float | None:
    """USD per prompt-cache read of the batch's one known model, if its table prices them."""
    price = price_for(next(iter(models))) if len(models) == 1 else None
    return None if price is None or price.cached_input is None else price.cached_input / 1e6


def _split_tokens(points: list[tuple[int, int]], per_task_hint: list[float]) -> tuple[float, float]:
    """Shared and per-task tokens: a line through the observed sizes, or (one size only) the
    per-task share from the tasks' own text and the rest as shared."""
    line = _least_squares([(float(k), float(v)) for k, v in points])
    if line is not None and line[0] >= 0 and line[1] > 0:
        return line
    if not points:
        return 0.0, 0.0
    mean_k = sum(k for k, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    per = (sum(per_task_hint) / len(per_task_hint)) if per_task_hint else mean_v / mean_k
    per = min(per, mean_v / mean_k)
    return max(0.0, mean_v - per * mean_k), per


def _prices(models: set[str], priced: list[tuple[int, int, float]]
            ) -> tuple[float | None, float | None]:
    """USD per token: the price table when the batch used one known model, else a fit of the
    recorded costs, else the mean recorded cost per token for both; None with no costs."""
    if len(models) == 1:
        price = price_for(next(iter(models)))
        if price is not None:
            return price.input / 1e6, price.output / 1e6
    if not priced:
        return None, None
    # cost = a*in + b*out: normal equations of the two-variable fit through the origin
    sii = sum(i * i for i, _, _ in priced)
    soo = sum(o * o for _, o, _ in priced)
    sio = sum(i * o for i, o, _ in priced)
    sic = sum(i * c for i, _, c in priced)
    soc = sum(o * c for _, o, c in priced)
    det = sii * soo - sio * sio
    if det > 1e-9 * max(1.0, sii * soo):
        a, b = (sic * soo - soc * sio) / det, (soc * sii - sic * sio) / det
        if a >= 0 and b >= 0:
            return a, b
    tokens = sum(i + o for i, o, _ in priced)
    mean = sum(c for _, _, c in priced) / tokens if tokens else 0.0
    return mean, mean


@dataclass(frozen=True)
class Estimate:
    pack: int
    split: bool
    calls: float
    input_tokens: float
    output_tokens: float
    cost: float | None
    usable: float
    tasks: int

    @property
    def per_usable(self) -> float:
        """Cost (or, with no prices, tokens) per usable result."""
        spent = self.cost if self.cost is not None else self.input_tokens + self.output_tokens
        return spent / self.usable if self.usable else math.inf

    def as_dict(self) -> dict[str, Any]:
        n = self.usable or math.nan
        return {"pack": self.pack, "split": self.split, "calls": round(self.calls, 3),
                "input_tokens": round(self.input_tokens, 1),
                "output_tokens": round(self.output_tokens, 1),
                "cost": None if self.cost is None else round(self.cost, 9),
                "usable_results": round(self.usable, 3),
                "unresolved": round(self.tasks - self.usable, 3),
                "calls_per_usable_result": round(self.calls / n, 4) if self.usable else None,
                "tokens_per_usable_result": (round((self.input_tokens + self.output_tokens) / n,
                                                   1) if self.usable else None),
                "cost_per_usable_result": (None if self.cost is None or not self.usable
                                           else round(self.cost / n, 9))}


def _geometric(q: float, start: int, stop: int) -> float:
    """sum(q**j for j in range(start, stop)), without the loop."""
    if stop <= start:
        return 0.0
    if q >= 1:
        return float(stop - start)
    return (q ** start - q ** stop) / (1 - q)


def estimate(f: Fit, pack: int, *, split: bool, repairs: int, replays: int,
             tasks: int | None = None) -> Estimate:
    """Expected totals for running ``tasks`` (default: the batch's) at ``pack`` per request."""
    n = f.tasks if tasks is None else tasks
    memo: dict[tuple[int, int], tuple[float, float, float, float]] = {}

    def request(k: int, depth: int) -> tuple[float, float, float, float]:
        """(calls, input tokens, output tokens, usable) for one request of k tasks."""
        if (k, depth) in memo:
            return memo[(k, depth)]
        s = (1 - f.call_fault_rate) * (1 - f.item_fault_rate) ** k
        per_call = 1 / (1 - f.provider_error_rate) if f.provider_error_rate < 1 else math.inf
        fresh_in = f.shared_input + f.input_per_task * k
        out = f.shared_output + f.output_per_task * k
        # Attempt j is made with probability q**j (q = 1 - s): geometric sums, in closed form
        # so any number of repairs and replays costs the same to estimate.
        q = 1 - s
        made = _geometric(q, 0, 1 + repairs + replays)  # expected attempts
        repaired = _geometric(q, 1, repairs + 1)  # expected repair attempts (j = 1..repairs)
        calls = made * per_call
        inp = made * fresh_in + repaired * f.repair_extra_input
        outp = made * out
        reach = q ** (1 + repairs + replays)
        usable = k * (1 - reach)
        if split and k > 1 and depth < MAX_SPLIT_DEPTH and reach > 0:
            for half in ((k + 1) // 2, k // 2):
                c, i, o, u = request(half, depth + 1)
                calls, inp, outp, usable = (calls + reach * c, inp + reach * i,
                                            outp + reach * o, usable + reach * u)
        memo[(k, depth)] = (calls, inp, outp, usable)
        return memo[(k, depth)]

    sizes = [pack] * (n // pack) + ([n % pack] if n % pack else [])
    totals = [0.0, 0.0, 0.0, 0.0]
    for k in sizes:
        for i, v in enumerate(request(k, 0)):
            totals[i] += v
    calls, inp, outp, usable = totals
    cost = (None if f.input_price is None or f.output_price is None
            else inp * f.input_price + outp * f.output_price - _cache_saving(f, calls))
    return Estimate(pack, split, calls, inp, outp, cost, usable, n)


def _cache_saving(f: Fit, calls: float) -> float:
    """What prompt-cache reads take off the input bill: the cached prefix (``C`` per call) is the
    same whatever the pack, so it makes small packs cheaper than full price would say."""
    if f.cached_price is None or f.input_price is None or not f.cached_input:
        return 0.0
    return calls * f.cached_input * (f.input_price - f.cached_price)


def choose(options: Sequence[Estimate], max_unresolved: float = 0.01) -> Estimate:
    """The lowest expected cost per usable result among options expected to leave at most
    ``max_unresolved`` of the tasks (and at least half a task) unresolved; among all options
    when none does. A cheap pack that leaves work undone is not a saving."""
    def unresolved(e: Estimate) -> float:
        return e.tasks - e.usable

    finishing = [e for e in options if unresolved(e) <= max(0.5, max_unresolved * e.tasks)]
    def tokens(e: Estimate) -> float:  # the tie-break when every price is zero
        return (e.input_tokens + e.output_tokens) / max(e.usable, 1e-9)

    return min(finishing or options,
               key=lambda e: (e.per_usable, tokens(e), unresolved(e), e.pack))


def advise(ledger: Ledger, name: str, *, repairs: int = 1, replays: int = 1,
           candidates: Sequence[int] = CANDIDATES, split: bool | None = None,
           max_unresolved: float = 0.01) -> dict[str, Any]:
    """Estimate every candidate pack size (with and without splitting) and recommend one (see
    :func:`choose`). ``split`` restricts the choice to with or without splitting."""
    problem = ledger.no_such_batch(name)
    if problem:
        raise InvalidBatch(problem)
    f = fit(ledger, name)
    sizes = sorted({k for k in candidates if 1 <= k <= max(1, f.tasks)}) or [1]
    options = [estimate(f, k, split=s, repairs=repairs, replays=replays)
               for k in sizes for s in (False, True) if split is None or s == split]
    best = choose(options, max_unresolved)
    observed = ledger.revisions(name, current=True)
    current = int(observed[0].components.get("pack", 0)) if observed else None
    return {
        "batch": name, "tasks": f.tasks, "repairs": repairs, "replays": replays,
        "max_unresolved": max_unresolved,
        "current_pack": current,
        "fit": {k: (round(v, 9) if isinstance(v, float) else v) for k, v in vars(f).items()},
        "priced": f.input_price is not None,
        "candidates": [e.as_dict() for e in options],
        "recommended": best.as_dict(),
        "warning": _warning(name, best),
    }


def _warning(name: str, best: Estimate) -> str | None:
    """Said when even the best pack is expected to leave most of the batch undone: then the
    fault is in the prompt, schema or model, and no pack size is the fix."""
    if best.usable >= best.tasks / 2:
        return None
    return (f"no pack size is expected to finish this batch: the best leaves "
            f"{best.tasks - best.usable:.1f} of {best.tasks} task(s) unresolved at the fault "
            f"rates observed; read the rejected returns (batchjson receipts {name} --failed) "
            "and fix the prompt, schema or validator before choosing a size")
