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
    """The ledger (``path``) could not be written or read (``cause``: the OS or database error);
    the run stopped before any further call."""

    def __init__(self, message: str, *, path: object = None,
                 cause: BaseException | None = None) -> None:
        self.path, self.cause = path, cause
        where = f" ({path})" if path is not None else ""
        why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"ledger{where}: {message}{why}")


class ProviderNotConfigured(ConfigError):
    """No model provider was configured; the offline model is never chosen silently."""

    def __init__(self, detail: str = "") -> None:
        lead = (f"{detail} Configure a provider one of three ways: " if detail else
                "No model provider is configured. Configure one of three ways: ")
        super().__init__(
            f"{lead}(1) Session(provider='openai' | 'anthropic' | 'simulated' or a provider "
            "object); (2) in a notebook, %config BatchJson.provider = 'openai' (or an object "
            "name); (3) set BATCHJSON_PROVIDER=openai|anthropic|simulated in the environment.")


class ProviderSetupError(ConfigError):
    """A provider cannot work as configured (no key, a bad URL): names the setting and the fix."""


class BudgetExceeded(BatchJsonError):
    """The calls needed exceed what the budget has left; raised before spending. ``one_call``:
    the most one call may cost (USD), when a cost budget refused."""

    def __init__(self, needed: int, remaining: int, *, message: str | None = None,
                 one_call: float | None = None) -> None:
        self.needed, self.remaining, self.one_call = needed, remaining, one_call
        super().__init__(message or (
            f"budget refused: at least {needed} calls are needed to resolve the outstanding "
            f"requests but only {remaining} remain. Raise max_calls or the session budget, or "
            "run fewer tasks; nothing was spent."))


class ValidatorChanged(BatchJsonError):
    """A strict session refused a changed validator while evidence under the old one is open."""

    def __init__(self, name: str, old: str, new: str, changes: list[str], unresolved: int) -> None:
        self.name, self.old_fingerprint, self.new_fingerprint = name, old, new
        self.changes = changes
        what = "; ".join(changes) if changes else "its content fingerprint"
        reads = " (or the file it reads)" if any("file " in c for c in changes) else ""
        # a cell re-run makes its own objects anew: compared by identity, each run "changed"
        self.made_anew = (" An object compared by identity (a connection, a client) that the "
                          "cell makes is new on every run: make it once, in a cell that is not "
                          "re-run." if any("(compared by identity)" in c for c in changes)
                          else "")
        super().__init__(
            f"validator {name!r} changed ({what}; {old[:12]} -> {new[:12]}) while {unresolved} "
            "request(s) recorded under the old version are unresolved, and this session is strict. "
            f"Restore the previous definition{reads} and re-run to resolve them, or register "
            f"the new logic under another name (validator(fn, name='{name}_v2'), or rename the "
            f"function).{self.made_anew}")


class BatchUnresolved(BatchJsonError):
    """The bounded replay loop ran out of repairs, replays or budget; carries the result. IPython
    shows its report, no traceback; short, with ``hint``, when a face has shown the result."""

    def __init__(self, result: Any, hint: str | None = None) -> None:  # a BatchResult
        self.result, self.hint = result, hint
        super().__init__(result.failure_report())

    def _render_traceback_(self) -> list[str]:
        head, *rest = self.result.failure_report().splitlines() or [""]
        # with a hint the face has shown the result: its headline, the way on, its last word
        return [f"BatchUnresolved: {head}", *([self.hint, *rest[-1:]] if self.hint else rest)]


class ProviderError(BatchJsonError):
    """A transport or provider failure: recorded as provider_error, never as a repair.
    ``unreachable``: no server at the endpoint (refused, DNS), so the whole run stops; ``fatal``:
    the answer source is broken, so no further call, raised once the calls made unwound;
    ``kind``: the answer source's own name for it (a droste client's error type);
    ``never_ran``: the provider says its model never ran the request (a batch job that expired,
    was cancelled or failed before it)."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = True,
                 retry_after: float | None = None, usage: dict[str, Any] | None = None,
                 unreachable: bool = False, kind: str = "provider_error",
                 fatal: bool = False, never_ran: bool = False) -> None:
        super().__init__(message)
        self.status, self.retryable, self.retry_after = status, retryable, retry_after
        self.unreachable, self.fatal, self.usage, self.kind = unreachable, fatal, usage or {}, kind
        self.never_ran = never_ran

    @property
    def refused(self) -> bool:
        """The provider answered 4xx: it refused the request itself, so it did no work."""
        return self.status is not None and 400 <= self.status < 500


class SubcallClientError(ProviderError, RuntimeError):
    """A host's subcall client broke droste's protocol (bad indices or results): fails loudly, a
    ``RuntimeError`` as in droste, once its calls are recorded; nothing it returned is accepted."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False, fatal=True)


class NotReady(BatchJsonError):
    """``answer["ready"] = True`` was refused: structured requests (``owed``) are unresolved."""

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
    ``accept="items"``, a fault across items (every answer shifted by one) commits no pack-mate."""
