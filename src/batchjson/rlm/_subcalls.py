"""RLM hosts' subcall helpers as a batchjson provider: droste's ``llm_batch_with_errors`` and rlm's
``llm_query_batched`` become one ``complete(call)`` per request, so acceptance and the ledger stay
the only judges; calls waiting together go as one batch. A failure is a ProviderError; a client
breaking droste's protocol fails loudly (:class:`SubcallClientError`)."""

from __future__ import annotations

import asyncio
import builtins
import functools
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import Call, ConfigError, ProviderError, Reply, SubcallClientError
from ..core import Code, Hashed, estimate_tokens, render_value_prompt, source_text


def is_subcall_source(target: Any) -> bool:
    """True for what :class:`SubcallProvider` adapts: not already a batchjson provider."""
    if callable(getattr(target, "complete", None)) or isinstance(target, str) or target is None:
        return False
    return callable(getattr(target, "llm_batch_with_errors", None)) or callable(target)


def is_droste_client(target: Any) -> bool:
    """An object with droste's subcall protocol (``llm_batch_with_errors``), not a provider."""
    return is_subcall_source(target) and callable(getattr(target, "llm_batch_with_errors", None))


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


def _source_key(kind: str, target: Any) -> Hashed:
    """The code that answers, never its state: clients count calls and test doubles draw
    random faults, and neither may turn the same source into a new one."""
    if isinstance(target, functools.partial):  # the function it calls, not its arguments
        return Hashed(["batchjson:subcalls:1", [kind, "partial"], _source_key(kind, target.func)])
    if isinstance(target, types.MethodType):
        label, code = [kind, "method", target.__func__.__name__], type(target.__self__)
    elif isinstance(target, types.FunctionType):
        label, code = [kind, "function", target.__qualname__], _code_only(target)
    else:
        label, code = [kind, "object", type(target).__qualname__], type(target)
    return Hashed(["batchjson:subcalls:1", label, Code(code, length=None, whole=False)])


class SubcallProvider:
    """A droste subcall client or rlm's ``llm_query_batched``, one prompt per call. A droste
    ``context`` is bound to a client with ``bind_context``; else this adapter records into it."""

    def __init__(self, target: Any, *, context: Any = None) -> None:
        # droste's client protocol, or rlm's function of a list of prompts
        self.kind = "subcalls" if is_droste_client(target) else "function"
        self.target = target
        self._accounted = context  # the context this adapter records subcalls into, if any
        bind_context = getattr(target, "bind_context", None)
        if context is not None and callable(bind_context):
            try:
                bind_context(context)
            except Exception as exc:
                raise ConfigError(f"the subcall client's bind_context(context) failed: "
                                  f"{type(exc).__name__}: {exc}. Pass the droste "
                                  "ExecutionContext the client was made for, or no context="
                                  ) from exc
            self._accounted = None  # the client accounts for itself
        self._key = _source_key(self.kind, target)
        self._digest = source_text((self._key,))
        self._lock = threading.Lock()  # one call of the helper at a time, as droste makes them
        self._queues: dict[asyncio.AbstractEventLoop, _Queue] = {}
        base = getattr(target, "__qualname__", None) or type(target).__qualname__
        self.name = f"{self.kind}:{base}"
        self.model = getattr(target, "model", None) if isinstance(
            getattr(target, "model", None), str) else base

    def retarget(self, target: Any) -> None:
        """Answer through ``target``, a new object of the same source (rlm makes one a
        completion)."""
        if target == self.target:  # bound methods of one object compare equal
            return
        if source_text((_source_key(self.kind, target),)) != self._digest:  # its code's own
            raise ConfigError(f"cannot answer through {target!r}: it is another answer source "
                              f"than {self.target!r}; a ledger's evidence is kept per source")
        with self._lock:
            self.target = target

    def source_key(self) -> tuple[Hashed]:
        """Stable across calls and processes: the wrapped object's class or function's code."""
        return (self._key,)

    def __repr__(self) -> str:
        return f"SubcallProvider({self.name}, source={self._digest[:12]})"

    async def complete(self, call: Call) -> Reply:
        """Queue this prompt for the next batch: calls waiting while a batch is out go together in
        one ``llm_batch_with_errors``, and the helper is never called from two threads at once."""
        prompt, context = self._message(call)
        loop = asyncio.get_running_loop()
        queue = self._queues.setdefault(loop, _Queue())
        future: asyncio.Future[str] = loop.create_future()
        queue.waiting.append((prompt, context, future))
        if queue.task is None or queue.task.done():
            queue.task = loop.create_task(self._drain(loop, queue))
        text = await future
        return Reply(text=text, input_tokens=estimate_tokens(prompt + (context or "")),
                     output_tokens=estimate_tokens(text), model=self.model)

    async def _drain(self, loop: asyncio.AbstractEventLoop, queue: _Queue) -> None:
        try:
            await asyncio.sleep(0)  # workers ready on this turn of the loop join the first batch
            while queue.waiting:
                batch, queue.waiting = queue.waiting, []
                for group in _by_context(batch):
                    outcomes = await asyncio.to_thread(self._batch, [p for p, _, _ in group],
                                                       [c for _, c, _ in group])
                    for (_, _, future), outcome in zip(group, outcomes, strict=True):
                        if future.done():  # its worker was cancelled
                            continue
                        if isinstance(outcome, BaseException):
                            future.set_exception(outcome)
                        else:
                            future.set_result(outcome)
        except BaseException as exc:  # never leave a worker waiting on a dead drain
            for _, _, future in queue.waiting:
                if not future.done():
                    future.set_exception(ProviderError(f"subcall batch failed: {exc}"))
            raise
        finally:
            if self._queues.get(loop) is queue and not queue.waiting:
                del self._queues[loop]

    def _message(self, call: Call) -> tuple[str, str | None]:
        """droste's subcalls take prompt and context apart, repairs too, as droste sends them;
        a plain helper takes one text, so the context is quoted in it."""
        task = call.tasks[0] if call.tasks else {}
        if self.kind != "subcalls" or not isinstance(task.get("prompt"), str):
            return call.prompt, None
        context = task.get("context")
        if context is None:
            return (task["prompt"] if call.kind != "repair" else call.prompt), None
        if call.kind != "repair":
            return task["prompt"], str(context)
        quoted = render_value_prompt(task)  # a repair prompt begins with the prompt it repairs
        if call.prompt.startswith(quoted):
            return task["prompt"] + call.prompt[len(quoted):], str(context)
        return call.prompt, None

    def _batch(self, prompts: list[str], contexts: list[str | None]) -> list[str | Exception]:
        """One call of the host's helper; each prompt gets its text or its ProviderError."""
        with self._lock:
            self._record("record_subcall_attempts", len(prompts))
            try:
                if self.kind == "subcalls":
                    given = None if contexts[0] is None else [str(c) for c in contexts]
                    outcomes = self._from_subcalls(prompts, given)
                else:
                    outcomes = self._from_function(prompts)
            except ProviderError as exc:
                outcomes = [exc] * len(prompts)
            except Exception as exc:
                if _budget_exhausted(exc):
                    error = ProviderError(f"the host's subcall budget is exhausted: {exc}",
                                          retryable=False, kind="budget_exhausted")
                else:
                    error = ProviderError(f"subcall failed: {type(exc).__name__}: {exc}")
                outcomes = [error] * len(prompts)
            usable = sum(1 for o in outcomes if isinstance(o, str) and o.strip())
            if usable:
                self._record("record_subcall_successes", usable)
            return outcomes

    def _record(self, method: str, count: int) -> None:
        record = getattr(self._accounted, method, None)
        if callable(record):
            record(count)

    def _from_subcalls(self, prompts: list[str],
                       contexts: list[str] | None) -> list[str | Exception]:
        """droste's protocol, kept as droste keeps it: a client that breaks it fails the call
        loudly (SubcallClientError) instead of passing as one more provider error."""
        out = self.target.llm_batch_with_errors(prompts, contexts)
        if isinstance(out, (str, bytes)) or not (isinstance(out, Sequence) and len(out) == 2):
            raise SubcallClientError(f"the subcall client returned a {type(out).__name__} "
                                     "from llm_batch_with_errors, not (values, errors)")
        values, errors = out
        failed = _batch_errors(errors, len(prompts))
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(
                values) != len(prompts):
            count = len(values) if isinstance(values, Sequence) else type(values).__name__
            raise SubcallClientError(f"the subcall client returned {count} value(s) for "
                                     f"{len(prompts)} prompt(s); it must return one per prompt")
        outcomes: list[str | Exception] = []
        for index, value in enumerate(values):
            error = failed.get(index)
            if error is not None:  # its value is ignored, as droste ignores it
                kind = str(error.get("type") or "provider_error")
                message = str(error.get("error") or kind)
                outcomes.append(ProviderError(f"subcall {kind}: {message}",
                                              retryable=kind != "budget_exhausted", kind=kind))
            elif isinstance(value, str):
                outcomes.append(value)
            else:
                raise SubcallClientError(f"the subcall client returned a "
                                         f"{type(value).__name__} as value {index} with no "
                                         "batch error for it; values must be text")
        return outcomes

    def _from_function(self, prompts: list[str]) -> list[str | Exception]:
        """rlm's helpers report failures as text, "Error: ..." (any case, after spaces): such a
        string is never an answer, as no JSON value starts so."""
        values = self.target(prompts)
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ProviderError("subcall helper must return a list with one string per prompt, "
                                f"got {type(values).__name__}", retryable=False)
        if len(values) != len(prompts):
            raise ProviderError(f"subcall helper returned {len(values)} results for "
                                f"{len(prompts)} prompt(s)", retryable=False)
        wrong = [value for value in values if not isinstance(value, str)]
        if wrong:
            raise ProviderError(f"subcall helper returned a {type(wrong[0]).__name__}, expected a "
                                "string", retryable=False)
        return [ProviderError(f"subcall failed: {text.strip()[:500]}")
                if text.lstrip()[:6].lower() == "error:" else text for text in values]


def _batch_errors(errors: Any, count: int) -> dict[int, Mapping[str, Any]]:
    """A droste client's errors by index; anything but one object per distinct index is broken."""
    if errors is None:
        return {}
    if isinstance(errors, (str, bytes, Mapping)) or not isinstance(errors, Sequence):
        raise SubcallClientError(f"the subcall client returned a {type(errors).__name__} as its "
                                 "batch errors, not a list of {'index', 'type', 'error'} objects")
    failed: dict[int, Mapping[str, Any]] = {}
    for error in errors:
        index = error.get("index") if isinstance(error, Mapping) else None
        broken = ("a non-object batch error" if not isinstance(error, Mapping) else
                  "a batch error with an invalid index" if not isinstance(index, int)
                  or isinstance(index, bool) else
                  f"a batch error index out of range (0..{count - 1})" if not 0 <= index < count
                  else None)
        if broken:
            raise SubcallClientError(f"the subcall client returned {broken}: {error!r}"[:300])
        if index in failed:
            raise SubcallClientError(f"the subcall client returned duplicate batch error "
                                     f"indices: {index} twice")
        failed[index] = error
    return failed


@dataclass
class _Queue:
    """Prompts waiting for the next batch on one event loop."""

    waiting: list[tuple[str, str | None, asyncio.Future[str]]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None  # the drain: held so it is not collected


def _by_context(batch: list[Any]) -> list[list[Any]]:
    """droste takes contexts for all prompts of a batch or for none."""
    with_context = [item for item in batch if item[1] is not None]
    without = [item for item in batch if item[1] is None]
    return [group for group in (with_context, without) if group]

