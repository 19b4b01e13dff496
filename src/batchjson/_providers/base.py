"""The provider contract: one call in, raw text and usage out (a :class:`~.reply.Reply`).

A call's size as providers count it, and its prompt cache: a provider caches a prefix only past a
model-dependent length and only if every byte before it is identical, so when a batch's shared
part is long enough (:func:`prefix_cacheable`) the wire schema is sent batch-constant instead of
pinning each request's identity values (acceptance checks them either way)."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .._checks import positive_seconds, whole
from .._errors import ProviderError, ProviderSetupError
from .._secrets import check_name
from .._sources import Code
from .reply import Reply

# why a request is asked: its first ask, a repair of a rejected return, or a replay of one never
# answered; the receipt's ``kind`` column holds the same words
CallKind = Literal["initial", "repair", "replay"]


@dataclass(frozen=True)
class Call:
    """Everything a provider needs for one request attempt. ``mode``: ``"items"`` (return
    ``{"items": [...]}``, one object per task) or ``"value"`` (one bare JSON value). ``shared``: the
    head of ``prompt`` every request of the batch starts with, which a provider may mark for its
    cache. ``answer_chars``: the most characters its answer can take (None: unbounded or not
    known), from which a provider sizes its output ceiling when the user set none."""

    tasks: tuple[Mapping[str, Any], ...]
    prompt: str
    system: str
    schema: Mapping[str, Any]
    attempt: int
    kind: CallKind
    request_key: str
    mode: Literal["items", "value"] = "items"
    identity: tuple[str, ...] = ("task_id",)
    shared: str = ""
    answer_chars: int | None = None


@runtime_checkable
class Provider(Protocol):
    """Anything with an async ``complete(call) -> Reply``."""

    name: str

    async def complete(self, call: Call) -> Reply: ...


async def close_provider(provider: Any) -> None:
    """Close a provider's pooled resources if it holds any."""
    closer = getattr(provider, "aclose", None)
    if closer is not None:
        await closer()


def estimate_tokens(text: str) -> int:
    """A quarter of the text's characters: the simulated model's count and the labelled cost floor
    of a call of unknown usage. Never a bound (CJK, emoji), never recorded as a provider's usage."""
    return max(1, len(text) // 4)


# The documented fixed overhead of a chat call, for a provider that says nothing of its own:
# OpenAI's count for chat models, 3 tokens framing each message (system, user) and 3 priming
# the reply.
CHAT_OVERHEAD_TOKENS = 3 * 2 + 3


def input_bound(provider: Any, call: Call) -> int:
    """A sound upper bound on the input tokens ``call`` is billed for, which a cost budget reserves:
    the provider's own ``input_bound(call)``, else the UTF-8 bytes of system text, prompt and schema
    plus :data:`CHAT_OVERHEAD_TOKENS`. A byte-level BPE never makes more tokens than bytes, so CJK
    and emoji are never undercounted."""
    own = getattr(provider, "input_bound", None)
    if callable(own):
        return int(own(call))
    schema = json.dumps(call.schema, ensure_ascii=False, separators=(",", ":"), default=str)
    return (utf8_length(call.system) + utf8_length(call.prompt) + utf8_length(schema)
            + CHAT_OVERHEAD_TOKENS)


def utf8_length(text: str) -> int:
    """Bytes of ``text`` as UTF-8 (a lone surrogate, which nothing sends as is, counts 3)."""
    return len(text.encode("utf-8", "surrogatepass"))


class OneService:
    """A provider is one service (a pool, counters, a lock), so deep-copying one gives it back:
    ``%config BatchJson.provider = model`` deep-copies its value and must keep ``model`` itself."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


class ProviderHandle(OneService):
    """Holds a provider object of your own for ``%config BatchJson.provider = ProviderHandle(obj)``:
    IPython's config deep-copies what it is given; the handle is never copied."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def __repr__(self) -> str:
        return f"ProviderHandle({self.provider!r})"


class CallableProvider(OneService):
    """Wrap ``fn(call) -> str | Reply`` (sync or async) as a provider, for tests and glue code.

    A ``str`` leaves the call's usage unknown (a cost budget keeps its worst case); a ``Reply(text,
    input_tokens=..., output_tokens=...)`` or ``cost=`` settles it. The answer source is the
    function's content fingerprint, or ``source="my-model-v2"``. ``fn.blocking = True`` runs ``fn``
    in a daemon thread, so a call hung past the timeout never holds the run."""

    name = "callable"

    def __init__(self, fn: Any, *, model: str | None = None, source: str | None = None,
                 timeout: float | None = None, price: Any = None,
                 max_tokens: int | None = None) -> None:
        if not callable(fn):
            raise ProviderSetupError(f"CallableProvider needs a callable fn(call) -> str or "
                                     f"Reply; got {type(fn).__name__}")
        fix = "name the model or source in plain words; keys belong in the function's client"
        self.fn = fn
        self._named_model = check_name(model, "CallableProvider model", fix)
        self.model = self._named_model or getattr(fn, "__name__", "callable")
        if source is not None and (not isinstance(source, str) or not source.strip()):
            raise ProviderSetupError("CallableProvider source must be a non-empty string naming "
                                     "what answers (e.g. source='my-model-v2')")
        self.source = check_name(source, "CallableProvider source", fix)
        if timeout is not None:
            self.timeout = positive_seconds("CallableProvider timeout", timeout,
                                            ProviderSetupError)
            self.enforces_timeout = True
        self._code = Code(fn, owner="CallableProvider")  # keyed by content (see _sources)
        from .pricing import as_price  # the price table imports errors only; kept local

        self.price = None if price is None else as_price(price)
        # The output ceiling a cost budget reserves for each call: a whole number of tokens.
        self.max_tokens = (None if max_tokens is None else
                           whole("CallableProvider max_tokens", max_tokens, 1, ProviderSetupError))

    def price_for_budget(self) -> Any:
        """USD per million tokens for cost budgets (``price=``), or None: unpriced."""
        return self.price

    def source_key(self) -> str | tuple[Any, ...]:
        """The named source, else the function by content (code, constants, what it reads):
        the same function in another process gives the same key, a changed one another."""
        if self.source is not None:
            return f"callable:{self.source}"
        head = f"callable:{self._named_model}" if self._named_model else "callable"
        return (f"{head}#", self._code)

    async def complete(self, call: Call) -> Reply:
        timeout = getattr(self, "timeout", None)
        if timeout is None:
            out = await self._invoke(call)
        else:
            try:
                async with asyncio.timeout(timeout):
                    out = await self._invoke(call)
            except TimeoutError:
                raise ProviderError(f"callable provider: no answer within the {timeout:g}s "
                                    "timeout", retryable=True) from None
        if isinstance(out, Reply):
            return out
        if not isinstance(out, str):
            raise ProviderError(
                f"callable provider returned {type(out).__name__}, expected str or Reply",
                retryable=False,
            )
        # A bare text says nothing of what the call was billed: its usage stays unknown, never
        # an estimate passed off as usage.
        return Reply(text=out, model=self.model)

    async def _invoke(self, call: Call) -> Any:
        blocking = getattr(self.fn, "blocking", False)  # fn.blocking = True: a worker thread
        out = await in_thread(self.fn, call) if blocking else self.fn(call)
        if inspect.isawaitable(out):  # async functions and objects with an async __call__
            out = await out
        return out


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a daemon thread of its own; cancellation returns at once. Not
    ``asyncio.to_thread``: the loop's default executor is joined when the loop closes, so a hung
    call would hold the whole run. The abandoned thread's result is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():  # cancelled by a timeout or an interrupt: nobody is waiting
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def work() -> None:
        try:
            outcome = (True, fn(*args))
        except Exception as exc:  # handed to the awaiting coroutine
            outcome = (False, exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a worker: report, not hang
            outcome = (False, ProviderError(f"blocking provider raised {type(exc).__name__}",
                                            retryable=False))
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop is closed: the run ended long ago
            pass

    name = getattr(fn, "__name__", type(fn).__name__)
    threading.Thread(target=work, name=f"batchjson-blocking-{name}", daemon=True).start()
    return await future


# Anthropic's minimum cacheable prompt, in tokens, by model family (longest prefix first);
# a shorter prefix marked with cache_control is simply not cached. Unlisted models are taken
# at the largest minimum, so a newer model never gets the constant schema without its cache.
ANTHROPIC_CACHE_MINIMUM: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096), ("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
    ("claude-sonnet-4-5", 1024), ("claude-opus-4-1", 1024), ("claude-opus-4", 1024),
    ("claude-sonnet-4", 1024), ("claude-3-7-sonnet", 1024),
)
ANTHROPIC_UNLISTED_MINIMUM = 4096
OPENAI_CACHE_MINIMUM = 1024  # automatic prompt caching, from 1,024 tokens of identical prefix
CACHE_CONTROL = {"type": "ephemeral"}  # the 5-minute cache (writes 1.25x input, reads 0.1x)


def cache_minimum(provider: Any) -> int | None:
    """The fewest prefix tokens ``provider``'s API caches, or None when it has no prompt
    cache batchjson knows of (a callable, the simulated model)."""
    provider = getattr(provider, "inner", provider)  # a run's guard around the real one
    name, model = getattr(provider, "name", None), str(getattr(provider, "model", "") or "")
    if name == "openai":
        return OPENAI_CACHE_MINIMUM
    if name == "anthropic":
        return anthropic_cache_minimum(model)
    return None


def anthropic_cache_minimum(model: str) -> int:
    """The fewest tokens Anthropic caches for ``model`` (the table above)."""
    return next((least for family, least in ANTHROPIC_CACHE_MINIMUM
                 if model.startswith(family)), ANTHROPIC_UNLISTED_MINIMUM)


def prefix_cacheable(provider: Any, system: str, shared: str) -> bool:
    """Whether the batch's shared prefix (system text and instructions) is long enough for
    ``provider`` to cache (its tokens estimated as a provider's limiter does, chars / 4)."""
    least = cache_minimum(provider)
    return least is not None and estimate_tokens(system + shared) >= least


def prompt_cache_key(system: str, shared: str) -> str:
    """OpenAI's ``prompt_cache_key``: the same for every request sharing this prefix, so they
    are routed to the same cache."""
    return "batchjson-" + hashlib.sha256((system + "\x00" + shared).encode()).hexdigest()[:24]
