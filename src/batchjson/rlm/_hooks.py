"""batchjson in alexzhang13/rlm's ``RLM`` loop through its public options, rlm untouched.

``RLM`` makes a new REPL inside every ``completion()``, so nothing can be bound beforehand: the
tools answer through the calling REPL's ``llm_query_batched``, and the setup code hands its
``answer`` dict to ``batchjson_connect`` (docs/rlm.md).

Tools are handed to cell code as plain functions (:func:`tool`): nothing a cell can reach from one
(``__self__``, ``__wrapped__``, a closure) leads back to its owner, session or ledger."""

from __future__ import annotations

import inspect
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .. import ConfigError, NotReady, Session
from ._subcalls import SubcallProvider

__all__ = ["RlmHooks", "owner_of", "tool"]

DESCRIPTIONS = {
    "llm_batch_json": (
        "llm_batch_json(prompts, schema, contexts=None, max_repair_attempts=1, validator=None) "
        "-> {'values', 'errors', 'attempts', 'repairs_made'}: one JSON subcall per prompt "
        "(through llm_query_batched), each answer checked against the JSON Schema `schema` and "
        "by validator(value, index), which raises ValueError to reject; a rejected answer is "
        "repaired up to max_repair_attempts times. values[i] is None where errors names index "
        "i. Running the same call again pays only for prompts not yet accepted, so retry it "
        "inside one cell a bounded number of times instead of raising"),
    "llm_query_batched_json": "the same function as llm_batch_json, under droste's other name",
    "validator": (
        "put @validator above `def check(value, index):` to define a validator once: re-running "
        "the cell hands back the first object. Do not change a validator's code while a batch "
        "it checked has errors (the call is refused); give new logic a new name"),
    "batch_status": (
        "batch_status() -> dict: unresolved_batches, unresolved_items, "
        "minimum_exact_retry_calls, calls and cost spent, remaining_calls of the budget, "
        "ready_allowed"),
    "finalization_check": (
        "finalization_check() -> list: the unresolved llm_batch_json requests (batch, prompts, "
        "last_error) that block answer['ready'] = True; [] means ready may be set"),
    "batchjson_connect": (
        "run once by the host's setup code: makes answer['ready'] = True wait until "
        "finalization_check() is empty; cells never need to call it"),
}


class RlmHooks:
    """What ``RLM(custom_tools=..., environment_kwargs={"setup_code": ...})`` needs."""

    setup_code = "batchjson_connect(answer)\n"  # rlm runs it in every REPL it makes

    def __init__(self, bind: Callable[..., Any], *, strict: bool = True, ledger: Any = None,
                 budget: Any = None) -> None:
        """``bind`` is :func:`batchjson.rlm.bind`, handed in so this module need not import
        the public one that imports it."""
        # answered by rlm's own client, which retried already: one failure is one subcall
        session = Session(None, ledger=ledger, strict=strict, budget=budget,
                          transport_retries=0)
        self._names: dict[str, Any] = {}
        self.session = bind(self._names, session=session)
        self._provider: SubcallProvider | None = None
        self._lock = threading.RLock()  # one call at a time: its REPL answers the whole run
        self._gates: dict[type, type] = {}
        # plain functions (tool, below): none leads a cell back to these hooks or the session
        helper = tool(self, "llm_batch_json")
        self._tools = {"llm_batch_json": helper, "llm_query_batched_json": helper,
                       **{name: self._names[name] for name in ("validator", "batch_status",
                                                               "finalization_check")},
                       "batchjson_connect": tool(self, "connect")}

    # -- what RLM takes ------------------------------------------------------------------------
    @property
    def custom_tools(self) -> dict[str, dict[str, Any]]:
        """For ``RLM(custom_tools=...)``: each tool with the description rlm shows the model."""
        return {name: {"tool": tool, "description": DESCRIPTIONS[name]}
                for name, tool in self._tools.items()}

    # -- for the host, after a completion -------------------------------------------------------
    def finalization_check(self) -> list[dict[str, Any]]:
        """What is still unresolved (a completion rlm ended without a ready answer has some)."""
        return self._names["finalization_check"]()

    def batch_status(self) -> dict[str, Any]:
        return self._names["batch_status"]()

    # -- the tools -----------------------------------------------------------------------------
    def llm_batch_json(self, prompts: Sequence[str], schema: Any,
                       contexts: Sequence[str] | None = None, max_repair_attempts: int = 1,
                       validator: Callable[[Any, int], Any] | None = None, *,
                       name: str | None = None) -> dict[str, Any]:
        """droste's ``llm_batch_json``, answered by the calling REPL's ``llm_query_batched``."""
        helper = _callers_global("llm_query_batched")
        if not callable(helper):
            raise ConfigError(
                "llm_batch_json from batchjson.rlm.rlm_hooks answers through the "
                "llm_query_batched of the REPL cell that calls it, and its caller has none: call "
                "it from a cell of rlm's LocalREPL (environment='local'), or use "
                "batchjson.rlm.bind(namespace, source) for another host")
        with self._lock:
            self._answer_through(helper)
            return self._names["llm_batch_json"](prompts, schema, contexts,
                                                 max_repair_attempts, validator, name=name)

    def connect(self, answer: Any) -> Any:
        """Make ``answer["ready"] = True`` raise :class:`NotReady` while requests are owed; the dict
        becomes an instance of a subclass of its own class, so rlm still captures the answer."""
        if not isinstance(answer, dict):
            raise ConfigError(f"batchjson_connect takes the REPL's answer dict, got "
                              f"{type(answer).__name__}")
        base = type(answer)
        if base in self._gates.values():
            return answer
        gated = self._gates.get(base) or self._gates.setdefault(base, self._gate(base))
        try:
            answer.__class__ = gated
        except TypeError as exc:  # a plain dict cannot change its class
            raise ConfigError(f"batchjson_connect cannot gate a {base.__name__} answer ({exc}); "
                              "it gates the answer dict of rlm's LocalREPL") from None
        return answer

    def _gate(self, base: type) -> type:
        check = self._names["finalization_check"]  # a tool: the class leads to no session

        def __setitem__(answer: dict, key: Any, value: Any) -> None:
            if key == "ready" and value:
                owed = check()
                if owed:
                    raise NotReady(owed)
            base.__setitem__(answer, key, value)

        return type(f"ReadyGated{base.__name__}", (base,), {
            "__setitem__": __setitem__, "__module__": __name__,
            "__doc__": "rlm's answer dict: ready is refused while finalization_check() owes"})

    def _answer_through(self, helper: Callable[..., Any]) -> None:
        """Answer through ``helper`` (each REPL has its own; the source stays the same)."""
        if self._provider is None:
            self._provider = SubcallProvider(helper)
            self.session.provider = self._provider
        else:
            self._provider.retarget(helper)


def _callers_global(name: str) -> Any:
    """``name`` in the globals of the nearest caller outside batchjson: the REPL cell that
    called the tool (through the tool's own frames)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "batchjson":
        frame = frame.f_back  # type: ignore[assignment]
    return None if frame is None else frame.f_globals.get(name)


_OWNERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def tool(owner: Any, method: str) -> Callable[..., Any]:
    """``owner.<method>`` as a plain function a cell may be given: its name, signature and doc,
    and nothing that leads to ``owner`` (no ``__self__``, ``__wrapped__`` or closure over it)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_OWNERS[call], method)(*args, **kwargs)

    bound = getattr(owner, method)
    call.__name__ = call.__qualname__ = method
    call.__doc__ = bound.__doc__
    call.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
    _OWNERS[call] = owner
    return call


def owner_of(fn: Any) -> Any:
    """The object a :func:`tool` calls, or None for anything else (a name a cell rebound)."""
    return _OWNERS.get(fn)
