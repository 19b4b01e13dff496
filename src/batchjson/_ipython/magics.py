"""``%load_ext batchjson``: the ``%%batch_json`` cell magic and its inspection line magics.

One session per kernel, configured by IPython's own ``%config BatchJson.*`` (a refused value is the
trait's ``TraitError``; the old value stays), held on the shell (:class:`KernelState`) so its ledger
connection and validator registry outlive ``%reset`` and ``%reload_ext``. Re-running a cell is safe:
its validator goes through the define-once registry, and identical work resumes from the ledger."""

from __future__ import annotations

import math
import os
import re
import sys
from copy import deepcopy
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from traitlets import Any as AnyTrait
from traitlets import Bool, Enum, Float, Int, TraitError, Unicode, observe, validate
from traitlets.config import Config

from .. import (
    BatchUnresolved,
    ConfigError,
    InvalidBatch,
    ProviderHandle,
    RateLimits,
    RunSpec,
    Session,
    default_session,
    set_default_session,
)
from .._textview import DEFAULT_LEDGER, advice_lines, forget_message, receipt_rows
from ..core import (
    PROVIDER_NAMES,
    advice_chart,
    batch_chart,
    looks_like_key,
    masked,
    provider_label,
    public_url,
    shown_value,
    status_summary,
    whole_argument,
)
from .cell import (
    BatchInterrupted,
    allow_empty_body,
    cell_files,
    check_result_variable,
    define_once,
    evaluate,
    identity_option,
    left_by_another_cell,
    one_line,
    parse,
    run_body,
    unresolved_hint,
    usage_errors,
    wants_help,
)
from .display import ReceiptsView, StatusView, Table, TextLines, clip

# The code file of a notebook or IPython cell, as a validator's "where" records it:
# ipykernel's temporary file (a number) or IPython's <ipython-input-N-hash>.
_CELL_FILE = re.compile(r"\d+\.py|<ipython-input-\d+-[0-9a-f]+>")
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

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        self._state: KernelState | None = None  # set once loaded; config during init waits
        super().__init__(shell=shell, **kwargs)

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
        spec = dict(
            name=args.name, tasks=tasks, schema=schema, validator=checker, identity=identity,
            pack=args.pack, instructions=instructions, repairs=args.repairs,
            replays=args.replays, split=args.split, on_exhausted="return",
            reask_refusals=args.reask_refusals, wait=args.wait, progress=self.progress,
            **{k: getattr(self, k) if getattr(args, k) is None else getattr(args, k)
               for k in ("transport", "accept", "max_calls")})  # else %config's
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
MEMORY = ":memory:"


def resolve_ledger(setting: str) -> Path | None:
    """``:memory:`` (or empty) keeps the ledger in memory; a relative path is under the cwd."""
    if not setting or setting == MEMORY:
        return None
    if "://" in setting:  # a URL: a postgresql:// database, or refused naming it (masked)
        return setting  # type: ignore[return-value]
    path = Path(setting).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


class KernelState:
    """The kernel's one session, the settings it was opened with, and the names given out."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.session: Session | None = None
        self.settings: dict[str, Any] = {}
        self.names: dict[str, Any] = {}
        self.previous_default: Session | None = None
        self.magics: Any = None

    @classmethod
    def of(cls, shell: Any, *, create: bool = True) -> KernelState | None:
        state = getattr(shell, ATTRIBUTE, None)
        if state is None and create:
            state = cls(shell)
            setattr(shell, ATTRIBUTE, state)
        return state

    # -- session lifecycle ---------------------------------------------------------------------
    def attach(self, settings: dict[str, Any]) -> Session:
        """Open the session on first load; on a later load apply what changed meanwhile."""
        if self.session is None:
            self.previous_default = default_session(create=False)
            self.open(settings)
        else:
            for name, value in settings.items():
                if not same(self.settings.get(name, _MISSING), value):
                    self.apply(name, value, settings)
        assert self.session is not None
        set_default_session(self.session)
        self.inject()
        return self.session

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
        if self.session is None:
            return
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
            current = ns.get(key, _MISSING)
            if current is _MISSING or (replace and current is replace.get(key)):
                ns[key] = obj

    def pre_run_cell(self, info: Any = None) -> None:
        """Re-add names a ``%reset`` (or ``del``) removed; never overwrite the user's own."""
        self.inject()

    def detach(self) -> None:
        """Take back the names still bound to what was given out, and the default session."""
        ns = self.shell.user_ns
        for key, obj in self.names.items():
            if ns.get(key, _MISSING) is obj:
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


_MISSING = object()


def same(a: Any, b: Any) -> bool:
    """Identity for objects, equality for plain values (never calls a provider's __eq__)."""
    plain = (str, int, float, bool, type(None))
    return a is b or (type(a) is type(b) and isinstance(a, plain) and a == b)


# -- extension hooks ---------------------------------------------------------------------------
def load_ipython_extension(shell: Any) -> None:
    """Register the magics, open (or re-attach) the kernel's session and inject its names."""
    state = KernelState.of(shell)
    assert state is not None
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
    state = KernelState.of(shell, create=False)
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
