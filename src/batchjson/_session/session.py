"""A session: one ledger, one validator registry, one provider, and the budgets over them.

Faces (the IPython magic, the RLM binding, the CLI) all call ``Session.run_batch``; data flows
one way from here: replay loop -> provider -> acceptance -> ledger.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .._acceptance.validators import droste_verdicts
from .._content.tasks import (
    Request,
    compose_contents,
    key_maker,
    pack_requests,
    revision_fingerprint,
    sourceless_content,
)
from .._errors import BatchUnresolved, InvalidBatch
from .._ledger import Ledger
from .._ledger.evidence import Evidence
from .._ledger.rejudge import UNSEEN, clear_sourceless, rejudge, unseen_token
from .._ledger.store import Store
from .._providers.base import answer_source, close_provider
from .._providers.reply import GuardedProvider, provider_names
from .._providers.select import make_provider, provider_label
from .._replay.budget import Budget, Spender, Tally, pricing_of, usd
from .._replay.calls import cheapest_call
from .._replay.plan import Outcome, Plan, Transport
from .._replay.replay import Replayer
from . import preflight, structured
from .fit import check_fit
from .loop import BackgroundLoop
from .registry import ValidatorRegistry, ValidatorVersion
from .result import BatchResult
from .resume import completed_from_file, remember_file, resumed_requests
from .spec import RunSpec, SessionOptions
from .values import result_values


class Session:
    """Holds what must outlive a cell: the ledger, the validator registry and the budget."""

    def __init__(
        self,
        provider: Any = None,
        *,
        ledger: str | Path | Ledger | None = None,
        strict: bool = False,
        budget: Budget | Mapping[str, Any] | int | None = None,
        concurrency: int = 16,
        repairs: int = 1,
        replays: int = 1,
        transport_retries: int = 3,
        timeout: float = 120.0,
        model: str | None = None,
    ) -> None:
        options = SessionOptions(strict=strict, budget=budget, concurrency=concurrency,
                                 repairs=repairs, replays=replays,
                                 transport_retries=transport_retries, timeout=timeout,
                                 model=model)  # all checked before the ledger is opened
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        self.strict = options.strict
        self.budget = options.budget
        self.concurrency = options.concurrency
        self.repairs = options.repairs
        self.replays = options.replays
        self.transport = Transport(retries=options.transport_retries, timeout=options.timeout)
        self.model = model
        self._provider_spec = provider
        self._provider: Any = None
        store = self.ledger.store
        self.validators = ValidatorRegistry(
            strict=self.strict, unresolved_under=store.unresolved_under_validator,
            numbering=lambda v: store.number_validator(
                v.name, v.fingerprint.digest, v.where, v.fingerprint.by_identity))
        self.evidence = Evidence(store)
        self.tally = Tally()  # charged as calls are reserved, by every run and thread
        # Told things a person should hear before anything is spent (e.g. a supersession).
        self.on_note: Callable[[str], None] | None = None
        # One event loop for the session's life: runs are tasks on it, connections are reused.
        self.id = uuid.uuid4().hex[:12]
        self._loop = BackgroundLoop(f"batchjson-{self.id}")
        self._used: list[Any] = []  # providers that ran on the loop, closed with it
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._used)

    @property
    def spent_calls(self) -> int:
        return self.tally.calls

    @property
    def spent_cost(self) -> float:
        """USD charged to the cost budget by settled calls: each at its real cost, or at its
        worst case when its cost is unknown (the ledger records that cost as unknown)."""
        return self.tally.cost

    def __repr__(self) -> str:
        return (f"Session(provider={self._provider_label()}, ledger={self.ledger!r}, "
                f"strict={self.strict}, {self.evidence!r})")

    def _provider_label(self) -> str:
        spec = self._provider if self._provider is not None else self._provider_spec
        return "None" if spec is None else provider_label(spec)

    @property
    def provider(self) -> Any:
        """The configured provider, built on first use so a missing one fails before spending."""
        if self._provider is None:
            self._provider = make_provider(self._provider_spec, model=self.model)
        return self._provider

    @provider.setter
    def provider(self, spec: Any) -> None:
        self._provider_spec = spec
        self._provider = None

    def close(self) -> None:
        """Close pooled provider connections, stop the session's event loop, close the ledger."""
        self._finalizer()
        self.ledger.close()

    # -- the main entry point ------------------------------------------------------------------
    def run_batch(
        self,
        name: str,
        tasks: Iterable[Mapping[str, Any]] | str | os.PathLike,
        schema: Any,
        *,
        validator: Callable[..., Any] | None = None,
        identity: Sequence[str] | str | None = None,
        pack: int = 1,
        instructions: str | None = None,
        repairs: int | None = None,
        replays: int | None = None,
        split: bool = False,
        max_calls: int | None = None,
        on_exhausted: str = "raise",
        progress: bool = False,
        reask_refusals: bool = False,
    ) -> BatchResult:
        """Resolve every task of batch ``name`` or say exactly what is still owed.

        Identical content resumes (accepted requests are not re-spent); changed content opens a
        new revision, which first re-judges earlier returns when only the judging changed.
        ``validator(item, task)`` (a dict, or a model instance for a pydantic schema; sync or
        ``async def``) raises ValueError or returns False to reject an item. ``identity=None``
        compares ``task_id`` and every other task field an item echoes; an explicit list
        compares exactly those fields. A return the model refused is not asked again (its
        request ends unresolved, reason ``refused``) unless ``reask_refusals=True``.
        ``tasks`` is a list, any iterable (a generator is read once) or the path of a JSON
        Lines file (``Path("tasks.jsonl")``), one task object a line.
        """
        return self.run(RunSpec(
            name=name, tasks=tasks, schema=schema, validator=validator,
            identity=identity, pack=pack, instructions=instructions, repairs=repairs,
            replays=replays, split=split, max_calls=max_calls, on_exhausted=on_exhausted,
            progress=progress, reask_refusals=reask_refusals))

    def llm_batch_json(self, prompts: Sequence[str], schema: Any,
                       contexts: Sequence[str] | None = None, max_repair_attempts: int = 1,
                       validator: Callable[[Any, int], Any] | None = None, *,
                       name: str | None = None) -> dict[str, Any]:
        """droste's ``llm_batch_json`` contract, with content-keyed evidence in the ledger."""
        return structured.llm_batch_json(self, prompts, schema, contexts, max_repair_attempts,
                                         validator, name=name)

    def run(self, spec: RunSpec) -> BatchResult:
        """Run one :class:`RunSpec`: every face (magic, RLM binding, CLI) ends here."""
        return self._run(spec)

    def _run(self, spec: RunSpec, registered: ValidatorVersion | None = None) -> BatchResult:
        """``registered``: the validator's version record when the caller registered
        ``spec.validator`` a moment ago (the droste helper names its batch by it), so the
        validator is not fingerprinted a second time."""
        if not isinstance(spec, RunSpec):
            raise InvalidBatch(f"Session.run takes a RunSpec, got {type(spec).__name__}")
        resumed = completed_from_file(self, spec, registered)  # a tasks file's finished run
        if resumed is not None:
            return resumed
        run = spec.checked()  # every input check, before anything is recorded or spent
        name, mode, instructions = spec.name, spec.mode, spec.instructions
        validator = spec.validator
        task_list, task_texts, item_schema, ident = run.tasks, run.texts, run.schema, run.identity
        pack, max_calls = spec.pack, spec.max_calls
        repairs = self.repairs if spec.repairs is None else spec.repairs
        replays = self.replays if spec.replays is None else spec.replays
        provider = self.provider  # make_provider refuses what has no async complete()
        source = answer_source(provider)

        version, changed = None, None
        if validator is not None:
            reuse = (registered is not None and registered.fn is validator
                     and spec.validator_name in (None, registered.name))
            if reuse:
                version = registered
            else:  # a new version says what changed (its code, a file it reads)
                definition = self.validators.register(validator, name=spec.validator_name)
                version = definition.record
                changed = definition.message if definition.kind == "changed" else None
            validator = version.fn
        forms = {"index": _index_form, "droste": droste_verdicts}
        checker = (forms[spec.validator_args](validator) if validator is not None and
                   spec.validator_args in forms else validator)
        if checker is not None:  # an async validator that never returns must not hang the run
            checker = _bounded(checker, self.transport.timeout)
        components, key_content, seen_content = compose_contents(
            task_list, item_schema, version.fingerprint.digest if version else "none", pack,
            instructions, ident, mode, source)
        blind = [f"validator: {u}" for u in (version.fingerprint.unseen if version else ())
                 ] + [f"schema: {u}" for u in item_schema.unseen]
        store = self.ledger.store
        while True:  # the key cannot say whether stored answers still pass: re-judge them
            fingerprint = revision_fingerprint(components)
            existing = store.find_revision(name, fingerprint)
            requests = (resumed_requests(store, existing.id, task_list, pack) if existing else
                        pack_requests(task_list, pack, key_content, task_texts, packed=True))
            token = unseen_token(
                store, requests, components.get(UNSEEN), run=self._loop.run, mode=mode,
                identity=ident, schema=item_schema, validator=checker) if blind else None
            if token is None:
                break
            components[UNSEEN] = key_content[UNSEEN] = token
        done = store.accepted_keys([r.key for r in requests])
        pending = [r for r in requests if r.key not in done]
        # answers of unknown source (imported from another system) are found under the key
        # the same content has without one, and re-judged under this run's rules
        seen_key = key_maker(seen_content)
        seen_of = {r.key: seen_key(r.tasks_json) for r in requests}
        sourceless_of = _sourceless_keys(store, pending, components)
        broken: list[dict[str, Any]] = []  # a validator_error met while re-judging
        rechecked = rejudge(
            store, pending, run=self._loop.run, seen_of=seen_of, sourceless_of=sourceless_of,
            mode=mode, identity=ident, schema=item_schema, validator=checker,
            same_key=bool(blind), broken=broken)
        passed = {request.key for request, _, _ in rechecked}
        owed = pending  # what this run resolves, by re-judging or by calls
        pending = [r for r in pending if r.key not in passed]
        plan = Plan(batch_id=0, revision_id=0, mode=mode,  # ids set once the revision opens
                    identity=ident, schema=item_schema, validator=checker,
                    instructions=instructions, content=key_content, repairs=repairs,
                    replays=replays, split=bool(spec.split), source=source,
                    reask_refusals=spec.reask_refusals)
        provider_notes = check_fit(provider, self.ledger, name, item_schema, pending, ident,
                                   mode)
        spender = Spender(max_calls, self.budget, self.tally, pricing_of(provider),
                          shared=store.shared_budget())
        if spec.refuse_short_budget:
            spender.refuse_if_short(len(pending), cheapest_call(plan, provider, spender.pricing,
                                                                pending))

        validator_record = (None if version is None else  # its definition is already on record
                            {"name": version.name, "version": version.version})
        revision, superseded = store.open_revision(
            name, fingerprint, components, requests, strict=self.strict,
            validator=validator_record)
        superseded_note = None
        if superseded is not None:
            superseded_note = (f"revision {superseded.number} superseded "
                               f"({superseded.supersede_reason or 'content changed'})")
            if self.on_note is not None and pending:
                self.on_note(f"{name}: {superseded_note}; revision {revision.number} runs "
                             f"{len(pending)} request(s)")
        if run.file_digest is not None:  # so a finished run of this file resumes without it
            remember_file(store, run.file_digest, components["tasks"], task_list)
        if existing is None or pending or rechecked:  # a resumed revision has them already
            store.record_seen(list(seen_of.items()))
        if rechecked:
            store.commit_rechecks(revision.batch_id, revision.id, rechecked, source)
        plan.batch_id, plan.revision_id = revision.batch_id, revision.id
        outcome = Outcome()
        if pending and broken:  # retrying cannot help: the validator fails on stored returns
            outcome.stopped = (f"the validator failed while re-judging a stored return, so no "
                               f"call was sent ({broken[0]['message'][:300]}); fix the validator "
                               "and re-run")
            outcome.errors[broken[0]["task_id"]] = [broken[0]]
        elif pending:
            outcome = self._replay(plan, GuardedProvider(provider), spender, pending,
                                   spec.progress, name, len(task_list))
            if plan.split:  # halves made during the run: remember what they saw too
                store.record_seen([(r.key, seen_key(r.tasks_json))
                                   for r in store.leaves(revision.id)])
        if sourceless_of:
            now_accepted = store.accepted_keys([r.key for r in owed])
            clear_sourceless(store, [r for r in owed if r.key in now_accepted], sourceless_of,
                             source)
        result = self._result(name, revision.number, len(task_list),
                              (t["task_id"] for t in task_list), item_schema, outcome,
                              resumed=len(requests) - len(pending) - len(rechecked),
                              revision_id=revision.id)
        result.rechecked = len(rechecked)
        return self._described(result, spec, ident, task_list, provider, provider_notes,
                               changed=changed, superseded=superseded_note,
                               blind=blind)

    def _described(self, result: BatchResult, spec: RunSpec, ident: Any,
                   tasks: Sequence[Mapping[str, Any]], provider: Any,
                   provider_notes: list[str], *, changed: str | None = None,
                   superseded: str | None = None, blind: Sequence[str] = ()) -> BatchResult:
        """The result with what the run compared and why, raised if unresolved and asked to."""
        if spec.mode == "items":  # what the prompt asks to copy; other task fields, if echoed
            result.identity_compared = tuple(ident)
            result.compared_if_echoed = tuple(f for f in preflight.compared_candidates(
                tasks, ident) if f not in ident)
        provider_name, provider_model = provider_names(provider)
        result.provider = f"{provider_name}/{provider_model}" if provider_model else provider_name
        result.notes += provider_notes  # how this run's calls were sent, when not as asked
        if changed is not None:
            result.notes.append(changed)
        if superseded is not None:
            result.superseded = superseded
            result.notes.append(result.superseded)
        if blind:
            result.notes.append(f"the judging reads what no fingerprint can see ("
                                f"{'; '.join(blind)}): stored answers were re-judged under the "
                                "rules as they are now, not reused on trust")
        if result.rechecked:
            result.notes.append(f"{result.rechecked} request(s) resolved by re-judging earlier "
                                "returns under the new rules (no calls)")
        if result.status != "resolved" and spec.on_exhausted == "raise":
            raise BatchUnresolved(result)
        return result

    def advise(self, name: str, **options: Any) -> dict[str, Any]:
        """Pack-size advice for batch ``name`` from its receipts (see docs/recovery.md);
        ``options`` go to :func:`batchjson._ledger.advice.advise` (candidates=, split=)."""
        from .._ledger.advice import advise

        options.setdefault("repairs", self.repairs)
        options.setdefault("replays", self.replays)
        return advise(self.ledger, name, **options)

    def _replay(self, plan: Plan, provider: Any, spender: Spender, pending: list,
                progress: Any, name: str, total: int) -> Outcome:
        """Run the pending requests; a progress bar counts every task of the batch, those
        resumed from the ledger already done (2000/2000 at the end, as tqdm users expect)."""
        bar = None
        done = max(0, total - sum(len(r.tasks) for r in pending))
        if callable(progress):  # a face's own bar (a notebook widget): progress(total, name)
            bar = progress(total, name)
            if done:
                bar.update(done)
        elif progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, initial=done, desc=name, unit="task", leave=True)
        inner = getattr(provider, "inner", provider)  # the real provider, not this run's guard
        if not any(p is inner for p in self._used):
            self._used.append(inner)

        async def go() -> Outcome:
            replayer = Replayer(plan, self.ledger, provider, spender, self.transport,
                                self.concurrency, on_progress=bar.update if bar else None,
                                session_id=self.id)
            return await replayer.run(pending)

        try:
            return self._loop.run(go)
        finally:
            if bar is not None:
                bar.close()

    def _result(self, name: str, revision: int, total: int, task_ids: Iterable[str],
                item_schema: Any, outcome: Outcome, resumed: int,
                revision_id: int) -> BatchResult:
        """The run's result over the revision's values in the ledger; ``task_ids`` (every task
        in order) is read only when some task has no value."""
        values, unloadable = result_values(self.ledger.store, revision_id, item_schema)
        why = (f"no call was made for this task in this run: {outcome.stopped}"
               if outcome.stopped else "no call was made for this task in this run")
        errors = [e for task_id, errs in outcome.errors.items() if task_id not in values
                  for e in errs] + unloadable
        if len(values) < total:  # the tasks neither answered nor failed, in order
            failed = {e["task_id"] for e in errors}.union(values)
            errors += [{"type": "not_attempted", "task_id": task_id, "message": why}
                       for task_id in task_ids if task_id not in failed]
        result = BatchResult(
            name=name, status="resolved" if len(values) == total else "unresolved",
            values=values, errors=errors, calls=outcome.calls, tokens=outcome.tokens,
            cost=outcome.cost, revision=revision, total_tasks=total,
            accepted_returns=outcome.accepted_returns, rejected_returns=outcome.rejected_returns,
            provider_errors=outcome.provider_errors, resumed=resumed,
            attempts_by_task=dict(outcome.attempts_by_task), repairs_made=outcome.repairs_made)
        if outcome.stopped:
            result.notes.append(outcome.stopped)
        if outcome.overrun:
            result.notes.append(
                f"calls billed beyond their reservations: {usd(outcome.overrun)} in this run; "
                f"the session has spent {usd(self.tally.cost)} of its "
                f"{usd(self.budget.cost or 0.0)} cost budget (each receipt keeps its usage)")
        if outcome.taken_from_ledger:
            result.notes.append(f"{outcome.taken_from_ledger} request(s) were resolved by another "
                                "runner of the same content; their values come from the ledger")
        return result


def _sourceless_keys(store: Store, pending: Sequence[Request],
                     components: Mapping[str, str]) -> dict[str, str]:
    """Each pending request's key without an answer source, where imported answers of
    unknown source are found; empty when the ledger holds none."""
    if not pending or not store.has_sourceless_answers():
        return {}
    key = key_maker(sourceless_content(components))
    return {r.key: key(r.tasks_json) for r in pending}


def _shutdown(loop: BackgroundLoop, providers: list[Any]) -> None:
    """Close what the providers pooled on the session's loop, then stop it (also at exit, or
    when an unclosed session is collected; the ledger is closed only by Session.close)."""
    async def close_all() -> None:
        for provider in providers:
            try:
                await close_provider(provider)
            except Exception:  # noqa: BLE001 - one provider failing to close must not stop
                pass

    loop.close(close_all)


def _bounded(fn: Callable[[Any, Mapping[str, Any]], Any],
             seconds: float) -> Callable[[Any, Mapping[str, Any]], Any]:
    """The validator, with an ``async def`` one bounded by the session's timeout: one that never
    returns becomes a ``validator_error`` instead of holding the run forever."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        out = fn(value, task)
        return _within(out, seconds) if inspect.isawaitable(out) else out

    return check


async def _within(awaitable: Any, seconds: float) -> Any:
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise TimeoutError(f"the async validator did not return within {seconds:g}s (the "
                           "session's timeout=)") from None


def _index_form(fn: Callable[[Any, int], Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    """droste validators take (value, index); acceptance hands (value, task)."""
    def check(value: Any, task: Mapping[str, Any]) -> Any:
        return fn(value, task["index"])

    return check


_default: Session | None = None


def default_session(*, create: bool = True) -> Session | None:
    """The session the ``validator`` decorator and faces use when none is given; with
    ``create=False``, None when there is none yet (a face restoring the previous one)."""
    global _default
    if _default is None and create:
        _default = Session(provider=os.environ.get("BATCHJSON_PROVIDER") or None)
    return _default


def set_default_session(session: Session | None) -> None:
    global _default
    _default = session


def validator(fn: Callable | None = None, *, name: str | None = None) -> Any:
    """Register a validator once per session: ``@validator``, ``@validator(name="x")`` or
    ``validator(fn)``, the same shapes as the ``validator`` injected into notebooks and RLM cells.

    Re-running the defining cell hands back the first function object while its content is
    unchanged, so identity-keyed code downstream sees one validator.
    """
    return default_session().validators.define(fn, name=name)
