"""The caller's validator, run so that it can only say yes, no (repairable), or that it is broken
(a ``validator_error``, never retried; docs/design.md, "The commit boundary", step 5)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from .._canon import canonical_json
from .._errors import RejectReturn
from .._secrets import keys_masked


async def run_validator_async(validator: Callable[[Any, Mapping[str, Any]], Any], value: Any,
                              task: Mapping[str, Any], task_id: str) -> list[dict[str, Any]]:
    """ValueError, AssertionError or ``False`` rejects; any other exception is a crash; only
    ``None``, ``True`` (``numpy.bool_``) or the item accepts. It gets its own copy of the task."""
    try:
        out = validator(value, json.loads(canonical_json(dict(task))))  # its own copy
        if inspect.isawaitable(out):
            out = await out
        verdict = _returned(out, value)
    except CountedAsCrash as exc:  # a contract that counts what was raised as a crash
        return [crashed(exc.__cause__ or exc, task_id)]
    except RejectReturn as exc:  # about the whole return: no task of it is committed
        return [error("validation", f"the validator rejected the whole return at task "
                      f"{task_id!r}: {said(exc)}")]
    except ValueError as exc:
        return [error("validation", f"task {task_id!r}: {said(exc)}", task_id)]
    except AssertionError as exc:  # pydantic's rule too: a failed assert rejects the item
        return [error("validation", f"task {task_id!r}: {_assertion(exc)}", task_id)]
    except BaseException as exc:  # a bug in the caller's validator, reported not retried
        if not judged_code_raised(exc):
            raise
        return [crashed(exc, task_id, _model_hint(exc, value))]
    if verdict is False:
        return [error("validation", f"task {task_id!r}: the validator returned False", task_id)]
    if verdict is None:
        return [error("validator_error", f"task {task_id!r}: the validator returned "
                       f"{clip(out, 80)} ({type(out).__name__}); return None or True to accept, "
                       "False (or raise ValueError) to reject: its return value is never used "
                       "as the item", task_id)]
    return []


def crashed(exc: BaseException, task_id: str, hint: str = "") -> dict[str, Any]:
    """A ``validator_error`` naming what the validator raised, with its own frames."""
    frames = validator_frames(exc)
    return error("validator_error", keys_masked(f"task {task_id!r}: validator raised "
                                                f"{type(exc).__name__}: {said(exc)}{hint}"),
                 task_id, **({"traceback": frames} if frames else {}))


def said(exc: BaseException) -> str:
    """What ``exc`` says, or that its own ``__str__`` raised (the validator's bug)."""
    try:
        return str(exc)
    except Exception as failure:  # noqa: BLE001 - any bug in the caller's __str__
        return f"<its __str__ raised {clip(failure)}>"


_OWN_CODE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
FRAMES_SHOWN, TRACEBACK_CHARS = 8, 2000


def validator_frames(exc: BaseException) -> str:
    """The innermost ``FRAMES_SHOWN`` frames of ``exc`` in the caller's code, keys masked."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not os.path.realpath(f.filename).startswith(_OWN_CODE)]
    hidden = max(0, len(frames) - FRAMES_SHOWN)
    lines = [f"... {hidden} earlier frame(s)"] if hidden else []
    for frame in frames[hidden:]:
        lines.append(f'File "{frame.filename}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"  {frame.line.strip()[:200]}")
    return keys_masked("\n".join(lines))[-TRACEBACK_CHARS:]


class CountedAsCrash(Exception):
    """Raised from a validator's exception by a wrapper whose contract counts it a crash."""


def droste_verdicts(fn: Callable[[Any, int], Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    """``fn(value, index)`` judged as droste 0.26 does: only ``ValueError`` rejects, a failed
    ``assert`` is a ``validator_error``, what it returns is ignored; an ``async def`` awaited."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        try:
            out = fn(value, task["index"])
        except AssertionError as exc:
            raise CountedAsCrash() from exc
        return _awaited_ignoring(out) if inspect.isawaitable(out) else None

    return check


async def _awaited_ignoring(out: Any) -> None:
    try:
        await out
    except AssertionError as exc:
        raise CountedAsCrash() from exc


def _assertion(exc: AssertionError) -> str:
    """An assert's own message, else the failing ``assert`` line (for the repair prompt)."""
    if message := said(exc):
        return message
    frames = traceback.extract_tb(exc.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    return f"{line} failed" if line.startswith("assert") else "an assert in the validator failed"


def _model_hint(exc: BaseException, value: Any) -> str:
    """Why ``item["field"]`` fails when a pydantic schema hands the validator a model."""
    fields = getattr(type(value), "model_fields", None)
    if not isinstance(exc, TypeError) or not fields or "subscriptable" not in str(exc):
        return ""
    name = next(iter(fields), "field")
    return (f" (with a pydantic schema the validator gets a {type(value).__name__} instance, "
            f"not a dict: read item.{name}, not item[{name!r}])")


def _returned(out: Any, value: Any) -> bool | None:
    """What a validator's return says: True accepts, False rejects, None is no answer."""
    if out is None or out is True or out is value:
        return True
    if out is False:
        return False
    kind = type(out)
    if kind.__name__ in ("bool_", "bool") and kind.__module__.split(".")[0] in _BOOL_LIKE:
        return bool(out)
    return None


_BOOL_LIKE = frozenset({"numpy", "jax", "torch", "cupy"})


def judged_code_raised(exc: BaseException) -> bool:
    """Whether an exception out of judged code is its own doing (a ``validator_error``), not the
    run being stopped: this task cancelled, or Ctrl-C (which lands on the main thread)."""
    if isinstance(exc, asyncio.CancelledError):
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        return current is not None and not current.cancelling()
    if isinstance(exc, KeyboardInterrupt):
        return threading.current_thread() is not threading.main_thread()
    return True


MESSAGE_CHARS = 2000


def error(kind: str, message: str, task_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """One error of a verdict, as receipts keep it; its message, stored, shown and sent in a
    paid repair prompt, capped at ``MESSAGE_CHARS``, saying how much was cut."""
    if len(message) > MESSAGE_CHARS:
        message = (f"{message[:MESSAGE_CHARS]}... ({len(message) - MESSAGE_CHARS:,} more "
                   "characters cut)")
    return {"type": kind, "task_id": task_id, "message": message, **extra}


def clip(value: Any, limit: int = 200) -> str:
    """A short repr for a message; one whose repr fails (or recurses) is named by its type."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - RecursionError included
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."
