"""Pack-size advice: expected calls, tokens and cost per usable result, fitted from the batch's
receipts (prices aside). The model (docs/recovery.md): a pack of ``k`` costs ``S + t*k`` input and
``O + u*k`` output tokens; a return is broken whole with probability ``c``, an item confuses its
identity with ``i`` or fails its checks with ``p``: accepted whole with
``s(k) = (1 - c) * ((1 - i) * (1 - p))**k``."""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from .._errors import InvalidBatch
from .._ledger import Ledger
from .._providers.pricing import price_for
from .accounts import cost_summary

CANDIDATES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50)
CALL_FAULTS = frozenset({"json", "coverage"})
# The per-item checks in the order a return meets them (none after the first that failed); an
# identity fault rejects a return whole in every mode, the others item by item when accepted so.
STAGES = ("identity", "schema", "validation")
# How a request is settled: the whole return or nothing, the same with halving after the
# allowance, or item by item (accept="items")
MODES = ("whole", "split", "items")
MAX_SPLIT_DEPTH = 4
LONGEST = 10_000  # sound returns summed over when items are accepted (the rest is negligible)


@dataclass(frozen=True)
class Fit:
    """What the receipts say about this batch."""

    tasks: int
    returns: int
    call_fault_rate: float  # c
    item_fault_rate: float  # p: schema or validator, per item
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
    identity_fault_rate: float = 0.0  # i: per item, rejecting the return whole in every mode


# What each receipt adds to the sums a fit reads. A fit is these sums over its receipts, so a
# bootstrap resample is a fit of resampled receipts at the cost of a few C-level sums.
SUMS = ("provider_errors", "judged", "judged_tasks", "call_faults",
        "fresh", "fresh_k", "fresh_v", "fresh_kk", "fresh_kv", "cached", "hints", "hint_sum",
        "outs", "out_k", "out_v", "out_kk", "out_kv", "repairs", "repair_k", "repair_v",
        *(f"{stage}_{what}" for stage in STAGES for what in ("items", "faults")))
JUDGED = ("accepted", "partial", "rejected")  # a partial receipt kept some items, judged each


def observe(r: Any) -> tuple[float, ...]:
    """One receipt as the fit reads it: what it adds to each of ``SUMS``."""
    k = len(json.loads(r["task_ids"]))
    status, kind, inp, out = r["status"], r["kind"], r["input_tokens"], r["output_tokens"]
    add: dict[str, float] = dict.fromkeys(SUMS, 0.0)
    if kind == "repair" and inp is not None:  # what a repair carries beyond a fresh call
        add.update(repairs=1, repair_k=k, repair_v=inp)
    if status == "provider_error":
        add["provider_errors"] = 1
    elif status in JUDGED:
        errors = json.loads(r["errors"] or "[]") if status != "accepted" else []
        whole = status == "rejected" and any(e.get("type") in CALL_FAULTS for e in errors)
        add.update(judged=1, judged_tasks=k, call_faults=float(whole))
        add.update(_checked_items(k, errors))
        if inp is not None and kind != "repair":
            add.update(fresh=1, fresh_k=k, fresh_v=inp, fresh_kk=k * k, fresh_kv=k * inp,
                       cached=min(r["cached_tokens"] or 0, inp))
            if r["chars"]:
                add.update(hints=1, hint_sum=r["chars"] / k / 4)
        if out is not None and status != "rejected":
            add.update(outs=1, out_k=k, out_v=out, out_kk=k * k, out_kv=k * out)
    return tuple(map(float, add.values()))


def _checked_items(k: int, errors: list[dict[str, Any]]) -> dict[str, int]:
    """Per stage up to the first that failed, the items meeting and failing it."""
    reached: dict[str, int] = {}
    for stage in STAGES:
        reached[f"{stage}_items"] = k
        failed = {e.get("task_id") for e in errors if e.get("type") == stage}
        if failed:
            reached[f"{stage}_faults"] = len(failed)
            return reached
    return {} if errors else reached


@dataclass(frozen=True)
class Observations:
    """A batch's receipts read once: a column per field of ``SUMS``, and the prices."""

    columns: list[list[float]]
    receipts: int
    tasks: int
    prices: tuple[float | None, float | None, float | None]

    @classmethod
    def read(cls, ledger: Ledger, name: str) -> Observations:
        rows = ledger.store.fit_rows(name)
        judged = [r for r in rows if r["status"] in JUDGED]
        models = {r["model"] for r in judged if r["model"]}
        priced = [(r["input_tokens"], r["output_tokens"] or 0, r["cost"]) for r in judged
                  if r["cost"] is not None and r["input_tokens"] is not None]
        columns = [list(c) for c in zip(*map(observe, rows), strict=True)]
        tasks = cost_summary(ledger.store, name)["total"]["tasks"]
        return cls(columns or [[] for _ in SUMS], len(rows), tasks, _prices(models, priced))

    def fit(self, drawn: Sequence[int] | None = None) -> Fit | None:
        """The model's parameters from the receipts ``drawn`` (default: all); None unjudged."""
        pick = itemgetter(*drawn) if drawn is not None else None  # one C-level gather a column
        s = {k: sum(c if pick is None else pick(c)) for k, c in zip(SUMS, self.columns,
                                                                   strict=True)}
        if not s["judged"]:
            return None
        hint = s["hint_sum"] / s["hints"] if s["hints"] else None
        shared, per = _split_tokens(*(s[f"fresh{x}"] for x in ("", "_k", "_v", "_kk", "_kv")),
                                    hint)
        out_shared, out_per = _split_tokens(*(s[f"out{x}"] for x in ("s", "_k", "_v", "_kk",
                                                                        "_kv")), None)
        repair_extra = ((s["repair_v"] - s["repairs"] * shared - per * s["repair_k"])
                        / s["repairs"] if s["repairs"] else
                        out_shared + out_per * s["judged_tasks"] / s["judged"])
        return Fit(tasks=self.tasks, returns=int(s["judged"]),
                   call_fault_rate=s["call_faults"] / s["judged"],
                   item_fault_rate=_item_rate(s), identity_fault_rate=_rate(s, "identity"),
                   provider_error_rate=s["provider_errors"] / (s["judged"]
                                                               + s["provider_errors"]),
                   shared_input=shared, input_per_task=per, shared_output=out_shared,
                   output_per_task=out_per, repair_extra_input=repair_extra,
                   input_price=self.prices[0], output_price=self.prices[1],
                   cached_input=min(shared, s["cached"] / s["fresh"]) if s["fresh"] else 0.0,
                   cached_price=self.prices[2])

    def resampled(self, count: int, size: int, seed: int = 0) -> list[Fit]:
        """Fits of ``count`` seeded bootstrap resamples of ``size`` receipts (none from one)."""
        if self.receipts < 2:
            return []
        rng, receipts = random.Random(seed), range(self.receipts)
        fits = (self.fit(rng.choices(receipts, k=size)) for _ in range(count))
        return [f for f in fits if f is not None]


def _rate(s: dict[str, float], stage: str) -> float:
    return s[f"{stage}_faults"] / s[f"{stage}_items"] if s[f"{stage}_items"] else 0.0


def _item_rate(s: dict[str, float]) -> float:
    """Per item, failing the schema or the validator; with no fault seen, half of one (not 0)."""
    if not any(s[f"{stage}_faults"] for stage in STAGES):
        return 0.5 / max(1.0, s["identity_items"]) if s["identity_items"] else 0.0
    return 1 - (1 - _rate(s, "schema")) * (1 - _rate(s, "validation"))


def _split_tokens(n: float, sk: float, sv: float, skk: float, skv: float,
                 per_task_hint: float | None) -> tuple[float, float]:
    """Shared and per-task tokens: a line through the sizes, or (one size) the hint."""
    spread = n * skk - sk * sk  # of the sizes: exact, as they are whole numbers
    slope = (n * skv - sk * sv) / spread if n >= 2 and spread > 0 else 0.0
    if slope > 0 and sv - slope * sk >= 0:  # a line with no negative intercept
        return (sv - slope * sk) / n, slope
    if not n:
        return 0.0, 0.0
    mean_k, mean_v = sk / n, sv / n
    per = min(mean_v / mean_k if per_task_hint is None else per_task_hint, mean_v / mean_k)
    return max(0.0, mean_v - per * mean_k), per


def _prices(models: set[str], priced: list[tuple[int, int, float]]
            ) -> tuple[float | None, float | None, float | None]:
    """USD per input, output and cached token: the table's for one known model, else fitted."""
    price = price_for(next(iter(models))) if len(models) == 1 else None
    if price is not None:
        cached = None if price.cached_input is None else price.cached_input / 1e6
        return price.input / 1e6, price.output / 1e6, cached
    if not priced:
        return None, None, None
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
            return a, b, None
    tokens = sum(i + o for i, o, _ in priced)
    mean = sum(c for _, _, c in priced) / tokens if tokens else 0.0
    return mean, mean, None


@dataclass(frozen=True)
class Estimate:
    pack: int
    mode: str  # one of MODES
    calls: float
    input_tokens: float
    output_tokens: float
    cost: float | None
    usable: float
    tasks: int

    @property
    def per_usable(self) -> float:
        spent = self.cost if self.cost is not None else self.input_tokens + self.output_tokens
        return spent / self.usable if self.usable else math.inf

    def as_dict(self) -> dict[str, Any]:
        n = self.usable or math.nan
        return {"pack": self.pack, "mode": self.mode, "calls": round(self.calls, 3),
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


def estimate(f: Fit, pack: int, *, mode: str = "whole", repairs: int, replays: int,
             tasks: int | None = None) -> Estimate:
    """Expected totals for ``tasks`` (default: the batch's) at ``pack`` a request in ``mode``."""
    n = f.tasks if tasks is None else tasks
    per_call = 1 / (1 - f.provider_error_rate) if f.provider_error_rate < 1 else math.inf

    @functools.cache
    def request(k: int, depth: int) -> tuple[float, float, float, float]:
        if mode == "items":
            return _itemwise(f, k, repairs, replays, per_call)
        s = (1 - f.call_fault_rate) * ((1 - f.identity_fault_rate) * (1 - f.item_fault_rate)) ** k
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
        if mode == "split" and k > 1 and depth < MAX_SPLIT_DEPTH and reach > 0:
            for half in ((k + 1) // 2, k // 2):
                c, i, o, u = request(half, depth + 1)
                calls, inp, outp, usable = (calls + reach * c, inp + reach * i,
                                            outp + reach * o, usable + reach * u)
        return calls, inp, outp, usable

    full, rest = divmod(n, pack)  # full requests of ``pack`` and one of the rest
    calls, inp, outp, usable = (full * a + b for a, b in zip(
        request(pack, 0), request(rest, 0) if rest else (0.0,) * 4, strict=True))
    # prompt-cache reads (``C`` a call, whatever the pack) come off the input bill
    saved = (calls * f.cached_input * (f.input_price - f.cached_price)
             if f.cached_input and f.cached_price is not None and f.input_price is not None
             else 0.0)
    cost = (None if f.input_price is None or f.output_price is None
            else inp * f.input_price + outp * f.output_price - saved)
    return Estimate(pack, mode, calls, inp, outp, cost, usable, n)


def _itemwise(f: Fit, k: int, repairs: int, replays: int, per_call: float
              ) -> tuple[float, float, float, float]:
    """(calls, input, output, usable) of k tasks accepted item by item in one allowance."""
    allowed = 1 + repairs + replays
    e = (1 - f.call_fault_rate) * (1 - f.identity_fault_rate) ** k  # k: no smaller re-ask's
    r = e * (1 - f.item_fault_rate)
    made = _attempts_while_open(k, e, f.item_fault_rate, allowed)
    repaired = max(0.0, _attempts_while_open(k, e, f.item_fault_rate, 1 + repairs) - 1)
    asked = k * _geometric(1 - r, 0, allowed)  # items asked for, over the attempts
    return (made * per_call,
            made * f.shared_input + asked * f.input_per_task + repaired * f.repair_extra_input,
            made * f.shared_output + asked * f.output_per_task,
            k * (1 - (1 - r) ** allowed))


def _attempts_while_open(k: int, e: float, p: float, allowed: int) -> float:
    """Expected attempts (at most ``allowed``) while an item is open: after ``g``
    sound returns one is with ``1 - (1 - p**g)**k``, there ``P(Binomial(allowed, e) > g) / e``."""
    if not k or allowed <= 0:
        return 0.0
    if e <= 0 or p >= 1:
        return float(allowed)
    total, below = 0.0, 0.0
    term = (1 - e) ** allowed  # P(Binomial(allowed, e) == g), from g = 0
    for g in range(min(allowed, LONGEST)):
        still = -math.expm1(k * math.log1p(-p ** g)) if g else 1.0
        if still < 1e-12:
            break
        below += term
        total += still * max(0.0, 1 - below)
        term = term * (allowed - g) / (g + 1) * e / (1 - e) if e < 1 else 0.0
    return total / e


def _finishing(options: Sequence[Estimate], max_unresolved: float) -> list[Estimate]:
    """Options expected to leave at most ``max_unresolved`` of the tasks (or half a task)."""
    return [e for e in options
            if e.tasks - e.usable <= max(0.5, max_unresolved * e.tasks)]


def choose(options: Sequence[Estimate], max_unresolved: float = 0.01) -> Estimate:
    """The lowest expected cost per usable result among options that finish (else all)."""
    def tokens(e: Estimate) -> float:  # the tie-break when every price is zero
        return (e.input_tokens + e.output_tokens) / max(e.usable, 1e-9)

    return min(_finishing(options, max_unresolved) or options,
               key=lambda e: (e.per_usable, tokens(e), e.tasks - e.usable, e.pack))


RESAMPLES = 200  # bootstrap resamples of the receipts: a few hundred, well under a second
LEVEL = 0.9  # the intervals' coverage: from the 5th to the 95th percentile of the resamples
# A resample draws at most this many receipts; past it, its spread about the fit is scaled by
# sqrt(drawn / receipts) (the m-out-of-n bootstrap), so advice on a large batch stays quick.
MOST_DRAWN = 2000


def advise(ledger: Ledger, name: str, *, repairs: int = 1, replays: int = 1,
           candidates: Sequence[int] = CANDIDATES, modes: Sequence[str] = MODES,
           max_unresolved: float = 0.01, resamples: int = RESAMPLES) -> dict[str, Any]:
    """Estimate every candidate pack size in each of ``modes`` (whole returns, with splitting,
    items accepted one by one), each with an interval from bootstrap resamples of the receipts.
    Another pack is recommended over the current one only when its interval lies wholly below
    the current pack's best mode's (among those, the cheapest: see :func:`choose`)."""
    problem = ledger.no_such_batch(name) or _unknown_modes(modes)
    if problem:
        raise InvalidBatch(problem)
    observed = Observations.read(ledger, name)
    f = observed.fit()
    if f is None:
        raise InvalidBatch(f"batch {name!r} has no judged returns yet, so there is nothing to "
                           "fit: run it (or a small pilot of it) first")
    revisions = ledger.revisions(name, current=True)
    current = (min(int(revisions[0].components.get("pack", 0)), f.tasks) or None
               if revisions else None)
    sizes = sorted({k for k in candidates if 1 <= k <= max(1, f.tasks)}
                   | ({current} if current else set())) or [1]
    options = [(k, m) for k in sizes for m in MODES if m in modes]

    def priced(g: Fit) -> list[Estimate]:
        return [estimate(g, k, mode=m, repairs=repairs, replays=replays) for k, m in options]

    point = priced(f)
    receipts = observed.receipts
    drawn = min(receipts, MOST_DRAWN)
    spread = [priced(g) for g in observed.resampled(resamples, drawn)]
    described = [{**e.as_dict(), "interval": _interval(
        e.per_usable, [row[i].per_usable for row in spread], math.sqrt(drawn / receipts))}
        for i, e in enumerate(point)]
    best = choose(point, max_unresolved)
    mine = min((e for e in point if e.pack == current), key=lambda e: e.per_usable,
               default=None)
    shown = {id(e): d for e, d in zip(point, described, strict=True)}
    surely = [e for e in _finishing(point, max_unresolved) or point
              if mine is None or _clearly_below(shown[id(e)], shown[id(mine)])]
    chosen = choose(surely, max_unresolved) if surely else mine
    assert chosen is not None  # with no current pack, every option is "surely" a choice
    ours = None if mine is None else shown[id(mine)]
    return {
        "batch": name, "tasks": f.tasks, "repairs": repairs, "replays": replays,
        "max_unresolved": max_unresolved,
        "current_pack": current, "resamples": len(spread), "level": LEVEL,
        "fit": {k: (round(v, 9) if isinstance(v, float) else v) for k, v in vars(f).items()},
        "priced": f.input_price is not None,
        "candidates": described,
        "cheapest": shown[id(best)],
        "current": ours,
        "recommended": shown[id(chosen)],
        "verdict": _verdict(shown[id(best)], shown[id(chosen)], ours),
        "warning": _warning(name, best),
    }


def _unknown_modes(modes: Sequence[str]) -> str | None:
    unknown = [m for m in modes if m not in MODES] if not isinstance(modes, str) else [modes]
    if modes and not unknown:
        return None
    return (f"advice modes must be a non-empty list of {', '.join(map(repr, MODES))}; got "
            f"{modes!r}")


def _interval(point: float, values: list[float], scale: float) -> list[float | None] | None:
    """The middle ``LEVEL`` of the resamples' values, scaled about ``point`` by ``scale``."""
    if len(values) < 2:
        return None
    ordered = sorted(values)
    tail = (1 - LEVEL) / 2
    ends = (ordered[round(tail * (len(ordered) - 1))],
            ordered[round((1 - tail) * (len(ordered) - 1))])
    if scale < 1 and math.isfinite(point):
        ends = tuple(point + (v - point) * scale for v in ends)
    return [round(v, 9) if math.isfinite(v) else None for v in ends]


def _clearly_below(option: dict[str, Any], current: dict[str, Any]) -> bool:
    """Cheaper beyond the data's uncertainty: the option's interval wholly below the current's."""
    mine, theirs = option["interval"], current["interval"]
    if option["pack"] == current["pack"] or not mine or not theirs:
        return False
    return mine[1] is not None and (theirs[0] is None or mine[1] < theirs[0])


SPELLED = {"whole": "", "split": " with split=True", "items": ' with accept="items"'}


def _verdict(cheapest: dict[str, Any], chosen: dict[str, Any],
             current: dict[str, Any] | None) -> str:
    """What the advice says, in one sentence the text and the chart share."""
    def named(option: dict[str, Any]) -> str:
        return f"pack {option['pack']}" + SPELLED[option["mode"]]

    if current is None:
        return f"{named(chosen)} has the lowest expected cost per usable result"
    if chosen["pack"] != current["pack"]:
        still = (f" ({named(cheapest)} is estimated cheaper still, less surely)"
                 if cheapest is not chosen else "")
        return (f"{named(chosen)} is cheaper per usable result than the current pack "
                f"{current['pack']}, beyond the uncertainty of the returns seen{still}")
    if cheapest["pack"] == current["pack"]:
        return f"keep {named(chosen)}: no other pack size is expected to be cheaper"
    return (f"the current pack {current['pack']} is as good as the data can tell: "
            f"{named(cheapest)} is estimated cheaper, but within the uncertainty of the "
            "returns seen (more returns narrow the intervals)")


def _warning(name: str, best: Estimate) -> str | None:
    """When even the best pack leaves most of the batch undone, no pack size is the fix."""
    if best.usable >= best.tasks / 2:
        return None
    return (f"no pack size is expected to finish this batch: the best leaves "
            f"{best.tasks - best.usable:.1f} of {best.tasks} task(s) unresolved at the fault "
            f"rates observed; read the rejected returns (batchjson receipts {name} --failed) "
            "and fix the prompt, schema or validator before choosing a size")
