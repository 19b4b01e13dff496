"""The RLM face: droste's ``llm_batch_json`` contract in any host's namespace (docs/rlm.md).

The session and validator registry live on the host side, so :func:`bind` works where a namespace
hides ``globals()`` or drops names between cells; a budget gate refuses a call that can no longer be
paid for before anything is spent. Tools reach cell code as plain functions (:func:`tool`): nothing
a cell can reach from one leads back to its owner, session or ledger. Never imports another face or
``testing``."""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from .. import (
    Budget,
    BudgetExceeded,
    ConfigError,
    InvalidBatch,
    NotReady,
    ProviderNotConfigured,
    Session,
    ValidatorChanged,
    ValidatorRegistry,
)
from ..core import (
    ValidatorVersion,
    answer_source,
    check_call,
    check_droste_schema,
    check_validator,
    compile_schema,
    default_batch_name,
    llm_batch_json,
    usd,
)
from ._subcalls import SubcallProvider, is_droste_client, is_subcall_source

__all__ = ["bind", "droste_environment", "rlm_hooks"]

HELPER_NAMES = ("llm_batch_json", "llm_query_batched_json", "validator", "batch_status",
                "finalization_check")


def bind(namespace: MutableMapping[str, Any], provider_or_subcalls: Any = None, *,
         session: Session | None = None, strict: bool = True, ledger: Any = None,
         budget: Any = None, context: Any = None, replays: int | None = None,
         transport_retries: int | None = None) -> Session:
    """Install the structured helpers into ``namespace`` and return the session behind them.

    ``provider_or_subcalls``: a batchjson provider (or its name), an object with droste's
    ``llm_batch_with_errors``, or rlm's ``llm_query_batched``. ``session=`` shares one session
    between hosts; else one is made from ``strict``, ``ledger``, ``budget``, ``replays`` and
    ``transport_retries``. ``context``: a droste ``ExecutionContext`` to account subcalls to. Bound
    to a droste client, the helper keeps droste's contract (1 + repairs attempts, droste's schema
    subset) unless ``replays=``/``transport_retries=`` ask for more."""
    if not isinstance(namespace, MutableMapping):
        raise InvalidBatch(f"bind needs the dict a host runs cells in, got "
                           f"{type(namespace).__name__}")
    if not (provider_or_subcalls is None or isinstance(provider_or_subcalls, str)
            or callable(getattr(provider_or_subcalls, "complete", None))
            or is_subcall_source(provider_or_subcalls)):
        raise ConfigError(
            f"bind cannot answer from a {type(provider_or_subcalls).__name__}: pass a batchjson "
            "provider (or provider name), an object with llm_batch_with_errors(prompts, "
            "contexts) -> (values, errors), or a function of a list of prompts returning a list "
            "of strings")
    if session is not None and (replays is not None or transport_retries is not None):
        raise ConfigError("replays= and transport_retries= set the rules of the session bind "
                          "makes; a shared session (session=) keeps its own. Make that session "
                          "with Session(..., replays=..., transport_retries=...) instead")
    provider = (SubcallProvider(provider_or_subcalls, context=context)
                if is_subcall_source(provider_or_subcalls) else provider_or_subcalls)
    # a new session's (replays, transport retries): droste's clients count one call per attempt;
    # a plain helper's client retried already
    rules = ((0, 0) if is_droste_client(provider_or_subcalls) else
             (1, 0 if is_subcall_source(provider_or_subcalls) else 3))
    rules = (rules[0] if replays is None else replays,
             rules[1] if transport_retries is None else transport_retries)
    asked = any(x is not None for x in (provider_or_subcalls, replays, transport_retries))
    session = _rebound(namespace, session, strict=strict, ledger=ledger, budget=budget,
                       rules=rules if asked else None)
    if session is None:
        session = Session(provider, ledger=ledger, strict=strict, budget=budget,
                          replays=rules[0], transport_retries=rules[1])
    elif provider_or_subcalls is not None:
        _share(session, provider)
    binding = _Binding(session, namespace,
                       droste=_answers_as_droste(session, provider_or_subcalls))
    namespace.update(_tools(binding))
    return session


def _tools(binding: _Binding) -> dict[str, Callable[..., Any]]:
    """The helpers a cell is given: llm_batch_json under droste's two names (one object, as
    droste binds it)."""
    helper = tool(binding, "llm_batch_json")
    return {"llm_batch_json": helper, "llm_query_batched_json": helper,
            **{name: tool(binding, name) for name in HELPER_NAMES[2:]}}


# The binding behind each tool a namespace was given, kept here rather than on the tool: a
# bound method would hand any cell its session (and ledger) as ``tool.__self__.session``.
def _binding_of(namespace: MutableMapping[str, Any]) -> _Binding | None:
    try:
        owner = _OWNERS.get(namespace.get("llm_batch_json"))  # None: not a tool
    except TypeError:  # a name the cell rebound to something that cannot be a key
        return None
    return owner if type(owner) is _Binding else None  # rlm_hooks' tools: not bind's


_DROSTE_SESSIONS: weakref.WeakSet[Any] = weakref.WeakSet()  # sessions bind gave a droste client


def _answers_as_droste(session: Session, source: Any) -> bool:
    """True when the session answers from a droste subcall client: droste's schema subset
    (a later binding sharing the session without naming a source inherits it)."""
    if is_droste_client(source):
        _DROSTE_SESSIONS.add(session)
    return session in _DROSTE_SESSIONS


def _rebound(namespace: MutableMapping[str, Any], session: Session | None, *, strict: bool,
             ledger: Any, budget: Any, rules: tuple[int, int] | None) -> Session | None:
    """The session given, else the one already bound into ``namespace`` when this bind asks for
    the same (a host binding every turn must not reset evidence or budget), else None. Binding
    another must not hide the evidence the namespace's current session still owes."""
    bound = _binding_of(namespace)
    if bound is None or bound.session is session:
        return session
    old = bound.session
    if session is None:
        same_ledger = (ledger is None and old.ledger.path is None) or (
            ledger is old.ledger) or _same_file(ledger, old.ledger)
        same_rules = rules is None or rules == (old.replays, old.transport.retries)
        if same_ledger and same_rules and old.strict == bool(strict) and (
                Budget.of(budget) == old.budget):
            return old
        same = _same_file(ledger, old.ledger)
    else:
        same = session.ledger is old.ledger or _same_file(session.ledger.path, old.ledger)
    owed = old.evidence.minimum_exact_retry_calls
    if owed and not same:
        raise ConfigError(
            f"this namespace is bound to a session whose ledger ({old.ledger!r}) still owes "
            f"{owed} exact call(s); binding it to another ledger would hide that evidence from "
            "batch_status() and finalization_check(). Bind with the same settings (or "
            "session=) to keep it, or use a new namespace")
    return session


def _same_file(ledger: Any, held: Any) -> bool:
    """Whether ``ledger`` is a path naming the file the Ledger ``held`` is open on."""
    return isinstance(ledger, (str, Path)) and held.path is not None and Path(ledger) == held.path


def _share(session: Session, provider: Any) -> None:
    """A shared session has one answer source: a second host may not swap it silently."""
    try:
        current = session.provider
    except ProviderNotConfigured:
        session.provider = provider
        return
    if current is provider or _source(current) == _source(provider):
        return
    raise ConfigError(
        f"this session already answers from {getattr(current, 'name', current)!r}; a second host "
        f"may share it only with the same source, not {getattr(provider, 'name', provider)!r}. "
        "Pass the same subcall client, or give this host its own session")


def _source(provider: Any) -> Any:
    return answer_source(provider) if callable(getattr(provider, "source_key", None)) else None


# -- canonical validators: a re-executed RLM cell hands every call a new function object, so the
# registry's first object for that content is rebound, at call time, to every name bound to the
# duplicate (the function's ``__globals__``, the calling cell's locals, the host's namespaces).
# droste keys evidence by validator identity, so before every cell its environment's wrapper
# re-wraps the helpers ``run_rlm`` bound, handing droste that first object (droste untouched).
_FRAMES_UP = 8  # how far a helper called from a cell's own helper function looks for the cell


def cell_frame(depth: int = 2) -> types.FrameType | None:
    """The nearest calling frame that runs cell code (module level: its locals are a dict)."""
    try:
        frame: types.FrameType | None = sys._getframe(depth)
    except ValueError:  # called from the bottom of a thread's stack: no cell above
        return None
    for _ in range(_FRAMES_UP):
        if frame is None:
            return None
        if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            return frame
        frame = frame.f_back
    return None


def canonical_version(registry: ValidatorRegistry, fn: Callable[..., Any], *,
                      namespaces: Iterable[MutableMapping[str, Any]] = (),
                      frame: types.FrameType | None = None,
                      name: str | None = None, hand_over: bool = False) -> ValidatorVersion:
    """Register ``fn`` and rebind every duplicate to the canonical object for its content (the
    version's ``fn``); a changed validator is a new version (a strict registry may refuse it).
    ``hand_over``: for the run this call is on its way to (see ``version_of``)."""
    version = registry.version_of(fn, name, hand_over=hand_over)
    canonical = version.fn
    if canonical is fn:
        return version
    targets = {id(target): target for target in (
        getattr(fn, "__globals__", None), frame and frame.f_locals, *namespaces)
        if isinstance(target, MutableMapping)}  # each once: a cell's locals are its globals
    for target in targets.values():
        for key, value in list(target.items()):
            if value is fn:
                target[key] = canonical
    return version


_VALIDATOR_POSITION = 4  # droste: (prompts, schema, contexts, max_repair_attempts, validator)


def droste_environment(environment: Any, *, session: Session | None = None,
                       registry: ValidatorRegistry | None = None
                       ) -> CanonicalValidatorsEnvironment:
    """Wrap any droste ``RLMEnvironment`` so its structured helpers get canonical validators;
    ``session=`` shares that session's registry (one validator object for batchjson and droste)."""
    wanted = registry if registry is not None else (
        session.validators if session is not None else None)
    if isinstance(environment, CanonicalValidatorsEnvironment):  # wrapping twice: once
        if wanted is not None and wanted is not environment.validators:
            raise ConfigError(
                "this environment is already wrapped by droste_environment with another "
                "validator registry; wrap the unwrapped environment once, passing session= "
                "(or registry=) the first time, so batchjson and droste share one validator")
        return environment
    return CanonicalValidatorsEnvironment(
        environment, wanted if wanted is not None else ValidatorRegistry())


class CanonicalValidatorsEnvironment:
    """Delegates everything to the wrapped environment; ``execute`` first re-wraps helpers."""

    def __init__(self, environment: Any, registry: ValidatorRegistry) -> None:
        self.environment = environment
        self.validators = registry
        self._wrappers: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}

    def __getattr__(self, name: str) -> Any:  # globals, capabilities, close, broker, ...
        return getattr(self.environment, name)

    def execute(self, code: str) -> Any:
        self.install()
        return self.environment.execute(code)

    def install(self) -> None:
        """Wrap whatever structured helpers the globals hold now (droste rebinds them)."""
        scope = self.environment.globals()
        for name in HELPER_NAMES[:2]:  # droste's two names of its structured helper
            current = scope.get(name)
            if callable(current) and not getattr(current, "__batchjson_canonical__", False):
                scope[name] = self._wrap(current)

    def _wrap(self, helper: Callable[..., Any]) -> Callable[..., Any]:
        known = self._wrappers.get(id(helper))
        if known is not None and known[0] is helper:
            return known[1]
        registry, scope = self.validators, self.environment.globals

        @functools.wraps(helper)
        def canonical_helper(*args: Any, **kwargs: Any) -> Any:
            frame, at = cell_frame(2), _VALIDATOR_POSITION

            def canonical(fn: Callable[..., Any]) -> Callable[..., Any]:
                return canonical_version(registry, fn, namespaces=[scope()], frame=frame).fn

            if callable(kwargs.get("validator")):
                kwargs["validator"] = canonical(kwargs["validator"])
            elif len(args) > at and callable(args[at]):
                args = (*args[:at], canonical(args[at]), *args[at + 1:])
            return helper(*args, **kwargs)

        canonical_helper.__batchjson_canonical__ = True  # type: ignore[attr-defined]
        self._wrappers[id(helper)] = (helper, canonical_helper)  # keeps helper alive: id stable
        return canonical_helper


class _Binding:
    """The helpers of one namespace over one session."""

    def __init__(self, session: Session, namespace: MutableMapping[str, Any], *,
                 droste: bool = False) -> None:
        self.session = session
        self.namespace = namespace
        self.droste = droste  # answering from a droste client: droste's schema and verdicts

    def llm_batch_json(self, prompts: Sequence[str], schema: Any,
                       contexts: Sequence[str] | None = None, max_repair_attempts: int = 1,
                       validator: Callable[[Any, int], Any] | None = None, *,
                       name: str | None = None) -> dict[str, Any]:
        """droste's ``llm_batch_json``: one prompt per call, a bare JSON value each.

        Returns ``values``, ``errors``, ``attempts`` and ``repairs_made``. Re-running the same
        call resumes its requests; prompts already accepted are not paid again.
        """
        # before the validator is registered: a refused call records nothing
        check_call(prompts, contexts, max_repair_attempts, validator, name)
        if self.droste:
            check_droste_schema(schema)
        schema = compile_schema(schema, strict_integers=self.droste)
        if validator is not None and callable(validator):  # handed over to the run
            validator = self._registered(validator, call=(prompts, contexts, name))
        owed, remaining = self.session.evidence.minimum_exact_retry_calls, self._remaining()
        cost = self.session.budget.cost
        cost_spent = cost is not None and self.session.tally.cost >= cost
        # what owed evidence cannot be paid for blocks spending, not a free answer
        blocked = bool(owed) and ((remaining is not None and owed > remaining) or cost_spent)
        try:
            return llm_batch_json(self.session, prompts, schema, contexts, max_repair_attempts,
                                  validator, name=name, refuse_short_budget=True,
                                  keyed_by_content=True, max_calls=0 if blocked else None,
                                  droste=self.droste)
        except BudgetExceeded as exc:
            if blocked:
                raise _refused(owed, remaining or 0, blocked=True, cost_spent=cost_spent) from None
            raise _refused(exc.needed, exc.remaining, blocked=False,
                           one_call=exc.one_call) from None

    def validator(self, fn: Callable[..., Any] | str | None = None, *,
                  name: str | None = None) -> Any:
        """``@validator``, ``@validator("name")`` or ``@validator(name=...)``: define once;
        re-running the defining cell hands back the first object."""
        if isinstance(fn, str) and name is None:  # @validator("check_labels")
            fn, name = None, fn
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidBatch(f"a validator name must be a non-empty string, got {name!r}")
        if fn is None:
            return lambda f: self._registered(f, name=name)
        return self._registered(fn, name=name)

    def _registered(self, fn: Any, name: str | None = None,
                    call: tuple[Any, Any, Any] | None = None) -> Callable[..., Any]:
        """The canonical object for ``fn``; a ``call``'s version is handed over to its run."""
        if not callable(fn):
            raise InvalidBatch(f"a validator must be a function (value, index) -> None that "
                               f"raises ValueError to reject, got {type(fn).__name__}")
        check_validator(fn, "index")  # refused before the registry records it
        frame = cell_frame(3)
        registry = self.session.validators
        try:
            version = canonical_version(registry, fn, name=name, namespaces=[self.namespace],
                                        frame=frame, hand_over=call is not None)
        except ValidatorChanged as exc:
            # Another validator of the same code (a factory's or a loop's closure) for prompts
            # with no evidence under another version of it orphans nothing: its own validator.
            owed = self._owed_under(exc.name, exc.new_fingerprint, call)
            if call is not None and name is None and not owed:
                return canonical_version(registry, fn, namespaces=[self.namespace], frame=frame,
                                         name=f"{exc.name}#{exc.new_fingerprint[:12]}").fn
            exc.args = (_changed_message(exc, owed, during="call" if call else "definition"),)
            raise
        if call is not None and self.session.strict:
            # The registry compares with the version it holds now; the ledger also knows the
            # versions of earlier kernels and of other closures: none may owe these prompts.
            digest = version.fingerprint.digest
            owed = self._owed_under(version.name, digest, call)
            if owed:
                old = next((str(r.components.get("validator", ""))
                            for r in self.session.ledger.revisions(owed[0])
                            if _base(r.validator_name) == _base(version.name)), "")
                refused = ValidatorChanged(version.name, old, digest, [], len(owed))
                refused.args = (_changed_message(refused, owed, during="call"),)
                raise refused
        return version.fn

    def _owed_under(self, base: str, digest: str, call: tuple[Any, Any, Any] | None
                    ) -> list[str]:
        """Batches owing evidence checked by another content of validator ``base``: for this
        call's prompts (or batch name) when there is a call, anywhere for a definition."""
        group = None
        if call is not None:
            prompts, contexts, name = call
            try:
                group = name if name is not None else default_batch_name(prompts, contexts)
            except (TypeError, ValueError):  # bad prompts: the call is refused anyway
                pass
        revisions = functools.cache(self.session.ledger.revisions)  # one read per batch
        batches: list[str] = []
        for u in self.session.evidence.requests():
            if u.batch in batches or (group is not None and not (
                    u.batch == group or u.batch.startswith(group + "/"))):
                continue
            if any(r.number == u.revision and _base(r.validator_name) == _base(base)
                   and r.components.get("validator") != digest for r in revisions(u.batch)):
                batches.append(u.batch)
        return batches

    def _remaining(self) -> int | None:
        calls = self.session.budget.calls
        return None if calls is None else max(0, calls - self.session.tally.calls)

    def batch_status(self) -> dict[str, Any]:
        """What is owed and spent: unresolved batches, items, minimum exact retry calls."""
        s = self.session.evidence.summary()
        return {**{k: s[k] for k in ("unresolved_batches", "unresolved_items",
                                     "minimum_exact_retry_calls", "calls", "cost")},
                "remaining_calls": self._remaining(), "usable_results": s["usable_results"],
                "ready_allowed": s["minimum_exact_retry_calls"] == 0}

    def finalization_check(self) -> list[dict[str, Any]]:
        """The unresolved evidence that must block a ready answer; empty when it may be given.

        One entry per owed request: its batch, the prompts (shortened), the last error and its
        type as ``reason`` (``refused`` for a request the model refused), so a model can say
        what is unresolved, or replay exactly that call.
        """
        owed = self.session.evidence.requests()
        ledger, details = self.session.ledger, {}
        for batch in {u.batch for u in owed}:
            tasks = {r.key: r.tasks for revision in ledger.revisions(batch)
                     for r in ledger.leaves(revision.id)}
            errors = {a.request_key: a.errors for a in ledger.attempts(batch, failed=True)}
            details[batch] = (tasks, errors)
        out = []
        for u in owed:
            tasks, errors = details[u.batch]
            last = (errors.get(u.key) or [{}])[-1]
            out.append({"batch": u.batch, "revision": u.revision, "request": u.key[:16],
                        "items": list(u.task_ids),
                        "prompts": [_short(t.get("prompt")) for t in tasks.get(u.key, ())],
                        "reason": last.get("type"), "last_error": _short(last.get("message"))})
        return out


def _short(text: Any, limit: int = 160) -> Any:
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return text[:limit - 3] + "..."


def _refused(needed: int, remaining: int, *, blocked: bool, cost_spent: bool = False,
             one_call: float | None = None) -> BudgetExceeded:
    """A call refused before spending: the owed evidence cannot be cleared (``blocked``), or
    this call's own prompts cannot be answered."""
    why, consequence = (
        ("to clear the unresolved evidence already recorded",
         "the unresolved requests cannot be cleared in this run") if blocked else
        ("to answer the prompts of this call that are not yet accepted",
         "this call was not started"))
    left = (f"one call may cost up to {usd(one_call)}, more than the session's cost budget "
            "has left" if one_call is not None else "the session's cost budget is spent"
            if cost_spent else f"only {remaining} call(s) remain in the budget")
    return BudgetExceeded(needed, remaining, one_call=one_call, message=(
        f"llm_batch_json refused before spending anything: at least {needed} exact call(s) are "
        f"needed {why}, but {left}. They cannot be paid for, so {consequence}. Do not set "
        "answer['ready'] = True and do not re-run this cell (it will be refused the same "
        "way): give your answer with what is resolved and "
        "what is not (batch_status() counts it, finalization_check() lists it), or ask the host "
        "for a larger budget."))


def _changed_message(exc: ValidatorChanged, owed: Sequence[str], *, during: str) -> str:
    what = "; ".join(exc.changes) if exc.changes else "its content"
    where = f" in batch(es) {', '.join(owed[:3])}" if owed else ""
    head = ("llm_batch_json refused before spending anything" if during == "call" else
            f"validator({exc.name}) refused")
    return (
        f"{head}: validator {exc.name!r} changed ({what}) while request(s) checked by its "
        f"previous version are unresolved{where}. Evidence recorded under one validator is only "
        f"cleared by that same validator. Either restore the previous definition of "
        f"{exc.name} exactly and re-run the same call to clear it, or, if the new logic is "
        f"intended, give it a new name (define it as {_suggest(exc.name)}, or pass "
        f"validator=validator(fn, name=\"{_suggest(exc.name)}\")); the old evidence then stays "
        f"unresolved and still blocks a ready answer (finalization_check()).{exc.made_anew}")


def _base(name: str | None) -> str:
    """A validator's name without the ``#digest`` a closure's own version is registered under."""
    return (name or "").split("#")[0]


def _suggest(name: str) -> str:
    """A new name a model can type: the last identifier of a qualname, with _v2."""
    base = _base(name).rsplit(".", 1)[-1]
    return f"{base if base.isidentifier() else 'validator'}_v2"


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


class RlmHooks(_Binding):
    """batchjson for alexzhang13/rlm's ``RLM``, through its public options only: pass
    ``custom_tools=hooks.custom_tools`` and ``environment_kwargs={"setup_code": hooks.setup_code}``.
    Tools answer through the calling REPL's own ``llm_query_batched``, and ``answer["ready"]`` waits
    for ``finalization_check()`` (docs/rlm.md)."""

    setup_code = "batchjson_connect(answer)\n"  # rlm runs it in every REPL it makes

    def __init__(self, *, strict: bool = True, ledger: Any = None, budget: Any = None) -> None:
        # answered by rlm's own client, which retried already: one failure is one subcall
        super().__init__(Session(None, ledger=ledger, strict=strict, budget=budget,
                                 transport_retries=0), {})
        self._provider: SubcallProvider | None = None
        self._lock = threading.RLock()  # one call at a time: its REPL answers the whole run
        self._gates: dict[type, type] = {}
        # plain functions (tool, below): none leads a cell back to these hooks or the session
        self._tools = {**_tools(self), "batchjson_connect": tool(self, "connect")}

    # -- what RLM takes ------------------------------------------------------------------------
    @property
    def custom_tools(self) -> dict[str, dict[str, Any]]:
        """For ``RLM(custom_tools=...)``: each tool with the description rlm shows the model."""
        return {name: {"tool": tool, "description": DESCRIPTIONS[name]}
                for name, tool in self._tools.items()}

    # -- the tools (finalization_check and batch_status are the host's too, after a completion) --
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
        with self._lock:  # each REPL has its own helper; the answer source stays the same
            if self._provider is None:
                self._provider = SubcallProvider(helper)
                self.session.provider = self._provider
            else:
                self._provider.retarget(helper)
            return super().llm_batch_json(prompts, schema, contexts, max_repair_attempts,
                                          validator, name=name)

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
        check = self._tools["finalization_check"]  # a tool: the class leads to no session

        def __setitem__(answer: dict, key: Any, value: Any) -> None:
            if key == "ready" and value:
                owed = check()
                if owed:
                    raise NotReady(owed)
            base.__setitem__(answer, key, value)

        return type(f"ReadyGated{base.__name__}", (base,), {
            "__setitem__": __setitem__, "__module__": __name__,
            "__doc__": "rlm's answer dict: ready is refused while finalization_check() owes"})


def _callers_global(name: str) -> Any:
    """``name`` in the globals of the nearest caller outside batchjson: the REPL cell that
    called the tool (through the tool's own frames)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "batchjson":
        frame = frame.f_back  # type: ignore[assignment]
    return None if frame is None else frame.f_globals.get(name)


rlm_hooks = RlmHooks


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
