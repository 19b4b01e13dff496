"""The one public description of a run. Every face builds a ``RunSpec``; ``Session.run`` runs it.

A spec is a plain, frozen record of what was asked: it holds no state of a run, so a face never
needs a private name of the core, and a new option is added in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MODES = ("items", "value")
VALIDATOR_ARGS = ("task", "index")
ON_EXHAUSTED = ("raise", "return")


@dataclass(frozen=True)
class RunSpec:
    """What to resolve and under which rules.

    - ``mode="items"``: tasks are packed ``pack`` at a time and each return is ``{"items": [...]}``
      judged for coverage and identity; ``mode="value"``: one task per call, a bare JSON value
      (droste's ``llm_batch_json`` shape).
    - ``validator_args="task"`` calls ``validator(value, task)``; ``"index"`` calls
      ``validator(value, task["index"])`` as droste does.
    - ``refuse_short_budget``: refuse before spending when the budget cannot cover one call per
      pending request (droste's helper instead spends what it has and reports the rest).
    - ``None`` for ``repairs``/``replays`` takes the session's setting.
    """

    name: str
    tasks: Sequence[Mapping[str, Any]]
    schema: Any
    validator: Callable[..., Any] | None = None
    validator_name: str | None = None
    identity: Sequence[str] | str | None = None
    pack: int = 1
    instructions: str | None = None
    repairs: int | None = None
    replays: int | None = None
    split: bool = False
    max_calls: int | None = None
    on_exhausted: str = "raise"
    progress: bool | Callable[[int, str], Any] = False  # or a face's bar: progress(total, name)
    mode: str = "items"
    validator_args: str = "task"
    refuse_short_budget: bool = True
