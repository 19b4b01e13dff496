"""The exceptions a user can meet, each saying what went wrong and what to do next.

BatchJsonError                      every error batchjson raises on purpose
    InvalidBatch (ValueError)       bad input, refused before anything is spent
    ConfigError (ValueError)        a wrong setting, refused before spending
        ProviderNotConfigured       no provider is configured
        ProviderSetupError          a provider that cannot work as configured
    LedgerError                     the ledger could not be written or read
    BudgetExceeded                  more than the budget has left, refused before spending
    ValidatorChanged                a strict session refused a changed validator
    BatchUnresolved                 the replay loop ran out; carries the result
    ProviderError                   a transport or provider failure
        SubcallClientError (RuntimeError)   a host's subcall client broke droste's protocol
    NotReady                        answer["ready"] refused: requests are still unresolved
    RejectReturn (ValueError)       raised by a validator: the whole return is rejected

The bottom layer: it imports nothing of batchjson.
"""

from __future__ import annotations

from typing import Any


class BatchJsonError(Exception):
    """Base class for every error batchjson raises on purpose."""


class InvalidBatch(BatchJsonError, ValueError):
    """Bad input, refused before anything is spent or recorded."""


class ConfigError(BatchJsonError, ValueError):
    """A setting of a session, provider, price table or budget is wrong; refused before spending."""


class LedgerError(BatchJsonError):
    """The ledger could not be written or read; the run stopped before any further call.

    ``path`` is the ledger file and ``cause`` the OS or SQLite error underneath.
    """

    def __init__(self, message: str, *, path: object = None,
                 cause: BaseException | None = None) -> None:
        self.path = path
        self.cause = cause
        where = f" ({path})" if path is not None else ""
        why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"ledger{where}: {message}{why}")


class ProviderNotConfigured(ConfigError):
    """No model provider was configured; the offline model is never chosen silently."""

    def __init__(self, detail: str = "") -> None:
        lead = (f"{detail} Configure a provider one of three ways: " if detail else
                "No model provider is configured. Configure one of three ways: ")
        super().__init__(
            f"{lead}"
            "(1) Session(provider='openai' | 'anthropic' | 'simulated' or a provider object); "
            "(2) in a notebook, %config BatchJson.provider = 'openai' (or an object name); "
            "(3) set BATCHJSON_PROVIDER=openai|anthropic|simulated in the environment."
        )


class ProviderSetupError(ConfigError):
    """A provider was chosen but cannot work as configured (no key, no model, a bad URL or
    setting); the message names the setting and the fix, and never echoes a secret."""


class BudgetExceeded(BatchJsonError):
    """The calls needed exceed what the budget has left; raised before spending.

    ``one_call`` is set when a cost budget refused: the most one call may cost (USD), more
    than the budget has left."""

    def __init__(self, needed: int, remaining: int, *, what: str = "calls",
                 message: str | None = None, one_call: float | None = None) -> None:
        self.needed = needed
        self.remaining = remaining
        self.one_call = one_call
        super().__init__(message or (
            f"budget refused: at least {needed} {what} are needed to resolve the outstanding "
            f"requests but only {remaining} remain. Raise max_calls or the session budget, or "
            "run fewer tasks; nothing was spent."))


class ValidatorChanged(BatchJsonError):
    """A strict session refused a changed validator while evidence under the old one is open."""

    def __init__(self, name: str, old: str, new: str, changes: list[str], unresolved: int) -> None:
        self.name = name
        self.old_fingerprint = old
        self.new_fingerprint = new
        self.changes = changes
        what = "; ".join(changes) if changes else "its content fingerprint"
        reads = " (or the file it reads)" if any("file " in c for c in changes) else ""
        super().__init__(
            f"validator {name!r} changed ({what}; {old[:12]} -> {new[:12]}) while {unresolved} "
            "request(s) recorded under the old version are unresolved, and this session is strict. "
            f"Restore the previous definition{reads} and re-run to resolve them, or register "
            f"the new logic under another name (validator(fn, name='{name}_v2'), or rename the "
            "function).")


class BatchUnresolved(BatchJsonError):
    """The bounded replay loop ran out of repairs, replays or budget; carries the result.

    ``hint`` is a face's advice when it has already shown the result (the magic names the
    variable holding it); the error then stays short. In IPython the error shows as its report,
    without a traceback through the event loop.
    """

    def __init__(self, result: Any, hint: str | None = None) -> None:  # a BatchResult
        self.result = result
        self.hint = hint
        super().__init__(result.failure_report())

    def _render_traceback_(self) -> list[str]:
        report = self.result.failure_report().splitlines() or [""]
        if self.hint:  # the face has shown the result: its headline, the way on, its last word
            return [f"BatchUnresolved: {report[0]}", self.hint,
                    *(report[-1:] if len(report) > 1 else [])]
        return [f"BatchUnresolved: {report[0]}", *report[1:]]


class ProviderError(BatchJsonError):
    """A transport or provider failure: recorded as provider_error, never as a repair.

    ``kind`` is the answer source's own name for the failure when it gives one (a droste
    subcall client's error type, ``budget_exhausted`` for its BudgetExhausted); the droste
    contract reports it as the prompt's error type.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = True,
        retry_after: float | None = None,
        usage: dict[str, Any] | None = None,
        unreachable: bool = False,
        kind: str = "provider_error",
        fatal: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        # The endpoint itself cannot be reached (connection refused, DNS): after the transport
        # retries of one call the whole run stops, since no other request could get through.
        self.unreachable = unreachable
        self.retry_after = retry_after
        self.usage = usage or {}
        self.kind = kind
        # The answer source itself is broken: the run opens no further call and raises this
        # error once its calls have unwound (each call made is recorded first).
        self.fatal = fatal


class SubcallClientError(ProviderError, RuntimeError):
    """A host's subcall client broke droste's protocol (error indices that are not indices of
    the batch, a wrong number of results, values that are not text): the call fails loudly, as
    droste's own helper does (a ``RuntimeError`` for droste callers), after recording the
    calls it made. Fix the client; nothing it returned was accepted."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False, fatal=True)


class NotReady(BatchJsonError):
    """``answer["ready"] = True`` was refused: structured requests are still unresolved.

    ``owed`` is ``finalization_check()`` at the moment of refusal.
    """

    def __init__(self, owed: list[dict[str, Any]]) -> None:
        self.owed = owed
        first = owed[0] if owed else {}
        super().__init__(
            f"answer['ready'] = True refused: {len(owed)} structured request(s) are unresolved "
            f"(first: batch {first.get('batch')!r}, prompts {first.get('prompts')!r}, last "
            f"error {first.get('last_error')!r}). Replay the exact call that failed (same "
            "prompts, schema and validator object) in a bounded loop inside one cell, then set "
            "ready again; finalization_check() lists what is unresolved and batch_status() what "
            "it costs. If the budget cannot clear it, keep answer['ready'] False and say in "
            "answer['content'] what is unresolved.")


class RejectReturn(BatchJsonError, ValueError):
    """Raised by a validator to reject the whole return, not only its item: under
    ``accept="items"`` a content fault across items under correct ids (every answer shifted by
    one) must not commit the pack-mates. Under whole-return acceptance it rejects as a
    ``ValueError`` does."""
