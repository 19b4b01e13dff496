"""RLM hosts' subcall helpers as a batchjson provider.

Two shapes reach an RLM binding besides a batchjson provider: droste's subcall protocol
(``llm_batch_with_errors(prompts, contexts) -> (values, errors)``) and alexzhang13/rlm's
``llm_query_batched(prompts) -> list[str]``, whose failures are strings beginning ``"Error:"``.
Both become one ``complete(call)`` per request, so the replay loop, acceptance and the ledger
stay the only judges of an answer. A provider failure is a :class:`ProviderError`, never a
rejected answer.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import types
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ProviderError
from .fingerprint import fingerprint_function
from .providers.base import Call, Reply, estimate_tokens
from .tasks import sha

__all__ = ["SubcallProvider", "as_provider", "is_subcall_source"]


def is_subcall_source(target: Any) -> bool:
    """True for what :class:`SubcallProvider` adapts: not already a batchjson provider."""
    if callable(getattr(target, "complete", None)) or isinstance(target, str) or target is None:
        return False
    return callable(getattr(target, "llm_batch_with_errors", None)) or callable(target)


def as_provider(target: Any, *, context: Any = None) -> Any:
    """A batchjson provider for ``target``: providers and provider names pass through."""
    return SubcallProvider(target, context=context) if is_subcall_source(target) else target


def _budget_exhausted(exc: BaseException) -> bool:
    """droste's budget refusals: its BudgetExhausted, or a broker error coded budget_exhausted."""
    if any(cls.__name__ == "BudgetExhausted" for cls in type(exc).__mro__):
        return True
    return getattr(getattr(exc, "error", None), "code", None) == "budget_exhausted"


def _code_only(fn: types.FunctionType) -> types.FunctionType:
    """The same code with no defaults, empty closure cells and no globals: its state dropped."""
    cells = tuple(types.CellType() for _ in fn.__code__.co_freevars)
    return types.FunctionType(fn.__code__, {"__builtins__": builtins}, fn.__name__, None,
                              cells or None)


def _source_key(kind: str, target: Any) -> str:
    """Digest of the code that answers, never of its state: clients count calls and test
    doubles draw random faults, and neither may turn the same source into a new one."""
    if isinstance(target, types.MethodType):
        label = [kind, "method", target.__func__.__name__]
        digest = fingerprint_function(type(target.__self__)).digest
    elif isinstance(target, types.FunctionType):
        label = [kind, "function", target.__qualname__]
        digest = fingerprint_function(_code_only(target)).digest
    else:
        label = [kind, "object", type(target).__qualname__]
        digest = fingerprint_function(type(target)).digest
    return sha(json.dumps(["batchjson:subcalls:1", label, digest]))


class SubcallProvider:
    """A droste subcall client or an rlm ``llm_query_batched`` function, one prompt per call.

    ``context`` is a droste ``ExecutionContext`` (or anything with its ``record_subcall_*``
    methods): a client with ``bind_context`` is bound to it once and accounts for itself, as
    droste's clients do; for any other source the adapter records one attempt per call and one
    success per usable answer, as droste's protocol asks of a client.
    """

    blocking = True  # host helpers are synchronous: they run in a worker thread

    def __init__(self, target: Any, *, context: Any = None) -> None:
        if callable(getattr(target, "llm_batch_with_errors", None)):
            self.kind = "subcalls"
        elif callable(target):
            self.kind = "function"
        else:
            raise TypeError(
                f"cannot answer from a {type(target).__name__}: pass a batchjson provider, an "
                "object with llm_batch_with_errors(prompts, contexts) -> (values, errors), or a "
                "function of a list of prompts returning a list of strings")
        self.target = target
        self.context = context
        self._self_accounting = False
        bind_context = getattr(target, "bind_context", None)
        if context is not None and callable(bind_context):
            bind_context(context)
            self._self_accounting = True
        self._key = _source_key(self.kind, target)
        base = getattr(target, "__qualname__", None) or type(target).__qualname__
        self.name = f"{self.kind}:{base}"
        self.model = getattr(target, "model", None) if isinstance(
            getattr(target, "model", None), str) else base

    def source_key(self) -> str:
        """Stable across calls and processes: the wrapped object's class or function's code."""
        return self._key

    def __repr__(self) -> str:
        return f"SubcallProvider({self.name}, source={self._key[:12]})"

    async def complete(self, call: Call) -> Reply:
        prompt, context = self._message(call)
        text = await asyncio.to_thread(self._one, prompt, context)
        return Reply(text=text, input_tokens=estimate_tokens(prompt + (context or "")),
                     output_tokens=estimate_tokens(text), model=self.model)

    def _message(self, call: Call) -> tuple[str, str | None]:
        """droste's subcalls take prompt and context apart; a repair prompt already quotes both."""
        task = call.tasks[0] if call.tasks else {}
        if self.kind == "subcalls" and call.kind != "repair" and "prompt" in task:
            context = task.get("context")
            return str(task["prompt"]), None if context is None else str(context)
        return call.prompt, None

    def _one(self, prompt: str, context: str | None) -> str:
        self._record("record_subcall_attempts")
        try:
            if self.kind == "subcalls":
                text = self._from_subcalls(prompt, context)
            else:
                text = self._from_function(prompt)
        except ProviderError:
            raise
        except Exception as exc:
            if _budget_exhausted(exc):
                raise ProviderError(f"the host's subcall budget is exhausted: {exc}",
                                    retryable=False) from exc
            raise ProviderError(f"subcall failed: {type(exc).__name__}: {exc}") from exc
        if text.strip():
            self._record("record_subcall_successes")
        return text

    def _record(self, method: str) -> None:
        if self.context is None or self._self_accounting:
            return
        record = getattr(self.context, method, None)
        if callable(record):
            record(1)

    def _from_subcalls(self, prompt: str, context: str | None) -> str:
        out = self.target.llm_batch_with_errors([prompt], None if context is None else [context])
        if not (isinstance(out, Sequence) and len(out) == 2):
            raise ProviderError("subcall client returned something other than (values, errors)",
                                retryable=False)
        values, errors = out
        for error in errors or ():
            if isinstance(error, Mapping) and error.get("index", 0) == 0:
                kind = str(error.get("type") or "provider_error")
                message = str(error.get("error") or kind)
                raise ProviderError(f"subcall {kind}: {message}",
                                    retryable=kind != "budget_exhausted")
        return self._single(values)

    def _from_function(self, prompt: str) -> str:
        text = self._single(self.target([prompt]))
        if text.startswith("Error:"):  # rlm's helpers report failures as text, not answers
            raise ProviderError(f"subcall failed: {text[:500]}")
        return text

    @staticmethod
    def _single(values: Any) -> str:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(
                values) != 1:
            raise ProviderError("subcall helper must return a list with one string per prompt, "
                                f"got {type(values).__name__}", retryable=False)
        value = values[0]
        if not isinstance(value, str):
            raise ProviderError(f"subcall helper returned a {type(value).__name__}, expected a "
                                "string", retryable=False)
        return value

