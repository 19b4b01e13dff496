"""``%load_ext batchjson``: the ``%%batch_json`` cell magic and its inspection line magics.

One session per kernel, configured by IPython's own ``%config BatchJson.*`` (a refused value is the
trait's ``TraitError``; the old value stays), held on the shell (:class:`KernelState`) so its ledger
connection and validator registry outlive ``%reset`` and ``%reload_ext``. Re-running a cell is safe:
its validator goes through the define-once registry, and identical work resumes from the ledger.
Never imports the command line or the RLM face."""

from __future__ import annotations

import builtins
import difflib
import dis
import inspect
import keyword
import math
import os
import re
import sys
from argparse import Namespace
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from copy import deepcopy
from dataclasses import fields
from itertools import pairwise
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from IPython.utils.process import arg_split
from traitlets import Any as AnyTrait
from traitlets import Bool, Enum, Float, Int, TraitError, Unicode, observe, validate
from traitlets.config import Config

from .. import (
    BatchJsonError,
    BatchResult,
    BatchUnresolved,
    ConfigError,
    InvalidBatch,
    ProviderHandle,
    RateLimits,
    RunSpec,
    Session,
    ValidatorRegistry,
    default_session,
    set_default_session,
)
from .._textview import DEFAULT_LEDGER, advice_lines, forget_message, frame_lines, receipt_rows
from ..core import (
    PROVIDER_NAMES,
    advice_chart,
    batch_chart,
    ledger_path,
    looks_like_key,
    masked,
    parse_identity,
    provider_label,
    public_url,
    shown_value,
    status_summary,
    whole_argument,
)
from .display import ReceiptsView, StatusView, Table, TextLines, clip

# The code file of a notebook or IPython cell, as a validator's "where" records it:
# ipykernel's temporary file (a number) or IPython's <ipython-input-N-hash>.
_CELL_FILE = re.compile(r"\d+\.py|<ipython-input-\d+-[0-9a-f]+>")
MISSING = object()
RUN_OPTIONS = {option.name for option in fields(RunSpec)}  # the magic's options named so
SETTINGS = ("provider", "model", "ledger", "concurrency", "max_calls", "repairs", "replays",
            "strict", "rate_limits", "max_rate_wait")


class Count(Int):  # type: ignore[type-arg]
    """A whole number: a bool is an int to Python, never a count here."""

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, bool):
            self.error(obj, value)
        return super().validate(obj, value)


@magics_class
class BatchJson(Magics):
    """Configuration of the kernel's batchjson session (``%config BatchJson``)."""

    provider = AnyTrait(None, allow_none=True, help=(
        "'openai', 'anthropic', 'simulated', or a provider object (any name in the notebook's "
        "namespace: %config BatchJson.provider = my_model; one of your own class as "
        "ProviderHandle(my_model)). None uses BATCHJSON_PROVIDER. API keys are read from the "
        "environment, never from here.")).tag(config=True)
    model = Unicode(None, allow_none=True, help="Model name for a named provider.").tag(
        config=True)
    ledger = Unicode(DEFAULT_LEDGER, help=(
        "Ledger file; a relative path is under the working directory, ':memory:' keeps it in "
        "memory, a postgresql:// URL is a database runners on many hosts share. Changing it "
        "opens a new session on that ledger.")).tag(config=True)
    concurrency = Count(16, min=1, help="Calls in flight at once.").tag(config=True)
    max_calls = Count(None, allow_none=True, min=0, help=(
        "Default call ceiling per %%batch_json run (None: no ceiling).")).tag(config=True)
    repairs = Count(1, min=0, help="Repair calls per failing request.").tag(config=True)
    replays = Count(1, min=0, help="Exact replays per failing request.").tag(config=True)
    rate_limits = AnyTrait(None, allow_none=True, help=(
        "Requests and tokens per minute the session paces to, e.g. {'requests_per_minute': "
        "500, 'tokens_per_minute': 200000}; None learns them from the provider's rate-limit "
        "headers.")).tag(config=True)
    max_rate_wait = Float(60.0, help=(
        "The longest a run waits (seconds) on a rate limit that keeps refusing before it ends "
        "unresolved naming the limit, nothing lost (docs/providers.md).")).tag(config=True)
    strict = Bool(False, help=(
        "Refuse a changed validator while requests under the old one are unresolved. Changing "
        "it opens a new session.")).tag(config=True)
    transport = Enum(("live", "batch"), "live", help=(
        "'live' calls the provider now; 'batch' sends pending requests as provider batch jobs "
        "at batch prices: the cell returns a pending result and re-running it collects "
        "(docs/providers.md).")).tag(config=True)
    accept = Enum(("whole", "items"), "whole", help=(
        "'whole' commits a return only when every item passes; 'items' commits the items of a "
        "return that pass their schema and the validator and asks again for the others, once "
        "the return's JSON, coverage and identity hold whole (docs/design.md).")).tag(config=True)

    progress = Bool(True, help=(
        "Show each run's progress (tqdm: elapsed, rate, ETA, returns accepted and rejected, "
        "cost so far); False silences it.")).tag(config=True)
    _state: KernelState | None = None  # set once loaded: config during __init__ waits

    @validate("rate_limits")
    def _check_rate_limits(self, proposal: Any) -> Any:
        try:
            return RateLimits.of(proposal["value"]) or None
        except ValueError as exc:  # batchjson's ConfigError
            raise TraitError(f"BatchJson.rate_limits: {exc}") from None

    @validate("max_rate_wait")
    def _check_max_rate_wait(self, proposal: Any) -> Any:
        value = proposal["value"]
        if not (math.isfinite(value) and value > 0):
            raise TraitError(f"BatchJson.max_rate_wait must be a finite number of seconds > 0, "
                             f"got {value!r}; e.g. %config BatchJson.max_rate_wait = 120")
        return value

    @validate("provider")
    def _check_provider(self, proposal: Any) -> Any:
        """A name, or a provider object kept as itself: traitlets deep-copies config values,
        so an object whose deep copy is another object must come in a ``ProviderHandle``."""
        value = held = proposal["value"]
        if isinstance(held, ProviderHandle):
            value = held.provider
        if value is None:
            return None
        if isinstance(value, str):
            if value.strip().lower() not in PROVIDER_NAMES:
                raise TraitError(f"BatchJson.provider: unknown provider name {shown_value(value)}; "
                                 f"use one of {', '.join(PROVIDER_NAMES)} or a provider object")
            return value.strip().lower()
        kind = type(value).__name__
        if not callable(getattr(value, "complete", None)):
            raise TraitError(f"BatchJson.provider: a provider must be "
                             f"{', '.join(map(repr, PROVIDER_NAMES))} or an object with an async "
                             f"complete(call) method, got {kind}; wrap a plain function as "
                             "batchjson.CallableProvider(fn)")
        if value is held and deepcopy(value) is not value:
            raise TraitError(f"BatchJson.provider: IPython's config hands over a deep copy "
                             f"of each value, at every %config line, and a copy of a {kind} "
                             "would be another provider; give it as "
                             f"batchjson.ProviderHandle(obj), or give {kind} a __deepcopy__ "
                             "that returns self")
        return value

    @validate("model")
    def _check_model(self, proposal: Any) -> Any:
        """A key pasted as the model is refused, as ``OpenAIProvider(model=...)`` refuses it."""
        value = proposal["value"]
        if isinstance(value, str) and looks_like_key(value):
            raise TraitError(f"BatchJson.model: {masked(value)} looks like an API key, not a "
                             "model name; give the model's name (e.g. 'gpt-4o-mini') and keep "
                             "the key in the environment (OPENAI_API_KEY or ANTHROPIC_API_KEY)")
        return value

    @observe(*SETTINGS)
    def _setting_changed(self, change: Any) -> None:
        """Carry a change to the live session; if that fails, keep the old value and say why."""
        state = self._state
        if state is None:
            return
        try:
            state.apply(change["name"], change["new"], self.settings())
        except Exception as exc:
            self._state = None
            try:
                setattr(self, change["name"], change["old"])
            finally:
                self._state = state
            raise TraitError(f"BatchJson.{change['name']} = {shown(change['name'], change['new'])}"
                             f" was not applied: {type(exc).__name__}: {exc}") from exc

    def settings(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in SETTINGS}

    @property
    def session(self) -> Session:
        if self._state is None or self._state.session is None:
            raise UsageError("batchjson is not loaded: run %load_ext batchjson")
        return self._state.session

    # -- %%batch_json ----------------------------------------------------------------------------
    @magic_arguments()
    @argument("name", help="Batch name; the BatchResult is bound to this variable unless --out.")
    @argument("--tasks", metavar="EXPR", help="Task list (default: the variable `tasks`).")
    @argument("--schema", metavar="EXPR", help="Answer schema (default: the variable `schema`).")
    @argument("--validator", metavar="EXPR",
              help="validator(item, task); ValueError, a failed assert or False rejects.")
    @argument("--identity", metavar="a,b,c", help="Identity fields checked on every item.")
    @argument("--pack", type=whole_argument(1), metavar="N", default=1, help="Tasks per request.")
    @argument("--repairs", type=whole_argument(0), metavar="N", help="Repairs per failing request.")
    @argument("--replays", type=whole_argument(0), metavar="N", help="Exact replays per request.")
    @argument("--split", action="store_true", help="Halve requests that exhaust their retries.")
    @argument("--reask-refusals", action="store_true", dest="reask_refusals",
              help="Ask again when the model refuses (by default a refusal is not re-asked).")
    @argument("--max-calls", type=whole_argument(0), metavar="N", dest="max_calls",
              help="Call ceiling for this run.")
    @argument("--instructions", metavar="EXPR", help="Instructions string sent with each call.")
    @argument("--out", metavar="VAR", help="Variable for the BatchResult (default: NAME).")
    @argument("--transport", choices=("live", "batch"),
              help="live calls, or provider batch jobs (default: %%config BatchJson.transport).")
    @argument("--wait", action="store_true",
              help="With --transport batch: block until the jobs end (Ctrl-C leaves them "
              "running and recorded).")
    @argument("--estimate", action="store_true",
              help="Show what the run would send and spend (calls, tokens, cost, time, "
              "budget), sending and recording nothing.")
    @argument("--accept", choices=("whole", "items"),
              help="whole returns, or the items that pass (default: %%config BatchJson.accept).")
    @no_var_expand
    @cell_magic
    def batch_json(self, line: str, cell: str) -> None:
        """Run the cell body, then resolve batch NAME over `tasks` with `schema`.

        The validator the body defines is registered once (re-running an unchanged cell keeps
        the same object); other functions of the body are not validators. The BatchResult is
        bound to NAME (or --out VAR) and displayed; when the batch is unresolved a short
        failure report is shown instead of a traceback, and re-running the cell resumes,
        spending calls only on unresolved requests. ``--estimate`` shows what the run would
        send and spend instead, with nothing bound, registered, sent or recorded.
        """
        args = parse(self.batch_json, line, "%%", expr_options=True)
        if args is None:  # --help: its usage is printed, nothing runs
            return
        var = args.out or args.name
        check_result_variable(self.shell.user_ns, var, args.name, out=args.out is not None)
        # None: the default, task_id and every task field an item echoes
        identity = None if args.identity is None else identity_option(args.identity)
        if not cell.strip() and args.tasks is None:
            raise UsageError(f"%%batch_json {args.name}: the cell body is empty and no --tasks "
                             "was given; build `tasks` and `schema` in the cell body or pass "
                             "--tasks EXPR --schema EXPR")

        ns, shell = self.shell.user_ns, self.shell
        defined, assigned = run_body(shell, cell)
        stale = left_by_another_cell(assigned, tasks=args.tasks, schema=args.schema)
        tasks = evaluate(shell, "--tasks", args.tasks or "tasks", default=not args.tasks)
        schema = evaluate(shell, "--schema", args.schema or "schema", default=not args.schema)
        checker, events = evaluate(shell, "--validator", args.validator), []
        if not args.estimate:  # an estimate registers nothing: the run will
            with usage_errors():  # a strict session refusing a changed validator
                checker, events = define_once(self.session.validators, ns, defined, checker)
        for event in [*events, *stale]:
            print(f"batchjson: {event}")
        instructions = evaluate(shell, "--instructions", args.instructions)
        check_result_variable(ns, var, args.name, out=args.out is not None)  # the body's too
        spec = {k: v for k, v in vars(args).items() if k in RUN_OPTIONS}  # as parsed, but:
        spec.update(tasks=tasks, schema=schema, validator=checker, identity=identity,
                    instructions=instructions, on_exhausted="return", progress=self.progress,
                    **{k: getattr(self, k) for k in ("transport", "accept", "max_calls")
                       if spec[k] is None})  # %config's unless given
        if args.estimate:  # shown: nothing is bound, sent or recorded
            with usage_errors():
                display(self.session.estimate(**spec))
            return
        result, noted = self._resolve(**spec)
        result.notes[:0] = stale
        ns[var] = result
        self._show(result, announced=noted)
        if result.status == "unresolved":  # a pending result is no failure: re-run collects
            raise BatchUnresolved(result, unresolved_hint(result, var))

    def _show(self, result: Any, *, announced: bool) -> None:
        """A run's result as the cell shows it: its supersession unless announced, the result,
        a thrown-away answers' suggestion in this magic's options, and its chart."""
        if result.superseded and not announced:  # nothing was spent, so nothing was announced
            print(f"batchjson: {result.name}: {result.superseded}")
        display(result)
        if result.thrown_away is not None:  # the result's note, as this magic's options
            print(f"batchjson: {result.thrown_away.said('--accept items', '--split')}")
        if result.calls and (result.tokens or result.cost or len(result.values)):
            self._show_chart(result.plot)  # nothing spent or accepted is nothing to draw

    def _resolve(self, **spec: Any) -> tuple[Any, bool]:
        """The run of the one public description every face builds, and whether it said
        anything before spending (printed as it happened)."""
        session, noted = self.session, []

        def note(text: str) -> None:  # said before the new revision spends anything
            noted.append(text)
            print(f"batchjson: {text}", flush=True)

        previous_note, session.on_note = session.on_note, note
        try:
            with usage_errors():
                return session.run(RunSpec(**spec)), bool(noted)
        except KeyboardInterrupt as exc:
            print(f"batchjson: batch {spec['name']!r} interrupted. Receipts are kept (calls in "
                  "flight are marked cancelled) and nothing partial was committed; re-run the "
                  "cell to resume.", file=sys.stderr)
            raise BatchInterrupted() from exc
        finally:
            session.on_note = previous_note

    # -- inspection ------------------------------------------------------------------------------
    @magic_arguments()
    @argument("name", nargs="?", help="Only this batch (default: every batch in the ledger).")
    @line_magic
    def batch_status(self, line: str) -> StatusView | None:
        """What is still owed and what has been spent: unresolved and superseded requests,
        minimum exact retry calls, calls, cost so far and cost per usable result, and the
        batch jobs still open. A job that has ended is collected first, when this kernel
        knows its validator (else re-run its cell)."""
        args = parse(self.batch_status, line)
        if args is None:
            return None
        session, state = self.session, self._state
        if args.name is not None:
            self._known_batch(args.name)
            self._show_chart(lambda: batch_chart(session.ledger.attempts(args.name), args.name))
        return StatusView(status_summary(session.runtime(), args.name),
                          ledger=state.ledger_label(), provider=state.provider_label(),
                          owed=session.evidence.requests(args.name))

    @magic_arguments()
    @argument("name", help="Batch name.")
    @argument("--repairs", type=whole_argument(0), metavar="N",
              help="Repairs per failing request (default: the session's).")
    @argument("--replays", type=whole_argument(0), metavar="N",
              help="Exact replays per failing request (default: the session's).")
    @line_magic
    def batch_advise(self, line: str) -> TextLines | None:
        """Pack-size advice from the batch's receipts: cost per usable result against pack
        size with intervals from the returns' spread (a chart, then the text); another pack is
        recommended only when it is cheaper beyond that spread (docs/recovery.md)."""
        args = parse(self.batch_advise, line)
        if args is None:
            return None
        self._known_batch(args.name)
        options = {k: v for k, v in (("repairs", args.repairs), ("replays", args.replays))
                   if v is not None}
        with usage_errors(InvalidBatch):  # no judged return yet
            advice = self.session.advise(args.name, **options)
        self._show_chart(lambda: advice_chart(advice))
        return TextLines(advice, advice_lines(advice))

    @magic_arguments()
    @line_magic
    def validators(self, line: str) -> Table | None:
        """Validators: name, version, short fingerprint, where defined, batches using it."""
        if wants_help(self.validators, line):
            return None
        if line.strip():
            raise UsageError("%validators takes no arguments (%validators --help)")
        session = self.session
        rows: dict[tuple[str, str], list[Any]] = {}
        used: dict[str, str] = {}  # fingerprint -> batches with a revision under it
        for r in session.ledger.validator_usage():
            rows[(r["name"], r["fingerprint"])] = [r["name"], r["version"], r["fingerprint"][:12],
                                                   r["where_defined"] or "", "", ""]
            used[r["fingerprint"]] = ", ".join(r["batches"])
        for v in session.validators:
            rows[(v.name, v.fingerprint.digest)] = [v.name, v.version, v.fingerprint.short,
                                                    v.where, "", "yes"]
        # basename of a cell's code file -> "In[n]", as IPython names cells in tracebacks
        cells = {os.path.basename(str(k)): f"In[{v}]" for k, v in cell_files(self.shell).items()}
        for (_, digest), row in rows.items():
            row[4] = used.get(digest, "")
            filename, _, line_no = str(row[3]).rpartition(":")
            if filename in cells:
                row[3] = f"{cells[filename]}, line {line_no}"
            elif _CELL_FILE.fullmatch(filename):  # a cell of a kernel that is gone
                row[3] = f"an earlier kernel, line {line_no}"
        ordered = sorted(rows.values(), key=lambda row: (row[0], int(row[1])))
        return Table(f"validators ({len(session.validators)} current in this session)",
                     ["name", "version", "fingerprint", "where", "batches", "current"], ordered,
                     empty="no validators yet: the --validator of each %%batch_json cell "
                     "appears here")

    @magic_arguments()
    @argument("name", help="Batch name.")
    @argument("--failed", action="store_true", help="Only attempts that were not accepted.")
    @argument("--raw", action="store_true", help="Also show each raw return.")
    @argument("--page", type=whole_argument(1), default=1, metavar="N",
              help="Page to show (from 1).")
    @argument("--per-page", type=whole_argument(1), default=20, metavar="N", dest="per_page",
              help="Receipts per page (default 20).")
    @line_magic
    def batch_receipts(self, line: str) -> ReceiptsView | None:
        """Every attempt of a batch in call order, numbered 1..N, a page at a time: kind, status,
        tokens, cost and its errors in full (identity errors name the field and both values)."""
        args = parse(self.batch_receipts, line)
        if args is None:
            return None
        self._known_batch(args.name)
        numbered = receipt_rows(self.session.ledger.attempts(args.name), failed=args.failed,
                                raw=args.raw)
        start = (args.page - 1) * args.per_page
        hint = None
        if start + args.per_page < len(numbered):
            flags = "".join(f" {f}" for f, on in (("--failed", args.failed), ("--raw", args.raw))
                            if on)
            size = f" --per-page {args.per_page}" if args.per_page != 20 else ""
            hint = f"%batch_receipts {args.name}{flags}{size} --page {args.page + 1}"
        which = "failed attempts" if args.failed else "attempts"
        return ReceiptsView(f"{which} of batch {args.name!r} ({len(numbered)})",
                            numbered[start:start + args.per_page], page=args.page,
                            per_page=args.per_page, total=len(numbered), next_hint=hint)

    @magic_arguments()
    @argument("name", help="Batch name.")
    @line_magic
    def batch_forget(self, line: str) -> None:
        """Stop batch NAME (every revision of it) from owing calls: its unresolved requests no
        longer count in %batch_status. Its receipts and costs stay in the account, the
        forgetting is recorded (who, when) and shown by %batch_status, and later work on NAME
        (a run still going on, a later run, work merged in) owes again."""
        args = parse(self.batch_forget, line)
        if args is None:
            return
        self._known_batch(args.name)
        ledger = self.session.ledger
        record = ledger.forget(args.name, via="%batch_forget")
        print(f"batchjson: {forget_message(args.name, record, ledger.spend(args.name))}")

    def _show_chart(self, draw: Any) -> None:
        """Display the chart ``draw()`` makes where a front end can show a PNG; without
        matplotlib, one line says how to get it; nothing drawn yet is nothing shown."""
        if "image/png" not in self.shell.display_formatter.active_types:
            return  # a terminal shows no picture: nothing is drawn for it
        try:
            display(draw())
        except ConfigError as missing:  # batchjson[plots] is not installed
            print(f"batchjson: {missing}")
        except InvalidBatch:  # no call has finished yet
            pass

    def _known_batch(self, name: str) -> None:
        problem = self.session.ledger.no_such_batch(name)
        if problem:
            raise UsageError(problem)


# -- what a kernel keeps across %reset and %reload_ext -----------------------------------------
ATTRIBUTE = "_batchjson_state"
INJECTED = ("run_batch", "llm_batch_json", "validator", "batch_session")
REOPEN = ("ledger", "strict")


def resolve_ledger(setting: str) -> Path | str | None:
    """``:memory:`` (or empty) keeps the ledger in memory; a relative path is under the cwd; a
    postgresql:// URL is kept (any other URL refused, naming it masked)."""
    path = None if setting in ("", ":memory:") else ledger_path(setting)
    return path.absolute() if isinstance(path, Path) else path


class KernelState:
    """The kernel's one session, the settings it was opened with, and the names given out."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.session: Session | None = None
        self.settings: dict[str, Any] = {}
        self.names: dict[str, Any] = {}
        self.previous_default: Session | None = None
        self.magics: Any = None

    # -- session lifecycle ---------------------------------------------------------------------
    def attach(self, settings: dict[str, Any]) -> None:
        """Open the session on first load; on a later load apply what changed meanwhile."""
        if self.session is None:
            self.previous_default = default_session(create=False)
            self.open(settings)
        else:
            for name, value in settings.items():
                if not same(self.settings.get(name, MISSING), value):
                    self.apply(name, value, settings)
        set_default_session(self.session)
        self.inject()

    def open(self, settings: dict[str, Any]) -> None:
        """A new session on the configured ledger; the names handed out follow it."""
        old = self.session
        self.session = Session(ledger=resolve_ledger(settings["ledger"]), **{
            k: v for k, v in settings.items() if k not in ("ledger", "max_calls")})
        self.settings = dict(settings)
        session = self.session  # handed to a person (an RLM host's cells get tools, never it)
        previous_names, self.names = self.names, dict(zip(INJECTED, (
            session.run_batch, session.llm_batch_json, session.validators.define, session),
            strict=True))
        self.inject(replace=previous_names)
        if old is not None:
            if default_session(create=False) is old:
                set_default_session(self.session)
            old.close()

    def apply(self, name: str, value: Any, settings: dict[str, Any]) -> None:
        """Carry one changed setting to the live session (a new session for ledger/strict)."""
        if name in REOPEN:
            self.open(settings)
            return
        self.settings[name] = value
        if name == "max_rate_wait":  # read by each run as it starts
            self.session.transport.max_rate_wait = value
        elif name != "max_calls":  # max_calls is read by each %%batch_json run
            setattr(self.session, name, value)
            if name == "model":  # the provider is rebuilt with the new model
                self.session.provider = self.settings["provider"]

    # -- names in the user namespace -----------------------------------------------------------
    def inject(self, replace: dict[str, Any] | None = None) -> None:
        """Add missing names; with ``replace``, also swap names still bound to those objects."""
        ns = self.shell.user_ns
        for key, obj in self.names.items():
            current = ns.get(key, MISSING)
            if current is MISSING or (replace and current is replace.get(key)):
                ns[key] = obj

    def pre_run_cell(self, info: Any = None) -> None:
        """Re-add names a ``%reset`` (or ``del``) removed; never overwrite the user's own."""
        self.inject()

    def detach(self) -> None:
        """Take back the names still bound to what was given out, and the default session."""
        ns = self.shell.user_ns
        for key, obj in self.names.items():
            if ns.get(key, MISSING) is obj:
                del ns[key]
        if default_session(create=False) is self.session:
            set_default_session(self.previous_default)

    def ledger_label(self) -> str:
        assert self.session is not None
        path = self.session.ledger.path
        if path is None:  # in memory, or a database (its password masked)
            return self.session.ledger.where
        return str(self.settings.get("ledger") or path)  # as configured: no machine-local prefix

    def provider_label(self) -> str:
        """A name for the provider; never its configuration (API keys stay in the environment)."""
        spec = self.settings.get("provider")
        if spec is None:
            env = os.environ.get("BATCHJSON_PROVIDER", "").strip()
            return f"{env} (from BATCHJSON_PROVIDER)" if env else "not configured"
        return provider_label(spec)


def same(a: Any, b: Any) -> bool:
    """Identity for objects, equality for plain values (never calls a provider's __eq__)."""
    plain = (str, int, float, bool, type(None))
    return a is b or (type(a) is type(b) and isinstance(a, plain) and a == b)


# -- extension hooks ---------------------------------------------------------------------------
def load_ipython_extension(shell: Any) -> None:
    """Register the magics, open (or re-attach) the kernel's session and inject its names."""
    state = getattr(shell, ATTRIBUTE, None) or KernelState(shell)
    setattr(shell, ATTRIBUTE, state)
    if state.magics is not None:
        return  # already loaded: harmless
    refusal = _refused_setting(shell.config)
    if refusal is not None:
        raise UsageError(refusal)
    magics = BatchJson(shell=shell)  # IPython lists it among the configurables %config sets
    try:
        state.attach(magics.settings())
    except Exception:  # e.g. a configured ledger that cannot be opened: leave nothing behind
        shell.configurables.remove(magics)
        raise
    magics._state = state
    state.magics = magics
    shell.register_magics(magics)
    shell.events.register("pre_run_cell", state.pre_run_cell)
    if allow_empty_body not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(allow_empty_body)


def _refused_setting(config: Any) -> str | None:
    """What is wrong with the first ``c.BatchJson`` setting the shell's configuration holds
    that BatchJson refuses (each is tried alone, so the message names it), or None."""
    section = config.get("BatchJson") or {}
    for name in (name for name in SETTINGS if name in section):
        try:
            BatchJson(config=Config({"BatchJson": {name: section[name]}}))
        except Exception as refusal:  # a TraitError, or a value traitlets cannot deep-copy
            return (f"batchjson was not loaded: the IPython configuration sets c.BatchJson."
                    f"{name} = {shown(name, section[name])}, which is refused "
                    f"({type(refusal).__name__}: {one_line(refusal)}). Fix or remove it where "
                    "it is set (ipython_config.py, a kernel's config, or an earlier %config), or "
                    f"in this kernel with get_ipython().config.BatchJson.pop({name!r}), then run "
                    "%load_ext batchjson again")
    return None


def unload_ipython_extension(shell: Any) -> None:
    """Remove what loading added (only this instance's entries of the magics manager's tables:
    IPython cannot unregister magics); the session stays on the shell for a later load."""
    state = getattr(shell, ATTRIBUTE, None)
    if state is None or state.magics is None:
        return
    magics, manager = state.magics, shell.magics_manager
    for kind, table in magics.magics.items():
        for name, func in table.items():
            if manager.magics[kind].get(name) == func:
                del manager.magics[kind][name]
    if manager.registry.get(type(magics).__name__) is magics:
        del manager.registry[type(magics).__name__]
    if magics in shell.configurables:
        shell.configurables.remove(magics)
    if state.pre_run_cell in shell.events.callbacks["pre_run_cell"]:
        shell.events.unregister("pre_run_cell", state.pre_run_cell)
    while allow_empty_body in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.remove(allow_empty_body)
    state.detach()
    magics._state = None
    state.magics = None


def shown(name: str, value: Any) -> str:
    """A setting's value for a message: a string given as provider or model shaped like a
    pasted key shows only its first characters, and a ledger URL's password is masked."""
    if name in ("provider", "model") and isinstance(value, str):
        return clip(shown_value(value), 80)
    if name == "ledger" and isinstance(value, str):
        value = public_url(value, user=False)
    return clip(repr(value), 80)


# -- a %%batch_json cell: its body run, its functions define-once; and how the magics read their
# line: --help (usage printed, nothing run), the nearest real option for a mistyped one, and the
# variable a result may be bound to
_HEADER = re.compile(r"%%batch_json(\s|$)")


def allow_empty_body(lines: list[str]) -> list[str]:
    """Input transformer: IPython refuses an empty cell-magic body in generic words; one blank
    body line lets ``%%batch_json NAME --tasks EXPR`` run and the magic say what is missing."""
    if lines and _HEADER.match(lines[0]) and not "".join(lines[1:]).strip():
        return [lines[0].rstrip("\n") + "\n", "\n"]
    return lines


def identity_option(text: str) -> tuple[str, ...]:
    """``--identity a,b``'s field names, or a UsageError that shows the spelling to use.
    IPython keeps the quotes of a quoted option value; ``'a,b'`` names the fields a and b."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    try:
        return parse_identity(text, "--identity")
    except InvalidBatch as exc:
        raise UsageError(str(exc)) from None


def cell_files(shell: Any) -> dict[str, int]:
    """IPython's code file of each cell -> the cell's number, as its In[n] shows."""
    return getattr(getattr(shell, "compile", None), "_filename_map", None) or {}


def run_body(shell: Any, cell: str) -> tuple[list[str], set[str]]:
    """Run the body in the user namespace: (names it bound to functions it defined, every name it
    assigned, ``%run`` included). A leading blank line keeps traceback line numbers right."""
    source = "\n" + shell.transform_cell(cell)
    # the running cell's number: IPython 9 advances execution_count before a cell runs (8
    # after), and caches the cell under its own number first
    number = max(cell_files(shell).values(), default=shell.execution_count)
    filename = shell.compile.cache(source, number, raw_code="\n" + cell)
    code = shell.compile(source, filename, "exec")
    ns = shell.user_ns
    before = dict(ns)
    exec(code, shell.user_global_ns, ns)  # running the user's cell is the point
    rebound = {name for name, value in ns.items() if before.get(name, MISSING) is not value}
    return [name for name in rebound if inspect.isfunction(ns[name])
            and ns[name].__code__.co_filename == filename], rebound | {
        i.argval for i in dis.get_instructions(code) if i.opname == "STORE_NAME"}


def left_by_another_cell(assigned: set[str], **options: str | None) -> list[str]:
    """Each default variable (``tasks``, ``schema``) a run would read that this cell did not
    assign and no option named: another cell's, perhaps stale, said rather than used silently."""
    return [f"{name}: the notebook's `{name}`, not assigned in this cell"
            for name, option in options.items() if option is None and name not in assigned]


def define_once(registry: ValidatorRegistry, ns: dict[str, Any], names: list[str],
                validator: Any) -> tuple[Any, list[str]]:
    """(validator, messages worth saying): one the body defined (of ``names``) is registered and its
    variable rebound, so an unchanged re-run keeps ``id(fn)``; any other is left to the run."""
    name = next((n for n in names if ns[n] is validator), None)
    if validator is None or name is None:
        return validator, []
    definition = registry.register(validator, name=name)
    if definition.fn is not ns[name]:
        ns[name] = definition.fn
    news = definition.kind in ("changed", "reused") or definition.fingerprint.partial
    return definition.fn, [definition.message] if news else []


def evaluate(shell: Any, option: str, expr: str | None, *, default: bool = False) -> Any:
    """An option's EXPR in the user namespace (None when not given); failures become one-line
    UsageErrors."""
    if not expr:
        return None
    try:
        return eval(expr, shell.user_global_ns, shell.user_ns)  # the user's own expression
    except NameError as exc:
        raise UsageError(f"{exc}: build `{expr}` in the cell body or pass {option} EXPR"
                         if default else f"{option} {expr}: {exc}") from None
    except Exception as exc:  # any error in the user's expression, reported in one line
        raise UsageError(f"{option} {expr} failed: {type(exc).__name__}: {exc}") from None


def one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


@contextmanager
def usage_errors(refused: type[Exception] = BatchJsonError) -> Iterator[None]:
    """batchjson's refusal as the magic's one-line UsageError, not a traceback."""
    try:
        yield
    except refused as exc:
        raise UsageError(one_line(exc)) from None


def unresolved_hint(result: Any, var: str) -> str:
    """The magic's line under an unresolved batch: the failed requests are already on screen
    (the result's display), so the error says how to go on instead of listing them again."""
    crash = next((e for e in result.errors if e.get("type") == "validator_error"), None)
    if crash is not None:  # re-running cannot help: say what to fix first
        frames = frame_lines(crash, "    ")
        return (f"The validator itself failed ({one_line(crash.get('message', ''))[:300]});"
                " fix it and re-run: the paid answers are kept and judged again first. "
                f"{var}.failure_report() has the rest."
                + "\n  where it failed (the validator's own frames):\n" * bool(frames)
                + "\n".join(frames))
    return (f"The failed requests are listed with the result ({var}.failure_report() as text); "
            f"%batch_receipts {result.name} --failed shows every rejected return.")


class BatchInterrupted(KeyboardInterrupt):
    """The KeyboardInterrupt re-raised by ``%%batch_json``: the kernel sees an interrupt, the
    user sees the one line printed before it instead of a traceback through the event loop."""

    def _render_traceback_(self) -> list[str]:
        return ["KeyboardInterrupt"]


HELP = ("--help", "-h")
_NUMBER = re.compile(r"-\.?\d")


def wants_help(magic: Callable[..., Any], line: str, sigil: str = "%") -> bool:
    """Print the magic's usage and say True when its line asks for help: ``--help`` or ``-h``
    as an option, not as the value of one (``--instructions -h`` passes the EXPR ``-h``)."""
    parser = magic.parser  # type: ignore[attr-defined]
    words = arg_split(line, strict=False)
    valued = _valued_options(parser)
    if not any(word in HELP and not (i and words[i - 1] in valued)
               for i, word in enumerate(words)):
        return False
    text = parser.format_help()
    head, _, rest = text.partition("%")  # IPython's formatter starts "::\n\n  %name ..."
    print("usage: " + sigil + rest if head.strip(": \n") == "" else text)
    return True


def parse(magic: Callable[..., Any], line: str, sigil: str = "%", *,
          expr_options: bool = False) -> Namespace | None:
    """The magic's options, or None after ``--help``; an unknown option is named with the nearest
    real one; with ``expr_options`` stray words are explained (spaced fields, a flag's value)."""
    parser = magic.parser  # type: ignore[attr-defined]
    try:
        if wants_help(magic, line, sigil):
            return None
        words = _values_joined(arg_split(line), parser)
        return parser.parse_args(words)  # type: ignore[no-any-return]
    except ValueError as exc:  # the shell-style splitter's bare error for an unclosed quote
        fix = (", or build the value in the cell body and pass its name" if expr_options
               else "")
        raise UsageError(f"{sigil}{parser.prog} {line.strip()}: {exc} (a quote is opened and "
                         f"never closed); close the quote{fix}") from None
    except UsageError as exc:
        if "unrecognized arguments" not in str(exc):
            raise
        words = arg_split(line, strict=False)
        extra = parser.parse_known_args(_values_joined(words, parser))[1]
        unknown = next((w for w in extra if w.startswith("-") and w != "-"
                        and not _NUMBER.match(w)), None)
        if unknown is not None:
            raise UsageError(unknown_option(unknown, parser, sigil)) from None
        flag = _flag_given_a_value(words, extra, parser)
        if flag is not None:
            raise UsageError(f"{flag} is a flag and takes no value, so {extra[0]!r} was not "
                             f"read; write {flag} alone to turn it on, or leave it out") from None
        if not expr_options:
            raise
        spaced_identity(words, parser)
        raise UsageError(f"{one_line(exc)}. An option's EXPR may not contain spaces: build "
                         "the value in the cell body and pass its name, e.g. --tasks "
                         "my_tasks") from None


def _valued_options(parser: Any) -> set[str]:
    """The option strings that take a value (the word after one is that value)."""
    return {s for action in parser._actions if action.nargs != 0 for s in action.option_strings}


def _values_joined(words: list[str], parser: Any) -> list[str]:
    """``--instructions -h`` as ``--instructions=-h``: argparse would read a value that
    starts with ``-`` as an option of its own and say the option has no value."""
    valued, known = _valued_options(parser), {s for a in parser._actions
                                              for s in a.option_strings}
    out: list[str] = []
    for word in words:
        if (out and out[-1] in valued and word.startswith("-") and not word.startswith("--")
                and word not in known and not _NUMBER.match(word)):
            out[-1] = f"{out[-1]}={word}"
        else:
            out.append(word)
    return out


def _flag_given_a_value(words: list[str], extra: list[str], parser: Any) -> str | None:
    """The flag (``--split``) whose next word is the first one argparse could not place."""
    flags = {s for action in parser._actions if action.nargs == 0 for s in action.option_strings}
    return next((word for word, after in pairwise(words)
                 if word in flags and extra and after == extra[0]), None)


def unknown_option(word: str, parser: Any, sigil: str) -> str:
    """"unknown option --identiy (did you mean --identity?)", or the options there are."""
    given = word.split("=", 1)[0]
    options = [s for action in parser._actions for s in action.option_strings
               if s.startswith("--")] + ["--help"]
    names = {option.lstrip("-"): option for option in options}  # "--" would make all alike
    near = difflib.get_close_matches(given.lstrip("-"), list(names), n=1, cutoff=0.6)
    if near:
        return f"unknown option {given} (did you mean {names[near[0]]}?)"
    listed = f"; the options are {', '.join(options)}" if len(options) > 1 else ""
    return f"unknown option {given}{listed} ({sigil}{parser.prog} --help says what it takes)"


def spaced_identity(words: list[str], parser: Any) -> None:
    """``--identity task_id case_id``: when the words argparse could not place are exactly those
    after ``--identity``'s value (a space ended it), show the spelling with commas."""
    words = [part for word in words for part in (
        word.split("=", 1) if word.startswith("--identity=") else [word])]
    if "--identity" not in words:
        return
    extra = parser.parse_known_args(words)[1]
    after = words[words.index("--identity") + 1:]
    run = after[:next((i for i, w in enumerate(after) if w.startswith("-")), len(after))]
    if run[1:] != extra:
        return
    fields = identity_option(" ".join(run))  # names a field with spaces inside, if one is
    written = ",".join(fields)
    raise UsageError(f"--identity {' '.join(run)!r}: a space ends the option, so only "
                     f"{run[0]!r} was read; list the fields with commas and no spaces: write "
                     f"--identity {written}")


def check_result_variable(ns: Mapping[str, Any], var: str, name: str, *, out: bool) -> None:
    """The result's variable must be a free name or hold an earlier BatchResult: a result never
    replaces the user's data, nor shadows a builtin (the body's next run would call it)."""
    if not var.isidentifier() or keyword.iskeyword(var):
        raise UsageError(f"{var!r} is not a valid Python variable name for the result; "
                         + ("choose another --out" if out else "pass --out VAR"))
    fix = ("choose another --out VAR" if out else
           f"give the batch another name (%%batch_json {name}_results) or bind the result "
           "elsewhere with --out VAR")
    if var not in ns:
        if _is_builtin(ns, var):
            raise UsageError(f"`{var}` is a Python builtin, which the result of batch {name!r} "
                             f"would shadow (code calling {var} would get the result); {fix}. "
                             f"Nothing was run and `{var}` is unchanged")
        return
    if isinstance(ns[var], BatchResult):
        return
    raise UsageError(f"`{var}` holds {_described(ns[var])}, which the result of batch "
                     f"{name!r} would replace; {fix}. Nothing was run and `{var}` is unchanged")


def _is_builtin(ns: Mapping[str, Any], var: str) -> bool:
    """Whether code run in ``ns`` finds ``var`` among its builtins (Python's own, and what
    IPython adds there while a cell runs, such as ``display``)."""
    scope = ns.get("__builtins__", builtins)
    names = scope if isinstance(scope, Mapping) else vars(scope)
    return var in names or var in vars(builtins)


def _described(value: Any) -> str:
    kind = type(value).__name__
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return f"a {kind}"
    try:
        return f"a {kind} of {len(value):,} item(s)"
    except Exception:  # noqa: BLE001 - a __len__ that raises: the type says enough
        return f"a {kind}"
