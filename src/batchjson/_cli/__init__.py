"""batchjson's command line: run the demo, read a ledger, import, merge, export and advise.

Every subcommand takes --ledger PATH or a postgresql:// URL (default .batchjson/ledger.sqlite,
the notebook default; a URL's password is never shown) and --json (one JSON document on stdout
for scripts; human tables otherwise).

Exit codes: 0 the command did its work (status reported, whatever the batches hold); 1 a batch
the command ran or imported ended unresolved or was kept as diagnostic; 2 usage (bad arguments,
an unknown batch, an unreadable import file); 3 a ledger problem (missing, not a ledger, newer
schema); 130 interrupted. A closed pipe (| head) ends quietly with 0.

Import and merge take ``--validator [NAME=]module:function``: the receipts of a batch that ran
with a validator are rechecked by it (a validator is code no file carries).
"""
# The command-line face (its docstring is `batchjson --help`): never imports the IPython face.

from __future__ import annotations

import argparse
import csv
import importlib
import json
import os
import shlex
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, TextIO

from .. import (
    BatchJsonError,
    ConfigError,
    FaultPlan,
    InvalidBatch,
    Ledger,
    LedgerError,
    Session,
    SimulatedModel,
)
from .. import _textview as cliview
from .._textview import forget_message
from ..core import (
    advice_chart,
    cancel_job,
    cost_value,
    ledger_path,
    list_jobs,
    money,
    pending_jobs,
    public_url,
    whole_argument,
)
from ..core import file_problem as ledger_problem

DEFAULT_LEDGER = Path(cliview.DEFAULT_LEDGER)
OK, UNRESOLVED, USAGE, LEDGER, INTERRUPTED = 0, 1, 2, 3, 130


class Problem(Exception):
    """A refusal with its exit code; printed as one line, never a traceback."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# -- commands -------------------------------------------------------------------------------
def ledger_argument(text: str) -> Path | str:
    """``--ledger``: a file path, or a PostgreSQL URL kept as written."""
    return text if isinstance(ledger_path(text), str) else Path(text)


def shown(ledger: Path | str) -> str:
    """The ledger as the command line prints it: a URL's password masked."""
    return public_url(ledger, user=False) if isinstance(ledger, str) else str(ledger)


@contextmanager
def _opened(path: Path | str, name: str | None = None, *,
            create: bool = False) -> Iterator[Ledger]:
    """The ledger at ``path``, open while a command reads it; ``name``: a batch it must hold."""
    # a database's server says what is wrong with it, if anything is
    problem = None if isinstance(path, str) else ledger_problem(path, create=create)
    if problem and not path.exists():  # say what to do, for the path given or the default
        problem += ("; a batch run in this directory makes it (batchjson demo shows how), or "
                    "pass --ledger PATH to read another" if path == DEFAULT_LEDGER else
                    "; check the path given to --ledger (a ledger is made by the first batch "
                    "run on it)")
    if problem:
        raise Problem(problem, LEDGER)
    with refused_as(LedgerError, LEDGER):  # one another process is creating is waited for
        held = Ledger(path)
    with closing(held):
        problem = held.no_such_batch(name) if name is not None else None
        if problem:
            raise Problem(problem, USAGE)
        yield held


@contextmanager
def refused_as(refused: type[Exception], code: int) -> Iterator[None]:
    """A refusal of the ``refused`` kind ends the command with ``code``, said in one line."""
    try:
        yield
    except refused as exc:
        raise Problem(str(exc), code) from None


def _dump(obj: Any, out: TextIO) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False), file=out)


def _done(args: argparse.Namespace, out: TextIO, data: Any, lines: Sequence[str],
          code: int = OK) -> int:
    """Print ``data`` as JSON (``--json``) or ``lines`` for a person (names and returns from a
    ledger or an import file never act on the terminal: escapes are shown, not sent); the code."""
    if args.json:
        _dump(data, out)
    else:
        print("\n".join(map(cliview.printable, lines)), file=out)
    return code


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    with _opened(args.ledger, args.name) as held:
        summary = held.cost_summary(args.name)
        evidence = held.evidence(args.name)
        summary["jobs"] = pending_jobs(held, args.name)  # each provider asked, briefly
    for key in ("unresolved_batches", "unresolved_requests", "unresolved_items",
                "minimum_exact_retry_calls", "refused_requests", "cut_off_requests",
                "superseded", "forgotten", "owing_batches"):
        summary[key] = evidence[key]
    summary["ledger"] = shown(args.ledger)
    return _done(args, out, summary,
                 cliview.status_lines(summary, shown(args.ledger), command_name()))


def cmd_receipts(args: argparse.Namespace, out: TextIO) -> int:
    with _opened(args.ledger, args.name) as held:
        rows = cliview.receipt_rows(held.attempts(args.name), failed=args.failed, raw=args.raw)
    return _done(args, out, rows, cliview.receipt_lines(args.name, rows, args.failed))


def _one_format(args: argparse.Namespace, other: str) -> None:
    if args.json and getattr(args, other):
        raise Problem(f"--json and --{other} ask for two formats: give one", USAGE)


def cmd_values(args: argparse.Namespace, out: TextIO) -> int:
    _one_format(args, "csv")
    if args.json and args.identity:
        raise Problem("--identity adds columns to --csv or fields to JSON Lines; drop --json",
                      USAGE)
    with _opened(args.ledger, args.name) as held:
        values = held.checkpoint(args.name)
        fields, tasks = _identity(held, args.name) if args.identity else ([], {})
    if args.json:
        _dump(values, out)
    elif args.csv:
        rows = {task_id: v if isinstance(v, dict) else {"value": v}
                for task_id, v in values.items()}
        columns = [k for k in dict.fromkeys(k for v in rows.values() for k in v)
                   if k != "task_id" and k not in fields]
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["task_id", *fields, *columns])
        for task_id, v in rows.items():
            task = tasks.get(task_id, {})
            writer.writerow([_cell(task_id), *(_cell(task.get(k)) for k in fields),
                             *(_cell(v.get(k)) for k in columns)])
    else:
        for task_id, v in values.items():
            line = {"task_id": task_id, "value": v}
            if args.identity:
                line["identity"] = {k: tasks.get(task_id, {}).get(k) for k in fields}
            print(json.dumps(line, ensure_ascii=False), file=out)
    return OK


def _identity(held: Ledger, name: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The identity fields of the batch's current revision besides task_id (under the default
    identity: every task field but prompt and context) and its tasks, for ``--identity``."""
    rule, tasks = "task_id", {}
    for current in held.revisions(name, current=True):  # its rule as its key says it
        rule = current.components.get("identity", rule)  # ("task_id,case_id", ...)
        tasks = {t["task_id"]: t for r in held.leaves(current.id) for t in r.tasks}
    if rule.endswith("+echoed"):
        fields = list(dict.fromkeys(k for t in tasks.values() for k in t))
        fields = [k for k in fields if k not in ("task_id", "prompt", "context")]
    else:
        fields = [k for k in rule.split(",") if k != "task_id"]
    return fields, tasks


# What a spreadsheet reads as the start of a formula (OWASP, "CSV Injection"): a cell of text
# that starts so is written after a single quote, which a spreadsheet shows as text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    """A CSV cell: text as itself, after a ``'`` if a spreadsheet would run it as a formula;
    anything else as JSON (a digit, bracket, letter or a number's ``-`` first)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    _one_format(args, "jsonl")
    with _opened(args.ledger, args.batch) as held:
        receipts = held.export_receipts(args.batch)
    if args.jsonl:
        out.writelines(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in receipts)
    else:
        _dump({"ledger": shown(args.ledger), "receipts": receipts}, out)
    return OK


def cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    if not args.file.is_file():  # checked before a ledger is created for it
        raise Problem(f"no receipts file at {args.file}", USAGE)
    from ..core import read_lines

    given = dict(args.validator)
    with refused_as(InvalidBatch, USAGE):  # a bad file is refused before a ledger is made for it
        read_lines(args.file, given, args.without_validator)
    with _opened(args.ledger, create=True) as held, refused_as(InvalidBatch, USAGE):
        report = held.import_receipts(args.file, validators=given,
                                      without_validator=args.without_validator)
    kept = report["diagnostic"] + report["rejected"] + report["unverified"]
    return _done(args, out, report, cliview.import_lines(report), UNRESOLVED if kept else OK)


def cmd_merge(args: argparse.Namespace, out: TextIO) -> int:
    if not isinstance(args.other, str):  # a database is read as it is, or refused by the merge
        if not args.other.exists() or args.other.is_dir():  # the hint is about OTHER
            raise Problem(f"no ledger to merge at {args.other}"
                          + (" (a directory: name the ledger file inside it)"
                             if args.other.is_dir() else ""), LEDGER)
        problem = ledger_problem(args.other)  # checked before a ledger is made to receive it
        if problem:
            raise Problem(problem, LEDGER)
    with _opened(args.ledger, create=True) as held, refused_as(LedgerError, LEDGER):
        report = held.merge(args.other, validators=dict(args.validator))
    added, refused = report["added"], report["not_admitted"]
    completed = added.get("attempts_completed", 0)
    new = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in added.items()
                    if v and k != "attempts_completed")
    return _done(args, out, report, [
        f"merged {report['source']} into {shown(args.ledger)}: "
        + (f"added {new}" if new else "nothing new")
        + f"; {report['attempts_already_present']} attempt(s) were already here"
        + (f", {completed} of them completed by this merge" if completed else ""),
        *(f"  NOT ADMITTED: batch {r['batch']!r}"
          + (f", attempt {r['uid']}" if r["uid"] else "") + f": {r['reason']}"
          for r in refused)], UNRESOLVED if refused else OK)


def cmd_advise(args: argparse.Namespace, out: TextIO) -> int:
    from ..core import advise

    with _opened(args.ledger, args.name) as held:
        with refused_as(InvalidBatch, USAGE):
            advice = advise(held, args.name, repairs=args.repairs, replays=args.replays)
    code = _done(args, out, advice, cliview.advice_lines(advice))
    if args.plot is not None:  # after the text: without matplotlib, the advice is still said
        try:
            advice_chart(advice).save(args.plot)
        except ConfigError as missing:
            raise Problem(f"{missing}; {args.plot} was not written", USAGE) from None
        except OSError as exc:
            raise Problem(f"cannot write the chart to {args.plot}: {exc.strerror}",
                          USAGE) from None
        if not args.json:
            print(f"chart written to {args.plot}", file=out)
    return code


def cmd_forget(args: argparse.Namespace, out: TextIO) -> int:
    with _opened(args.ledger, args.name) as held:
        record = held.forget(args.name, via="batchjson forget")
        spend = held.spend(args.name)
    return _done(args, out, {"batch": args.name, "forgotten": record},
                 [forget_message(args.name, record, spend)])


def cmd_budget(args: argparse.Namespace, out: TextIO) -> int:
    if args.cost is not None and args.clear:
        raise Problem("--cost sets the budget and --clear removes it: give one", USAGE)
    with _opened(args.ledger, create=args.cost is not None) as held:
        if args.cost is not None or args.clear:
            held.set_budget(None if args.clear else args.cost)
        budget = held.budget()
    return _done(args, out, {"ledger": shown(args.ledger), "budget": budget},
                 [cliview.budget_line(budget)])


def cmd_jobs(args: argparse.Namespace, out: TextIO) -> int:
    """``jobs`` lists the ledger's batch jobs; ``cancel JOB`` cancels one and records it."""
    with _opened(args.ledger) as held:
        if args.command == "cancel":
            job = cancel_job(held, args.job)
            data, lines = {"cancelled": job}, [cliview.cancel_line(job)]
        else:
            jobs = list_jobs(held, every=args.all)
            data, lines = {"jobs": jobs}, cliview.job_lines(jobs, every=args.all)
    return _done(args, out, data, lines)


def _usd_argument(text: str) -> float:
    try:
        return cost_value(float(text)) or 0.0
    except (ValueError, InvalidBatch):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cost in USD: give a finite number >= 0, e.g. --cost 50") from None


# -- batchjson demo: a faulty offline batch run end to end, then resumed with zero calls ------
DEMO_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["verdict", "confidence"],
}
DEMO_IDENTITY = ("task_id", "case_id", "candidate_id")


def demo_tasks(cases: int = 4, per_case: int = 15) -> list[dict]:
    """Review candidates shaped like the seed's: identity travels in three fields."""
    tasks = []
    for c in range(cases):
        case = f"gold-pair-{78 + c:03d}"
        for k in range(per_case):
            candidate = f"{case}-candidate-{127 + k}"
            tasks.append({"task_id": f"{case}::{candidate}", "case_id": case,
                          "candidate_id": candidate,
                          "prompt": f"Is {candidate} the same entity as {case}?"})
    return tasks


# The faults are drawn from the seed and each request's key: with this one the first run shows
# identity swaps and malformed JSON caught, each request tried again until all 60 tasks resolve.
DEMO_SEED = 0


def demo_answer(task: dict) -> dict:
    number = int(task["candidate_id"].rsplit("-", 1)[1])
    return {"verdict": "match" if number % 3 == 0 else "no_match",
            "confidence": round(0.5 + (number % 5) / 10, 2)}


def demo_model(seed: int):  # noqa: ANN201 - returns a SimulatedModel
    faults = FaultPlan(identity_swap=0.2, malformed_json=0.1, missing_item=0.05,
                       non_finite=0.05, clean_after=3)
    return SimulatedModel(answer=demo_answer, faults=faults, seed=seed, model="gpt-4o-mini",
                          price_per_million=(0.15, 0.60))


def command_name() -> str:
    """How to run this batchjson from here: ``batchjson`` when that is what the shell finds
    (an activated venv), else its path (``make demo`` runs .venv/bin/python, not on PATH)."""
    script = Path(sys.executable).parent / "batchjson"
    if not script.exists():
        return f"{shlex.quote(sys.executable)} -m batchjson"
    found = shutil.which("batchjson")
    if found and Path(found).absolute() == script.absolute():
        return "batchjson"
    relative = os.path.relpath(script.absolute())
    return shlex.quote(relative if not relative.startswith("..") else str(script.absolute()))


def demo_ledger_problem(ledger: Path) -> str | None:
    """The demo starts from an empty ledger, so it only ever clears one it wrote itself."""
    if not ledger.exists():
        return None
    problem = ledger_problem(ledger)
    if problem is None:
        with closing(Ledger(ledger)) as held:
            others = [n for n in held.batch_names() if n != "review"]
            # A batch of one's own may well be called "review": it is the demo's only if every
            # attempt is the offline model's, made by a run, on the demo's tasks.
            ids = {t["task_id"] for t in demo_tasks()}
            foreign = [r for r in (held.attempts("review") if not others else [])
                       if r.provider != "simulated" or r.kind == "import"
                       or not set(r.task_ids) <= ids]
        if not others and not foreign:
            return None
        problem = (f"{ledger} holds batches other than the demo's ({', '.join(others)})" if others
                   else f"{ledger} holds a batch 'review' that is not the demo's ({len(foreign)} "
                   "attempt(s) of other tasks, models or imports)")
    return (f"{problem}. The demo starts from an empty ledger and would clear this one: pass "
            "--ledger with a new path")


def _demo_check(item: dict, task: dict) -> None:
    if item["verdict"] == "match" and item["confidence"] < 0.5:
        raise ValueError("a match needs confidence >= 0.5")


def _review(session: Session, tasks: list[dict]) -> Any:
    return session.run_batch("review", tasks, DEMO_SCHEMA, validator=_demo_check,
                             identity=DEMO_IDENTITY, pack=5, split=True, on_exhausted="return")


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    ledger, seed = args.ledger, args.seed
    problem = demo_ledger_problem(ledger)
    if problem:
        raise Problem(problem, USAGE)
    if ledger.exists():  # a previous demo's ledger
        for suffix in ("", "-wal", "-shm"):
            Path(str(ledger) + suffix).unlink(missing_ok=True)
    tasks = demo_tasks()
    say = (lambda *a: None) if args.json else (lambda text="": print(text, file=out))
    say(f"batchjson demo: {len(tasks)} review tasks in requests of 5, answered by an offline "
        "model that injects identity swaps, malformed JSON, missing items and NaN")
    say(f"ledger: {ledger}\n")
    with closing(Session(demo_model(seed), ledger=ledger, repairs=1, replays=2)) as session:
        first = _review(session, tasks)
        errors = [e for r in session.ledger.attempts("review", failed=True) for e in r.errors]
    kinds = Counter(e["type"] for e in errors)
    swap = next((cliview.describe_error(e) for e in errors if e["type"] == "identity"), None)
    with closing(Session(demo_model(seed), ledger=ledger)) as again:
        second = _review(again, tasks)
    code = 0 if first.resolved and second.calls == 0 else 1  # the CLI's exit codes
    if args.json:
        print(json.dumps({"ledger": str(ledger), "first": first.summary(),
                          "second": second.summary(), "rejected_errors_by_type": kinds},
                         indent=2, sort_keys=True), file=out)
        return code
    for label, r in (("first run ", first), ("second run", second)):
        say(f"{label}  {r.status}: {len(r.values)}/{r.total_tasks} tasks answered; "
            f"{r.calls} call(s): {r.accepted_returns} returns accepted, {r.rejected_returns} "
            f"rejected, {r.provider_errors} provider error(s); {r.tokens} tokens, "
            f"{money(r.cost)}")
    listed = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
    say(f"  rejected returns kept as failure receipts; their errors by type: {listed}")
    if swap:
        say("\n".join(cliview.wrapped(swap, "  e.g. ")))
    say(f"  the second run resumed every request from the ledger: {second.calls} new call(s)")
    flag = ("" if str(ledger) == cliview.DEFAULT_LEDGER
            else f" --ledger {shlex.quote(str(ledger))}")
    me = command_name()
    say("\nnext:")
    for command, why in ((f"{me} status{flag}", "calls, tokens and cost, per batch"),
                         (f"{me} receipts review --failed{flag}",
                          "every rejected return and why"),
                         (f"{me} values review --csv{flag}", "the accepted answers"),
                         (f"{me} advise review{flag}", "the cheapest pack size")):
        say(f"  {command.ljust(58)} {why}")
    return code


# -- the parser -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchjson", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, helptext: str, fn: Callable[..., int], *,
                batch: bool = False) -> argparse.ArgumentParser:
        """A subcommand with --ledger and --json, and with ``batch`` a batch NAME."""
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument("--ledger", type=ledger_argument, default=DEFAULT_LEDGER,
                       metavar="PATH|URL", help=f"ledger file or postgresql:// URL (default "
                       f"{DEFAULT_LEDGER})")
        p.add_argument("--json", action="store_true",
                       help="print one JSON document for scripts instead of tables")
        if batch:
            p.add_argument("name", help="batch name")
        p.set_defaults(run=fn)
        return p

    demo = command("demo", "run a faulty offline batch end to end, then resume it", cmd_demo)
    demo.add_argument("--seed", type=int, default=DEMO_SEED,
                      help=f"fault seed (default {DEMO_SEED})")
    status = command("status", "calls, tokens and cost of every attempt, per batch and total",
                     cmd_status)
    status.add_argument("name", nargs="?", help="only this batch (default: every batch)")
    receipts = command("receipts", "the attempts of one batch, numbered 1..N in call order",
                       cmd_receipts, batch=True)
    receipts.add_argument("--failed", action="store_true", help="only attempts not accepted")
    receipts.add_argument("--raw", action="store_true", help="include each raw return")
    values = command("values", "the accepted values of one batch (JSON Lines, or --csv)",
                     cmd_values, batch=True)
    values.add_argument("--csv", action="store_true", help="CSV with a column per field")
    values.add_argument("--identity", action="store_true",
                        help="add each task's identity fields (case_id, ...) after task_id: "
                        "those the batch listed, else every task field but prompt and context")
    export = command("export", "every receipt in batchjson's importable format", cmd_export)
    export.add_argument("--jsonl", action="store_true",
                        help="one receipt per line (`batchjson import` reads this and the "
                        "default JSON document alike)")
    export.add_argument("--batch", metavar="NAME", help="only this batch")
    _ledger_changing(command)
    sub.add_parser("serve", help="the loopback OpenAI/Anthropic test server "
                   "(batchjson serve --help lists its options)")
    return parser


def _ledger_changing(command: Callable[..., argparse.ArgumentParser]) -> None:
    """The commands that change a ledger (and advise and jobs, beside them)."""
    imp = command("import", "import historical receipts (JSONL), rechecking every item",
                  cmd_import)
    imp.add_argument("file", type=Path, help="JSON Lines file, one receipt per line, or the "
                     "JSON document `batchjson export` prints")
    validator_options(imp)
    imp.add_argument("--without-validator", action="store_true",
                     help="import receipts whose validator is not given, kept unverified: "
                     "shown and exported, never admitted")
    merge = command("merge", "bring another ledger's batches and attempts into this one",
                    cmd_merge)
    merge.add_argument("other", type=ledger_argument,
                       help="the other ledger: a file or a postgresql:// URL")
    validator_options(merge)
    advise = command("advise", "pack-size advice from the batch's observed faults and tokens",
                     cmd_advise, batch=True)
    advise.add_argument("--repairs", type=whole_argument(0), default=1, metavar="N",
                        help="repair calls per failing request (default 1)")
    advise.add_argument("--replays", type=whole_argument(0), default=1, metavar="N",
                        help="exact replays per failing request (default 1)")
    advise.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also write the chart of cost per usable result against pack "
                        "size, with its intervals (needs batchjson[plots])")
    command("forget", "stop a batch's unresolved requests from being owed (its receipts and "
            "costs stay; later work on it owes again)", cmd_forget, batch=True)
    budget = command("budget", "the ledger's own cost budget, held by every runner on it "
                     "together (show it, set it with --cost, remove it with --clear)",
                     cmd_budget)
    budget.add_argument("--cost", type=_usd_argument, metavar="USD",
                        help="set the ceiling in USD (what was spent under it still counts)")
    budget.add_argument("--clear", action="store_true", help="remove the budget")
    command("jobs", "provider batch jobs still open: provider, id, requests, counts, age, "
            "reserved cost", cmd_jobs).add_argument("--all", action="store_true",
                                                   help="every job, ended ones too")
    command("cancel", "cancel one batch job at its provider and record it (what ended is "
            "still collected; the rest is owed again)", cmd_jobs).add_argument(
        "job", help="the job's number, or its provider id")


def _main(argv: list[str], out: TextIO) -> int:
    if argv[:1] == ["serve"]:  # the server owns its options (--port, --latency, faults)
        from ..testing.server import main as serve_main

        return serve_main(argv[1:], prog="batchjson serve") or 0
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args, out)
    except Problem as exc:
        print(f"batchjson {args.command}: error: {exc}", file=sys.stderr)
        return exc.code
    except LedgerError as exc:  # e.g. a read-only or vanished ledger
        print(f"batchjson {args.command}: ledger error: {exc}", file=sys.stderr)
        return LEDGER
    except BatchJsonError as exc:
        print(f"batchjson {args.command}: error: {exc}", file=sys.stderr)
        return USAGE


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point: exit codes as documented above; no traceback on a closed pipe or Ctrl-C."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):  # a lone surrogate in any text (JSON, CSV, an
        if hasattr(stream, "reconfigure"):  # error) is written as \udXXX: JSON's own escape
            stream.reconfigure(errors="backslashreplace")
    try:
        code = _main(args_in, out or sys.stdout)
        (out or sys.stdout).flush()
        return code
    except BrokenPipeError:
        # The reader went away (| head): say nothing, and keep Python's exit flush quiet too.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return OK
    except KeyboardInterrupt:
        if args_in[:1] in (["import"], ["merge"]):  # one transaction: rolled back whole
            done = {"import": "imported", "merge": "merged"}[args_in[0]]
            print(f"batchjson: interrupted; nothing was {done} (it is one transaction), "
                  "run it again", file=sys.stderr)
        else:
            print("batchjson: interrupted; receipts written so far are kept, re-run to resume",
                  file=sys.stderr)
        return INTERRUPTED


def validator_argument(text: str) -> tuple[str, Callable[..., Any]]:
    """``--validator [NAME=]module:function``: the function (its module found from the current
    directory too), under NAME, else its own name."""
    name, _, where = text.rpartition("=")
    module, _, attr = where.partition(":")
    if not module or not attr:
        raise argparse.ArgumentTypeError(f"expected [NAME=]module:function, got {text!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # the user's module: whatever it raises is why it cannot load
        raise argparse.ArgumentTypeError(f"cannot load validator {where!r}: "
                                         f"{type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise argparse.ArgumentTypeError(f"{where!r} is not a function")
    return name or getattr(fn, "__name__", attr), fn


def validator_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--validator", type=validator_argument, action="append", default=[],
                        metavar="[NAME=]MODULE:FUNCTION",
                        help="the validator a batch ran with, rerun on its receipts "
                        "(repeatable; NAME defaults to the function's name)")
