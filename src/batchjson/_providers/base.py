"""The provider contract: one call in, raw text and usage out (a :class:`~.reply.Reply`); a call's
size as providers count it, and their prompt caches (a prefix is cached only past a model's length
and only if every byte before it is identical)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .._checks import seconds, whole
from .._errors import ProviderError, ProviderSetupError
from .._secrets import check_name
from .._sources import Code
from .pricing import as_price
from .reply import Reply

# why a request is asked (a receipt's ``kind``): first, to repair a rejected return, or again
CallKind = Literal["initial", "repair", "replay"]


@dataclass(frozen=True)
class Call:
    """One request attempt. ``mode``: ``"items"`` (``{"items": [...]}``, one per task) or
    ``"value"``; ``shared``: the head of ``prompt`` all the batch's requests share (cached);
    ``answer_chars``: the longest answer (None: unbounded), to size an output ceiling;
    ``schema_shape``: a key of ``schema`` apart from this call's item count and pinned identity
    values, shared by the run's calls ("": none), so a provider deriving a form of the schema
    (OpenAI's strict mode) derives it once."""

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
    schema_shape: str = ""


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
    """A quarter of the text's characters: an estimate, never a bound nor a provider's usage."""
    return chars_tokens(len(text))


def chars_tokens(chars: int) -> int:
    """:func:`estimate_tokens` of a text of ``chars`` characters."""
    return max(1, chars // 4)


CHAT_OVERHEAD_TOKENS = 3 * 2 + 3  # OpenAI's: 3 framing each message (system, user), 3 the reply


def input_bound(provider: Any, call: Call) -> int:
    """A sound bound on the input tokens ``call`` is billed for: the provider's own, else its UTF-8
    bytes and overhead (a byte-level BPE never makes more tokens than bytes)."""
    own = getattr(provider, "input_bound", None)
    if callable(own):
        return int(own(call))
    schema = json.dumps(call.schema, ensure_ascii=False, separators=(",", ":"), default=str)
    sent = call.system + call.prompt + schema  # a lone surrogate (never sent as is) counts 3
    return len(sent.encode("utf-8", "surrogatepass")) + CHAT_OVERHEAD_TOKENS


class OneService:
    """A provider is one service (a pool, a lock): deep-copying one (``%config``) gives it back."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self


class ProviderHandle(OneService):
    """``%config BatchJson.provider = ProviderHandle(obj)``: IPython's config deep-copies what it
    is given; a handle (and so ``obj``) never is."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def __repr__(self) -> str:
        return f"ProviderHandle({self.provider!r})"


class CallableProvider(OneService):
    """Wrap ``fn(call) -> str | Reply`` (sync or async) as a provider, for tests and glue code.

    A ``str`` leaves the usage unknown (a budget keeps its worst case). The answer source is the
    function's content, or ``source=``. ``fn.blocking = True`` runs it in a daemon thread."""

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
        self.timeout = timeout if timeout is None else seconds(
            "CallableProvider timeout", timeout, ProviderSetupError, positive=True)
        self.enforces_timeout = timeout is not None
        self._code = Code(fn, owner="CallableProvider")  # keyed by content (see _sources)
        self.price = None if price is None else as_price(price)
        self.max_tokens = (None if max_tokens is None else
                           whole("CallableProvider max_tokens", max_tokens, 1, ProviderSetupError))

    def price_for_budget(self) -> Any:
        """USD per million tokens for cost budgets, or None: unpriced."""
        return self.price

    def source_key(self) -> str | tuple[Any, ...]:
        """The named source, else the function by content: the same in any process."""
        if self.source is not None:
            return f"callable:{self.source}"
        head = f"callable:{self._named_model}" if self._named_model else "callable"
        return (f"{head}#", self._code)

    async def complete(self, call: Call) -> Reply:
        timeout = self.timeout
        try:
            async with asyncio.timeout(timeout):
                blocking = getattr(self.fn, "blocking", False)  # a worker thread
                out = await in_thread(self.fn, call) if blocking else self.fn(call)
                if inspect.isawaitable(out):  # async functions and objects with an async __call__
                    out = await out
        except TimeoutError:
            if timeout is None:
                raise
            raise ProviderError(f"callable provider: no answer within the {timeout:g}s "
                                "timeout", retryable=True) from None
        if isinstance(out, Reply):
            return out
        if not isinstance(out, str):
            raise ProviderError(f"callable provider returned {type(out).__name__}, expected "
                                "str or Reply", retryable=False)
        return Reply(text=out, model=self.model)  # its usage unknown, never an estimate


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a daemon thread; cancellation returns at once, its result dropped. Not
    ``asyncio.to_thread``: a hung call would hold the loop's close, which joins its executor."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(deliver: Callable[[Any], None], value: Any) -> None:
        if not future.done():  # else cancelled by a timeout or an interrupt: nobody waits
            deliver(value)

    def work() -> None:
        try:
            outcome = (future.set_result, fn(*args))
        except Exception as exc:  # handed to the awaiting coroutine
            outcome = (future.set_exception, exc)
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a worker: report, not hang
            outcome = (future.set_exception, ProviderError(
                f"blocking provider raised {type(exc).__name__}", retryable=False))
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run ended long ago
            loop.call_soon_threadsafe(settle, *outcome)

    name = getattr(fn, "__name__", type(fn).__name__)
    threading.Thread(target=work, name=f"batchjson-blocking-{name}", daemon=True).start()
    return await future


# Anthropic's least cacheable prompt in tokens by model family (longest prefix first); an
# unlisted model is taken at the largest, so a newer one never gets the constant schema uncached.
ANTHROPIC_CACHE_MINIMUM: tuple[tuple[str, int], ...] = (
    ("claude-opus-4-6", 4096), ("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
    ("claude-sonnet-4-6", 2048), ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
    ("claude-sonnet-4-5", 1024), ("claude-opus-4-1", 1024), ("claude-opus-4", 1024),
    ("claude-sonnet-4", 1024), ("claude-3-7-sonnet", 1024),
)
ANTHROPIC_UNLISTED_MINIMUM = 4096
OPENAI_CACHE_MINIMUM = 1024  # automatic prompt caching, from 1,024 tokens of identical prefix
LEAST_CACHED = min(OPENAI_CACHE_MINIMUM, ANTHROPIC_UNLISTED_MINIMUM,
                   *(least for _, least in ANTHROPIC_CACHE_MINIMUM))
CACHE_CONTROL = {"type": "ephemeral"}  # the 5-minute cache (writes 1.25x input, reads 0.1x)


def cache_minimum(provider: Any) -> int | None:
    """The fewest prefix tokens ``provider``'s API caches, or None (no prompt cache known)."""
    provider = getattr(provider, "inner", provider)  # a run's guard around the real one
    name = getattr(provider, "name", None)
    if name == "anthropic":
        return anthropic_cache_minimum(str(getattr(provider, "model", "") or ""))
    return OPENAI_CACHE_MINIMUM if name == "openai" else None


def anthropic_cache_minimum(model: str) -> int:
    """The fewest tokens Anthropic caches for ``model`` (the table above)."""
    return next((least for family, least in ANTHROPIC_CACHE_MINIMUM
                 if model.startswith(family)), ANTHROPIC_UNLISTED_MINIMUM)


def prefix_cacheable(provider: Any, system: str, shared: str) -> bool:
    """Whether the batch's shared prefix is long enough to cache (then the schema is constant);
    a prefix shorter than any API caches is not, whoever the provider is (asked every call)."""
    tokens = estimate_tokens(system + shared)
    if tokens < LEAST_CACHED:
        return False
    least = cache_minimum(provider)
    return least is not None and tokens >= least


def prompt_cache_key(system: str, shared: str) -> str:
    """OpenAI's ``prompt_cache_key``: one per shared prefix, so that its requests share a cache."""
    return "batchjson-" + hashlib.sha256((system + "\x00" + shared).encode()).hexdigest()[:24]
