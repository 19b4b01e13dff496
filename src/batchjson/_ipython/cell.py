"""A ``%%batch_json`` cell: its body run and its functions made define-once; and how the magics
read their line: ``--help`` (usage printed, nothing run), the nearest real option for a mistyped
one, and the variable a result may be bound to."""

from __future__ import annotations

import builtins
import difflib
import dis
import inspect
import keyword
import re
from argparse import Namespace
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

from IPython.core.error import UsageError
from IPython.utils.process import arg_split

from .. import BatchJsonError, BatchResult, InvalidBatch, ValidatorRegistry
from .._textview import frame_lines
from ..core import parse_identity

_MISSING = object()
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
    rebound = {name for name, value in ns.items() if before.get(name, _MISSING) is not value}
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
