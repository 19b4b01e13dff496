"""The RLM face: droste's ``llm_batch_json`` contract in any host's namespace (docs/rlm.md).

The session and validator registry live on the host side, so :func:`bind` works where a namespace
hides ``globals()`` or drops names between cells; a budget gate refuses a call that can no longer be
paid for before anything is spent. Never imports another face or ``testing``."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from .. import (
    Budget,
    BudgetExceeded,
    ConfigError,
    InvalidBatch,
    ProviderNotConfigured,
    Session,
    ValidatorChanged,
)
from ..core import (
    answer_source,
    check_call,
    check_droste_schema,
    check_validator,
    compile_schema,
    default_batch_name,
    llm_batch_json,
    usd,
)
from ._droste_env import canonical_version, cell_frame, droste_environment
from ._hooks import RlmHooks, owner_of, tool
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
    # droste's clients count one call per attempt; a plain helper's client retried already
    rules = _call_rules(provider_or_subcalls, replays, transport_retries)
    if session is None:  # a host binding every turn must not reset evidence or budget
        asked = any(x is not None for x in (provider_or_subcalls, replays, transport_retries))
        session = _rebinding(namespace, strict=strict, ledger=ledger, budget=budget,
                             rules=rules if asked else None)
    _keep_owed(namespace, session, ledger)
    if session is None:
        session = Session(provider, ledger=ledger, strict=strict, budget=budget,
                          replays=rules[0], transport_retries=rules[1])
    elif provider_or_subcalls is not None:
        _share(session, provider)
    binding = _Binding(session, namespace,
                       droste=_answers_as_droste(session, provider_or_subcalls))
    helper = tool(binding, "llm_batch_json")  # one object under both names, as droste binds
    namespace.update(llm_batch_json=helper, llm_query_batched_json=helper,
                     **{name: tool(binding, name) for name in HELPER_NAMES[2:]})
    return session


# The binding behind each tool a namespace was given, kept here rather than on the tool: a
# bound method would hand any cell its session (and ledger) as ``tool.__self__.session``.
def _binding_of(namespace: MutableMapping[str, Any]) -> _Binding | None:
    try:
        owner = owner_of(namespace.get("llm_batch_json"))
    except TypeError:  # a name the cell rebound to something that cannot be a key
        return None
    return owner if isinstance(owner, _Binding) else None


def rlm_hooks(*, strict: bool = True, ledger: Any = None, budget: Any = None) -> RlmHooks:
    """batchjson for alexzhang13/rlm's ``RLM``, through its public options only: pass
    ``custom_tools=hooks.custom_tools`` and ``environment_kwargs={"setup_code": hooks.setup_code}``.
    Tools answer through the calling REPL's own ``llm_query_batched``, and ``answer["ready"]`` waits
    for ``finalization_check()`` (docs/rlm.md)."""
    return RlmHooks(bind, strict=strict, ledger=ledger, budget=budget)


def _call_rules(source: Any, replays: int | None,
                transport_retries: int | None) -> tuple[int, int]:
    """(replays, transport retries) of a new session for this answer source."""
    defaults = (0, 0) if is_droste_client(source) else (1, 0 if is_subcall_source(source) else 3)
    return (defaults[0] if replays is None else replays,
            defaults[1] if transport_retries is None else transport_retries)


_DROSTE_SESSIONS: weakref.WeakSet[Any] = weakref.WeakSet()  # sessions bind gave a droste client


def _answers_as_droste(session: Session, source: Any) -> bool:
    """True when the session answers from a droste subcall client: droste's schema subset
    (a later binding sharing the session without naming a source inherits it)."""
    if is_droste_client(source):
        _DROSTE_SESSIONS.add(session)
    return session in _DROSTE_SESSIONS


def _rebinding(namespace: MutableMapping[str, Any], *, strict: bool, ledger: Any,
               budget: Any, rules: tuple[int, int] | None) -> Session | None:
    """The session already bound into ``namespace`` when this bind asks for the same one."""
    bound = _binding_of(namespace)
    if bound is None:
        return None
    session = bound.session
    same_ledger = (ledger is None and session.ledger.path is None) or (
        ledger is session.ledger) or _same_file(ledger, session.ledger)
    same_rules = rules is None or rules == (session.replays, session.transport.retries)
    same = same_ledger and same_rules and session.strict == bool(strict)
    return session if same and Budget.of(budget) == session.budget else None


def _keep_owed(namespace: MutableMapping[str, Any], session: Session | None,
               ledger: Any) -> None:
    """Rebinding a namespace must not hide the evidence its current session still owes."""
    bound = _binding_of(namespace)
    if bound is None or bound.session is session:
        return
    old = bound.session
    same = (_same_file(ledger, old.ledger) if session is None else
            session.ledger is old.ledger or _same_file(session.ledger.path, old.ledger))
    owed = old.evidence.minimum_exact_retry_calls
    if owed and not same:
        raise ConfigError(
            f"this namespace is bound to a session whose ledger ({old.ledger!r}) still owes "
            f"{owed} exact call(s); binding it to another ledger would hide that evidence from "
            "batch_status() and finalization_check(). Bind with the same settings (or "
            "session=) to keep it, or use a new namespace")


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
        cost_spent = self._cost_spent()
        # what owed evidence cannot be paid for blocks spending, not a free answer
        blocked = bool(owed) and ((remaining is not None and owed > remaining) or cost_spent)
        try:
            return llm_batch_json(self.session, prompts, schema, contexts, max_repair_attempts,
                                  validator, name=name, refuse_short_budget=True,
                                  keyed_by_content=True, max_calls=0 if blocked else None,
                                  droste=self.droste)
        except BudgetExceeded as exc:
            if blocked:
                raise _refused(owed, remaining or 0, "to clear the unresolved evidence already "
                               "recorded", cost_spent=cost_spent) from None
            raise _refused(exc.needed, exc.remaining, "to answer the prompts of this call "
                           "that are not yet accepted", one_call=exc.one_call) from None

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
                old = self._owing_digest(owed[0], version.name)
                refused = ValidatorChanged(version.name, old, digest, [], len(owed))
                refused.args = (_changed_message(refused, owed, during="call"),)
                raise refused
        return version.fn

    def _owing_digest(self, batch: str, name: str) -> str:
        return next((str(r.components.get("validator", ""))
                     for r in self.session.ledger.revisions(batch)
                     if _base(r.validator_name) == _base(name)), "")

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

    def _cost_spent(self) -> bool:
        cost = self.session.budget.cost
        return cost is not None and self.session.tally.cost >= cost

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


def _refused(owed: int, remaining: int, why: str, *, cost_spent: bool = False,
             one_call: float | None = None) -> BudgetExceeded:
    owed_evidence = "unresolved evidence" in why
    consequence = (" for, so the unresolved requests cannot be cleared in this run" if
                   owed_evidence else " for, so this call was not started")
    error = BudgetExceeded(owed, remaining, one_call=one_call)
    left = (f"one call may cost up to {usd(one_call)}, more than the session's cost budget "
            "has left" if one_call is not None else "the session's cost budget is spent"
            if cost_spent else f"only {remaining} call(s) remain in the budget")
    error.args = (
        f"llm_batch_json refused before spending anything: at least {owed} exact call(s) are "
        f"needed {why}, but {left}. They cannot be paid{consequence}. Do not set "
        "answer['ready'] = True and do not re-run this cell (it will be refused the same "
        "way): give your answer with what is resolved and "
        "what is not (batch_status() counts it, finalization_check() lists it), or ask the host "
        "for a larger budget.",)
    return error


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
        "unresolved and still blocks a ready answer (finalization_check()).")


def _base(name: str | None) -> str:
    """A validator's name without the ``#digest`` a closure's own version is registered under."""
    return (name or "").split("#")[0]


def _suggest(name: str) -> str:
    """A new name a model can type: the last identifier of a qualname, with _v2."""
    base = _base(name).rsplit(".", 1)[-1]
    return f"{base if base.isidentifier() else 'validator'}_v2"
