"""One policy decides a request's next attempt, for live calls and batch jobs alike: repairs, exact
replays, then halves (docs/design.md, "The replay loop"). A cut-off return would be cut off again,
and a validator crash or a final 4xx is never asked again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._acceptance.judge import REPAIRABLE
from .._content.tasks import Request, render_repair_prompt
from .._providers.settings import declared_output_cap
from .._sources import REFUSED, STOP_ERRORS, TRUNCATED
from .calls import first_prompt
from .plan import Plan

HALVE, NONE = "halve", "none"


@dataclass(frozen=True)
class Tried:
    """One judged, rejected attempt of a request, as either transport knows it: its kind, the
    errors that rejected it (a provider error is one), and the raw return, if one came."""

    kind: str
    errors: Sequence[Mapping[str, Any]]
    raw: str | None = None


@dataclass(frozen=True)
class Next:
    """What a request does next: an attempt (``kind``: initial, replay, repair, split; with its
    ``prompt``), :data:`HALVE` (split into halves), or :data:`NONE` (given up: ``why`` is the
    error type that ended it, or ``spent`` when its allowance is)."""

    kind: str
    prompt: str = ""
    why: str = ""


def next_attempt(plan: Plan, request: Request, chain: Sequence[Tried], *, tried: bool,
                 depth: int = 0, cut_off: bool = False) -> Next:
    """The next attempt of ``request`` after this run's ``chain`` of its rejected attempts
    (``tried``: it has earlier receipts; ``cut_off``: a return was cut off under the same
    ceiling)."""
    prompt = first_prompt(plan, request)
    halves = plan.split and len(request.tasks) > 1 and depth < plan.max_split_depth
    if not chain:
        if cut_off:  # asking again under the same limit would be cut off again
            return Next(HALVE) if halves else Next(NONE, why=TRUNCATED)
        return Next("split" if depth else "replay" if tried else "initial", prompt)
    last = chain[-1]
    errors, raw = last.errors, last.raw
    stop = next((e["type"] for e in errors if e.get("type") in STOP_ERRORS), None)
    if stop == TRUNCATED:
        return Next(HALVE) if halves else Next(NONE, why=TRUNCATED)
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


def cut_off_error(request: Request, provider: Any, earlier: bool) -> dict[str, Any]:
    """Why a request cut off at the output ceiling is not asked again (``earlier``: it was cut
    off in an earlier run), and the fix."""
    cap = declared_output_cap(provider)
    limit = (f"more than max_tokens={cap} output tokens" if cap is not None else
             "more output tokens than the provider's limit")
    before = ("an earlier return of this request was cut off at this provider's output limit; "
              if earlier else "")
    fix = ("raise max_tokens" + (", pack fewer tasks per call, or pass split=True"
                                 if len(request.tasks) > 1 else ""))
    return {"type": TRUNCATED, "task_id": None, "message": (
        f"{before}the answer needs {limit}, and asking again "
        f"under the same limit would be cut off again (not re-asked): {fix}")}
