"""How the magics read their line: ``--help`` (usage printed, nothing run), the nearest real option
for a mistyped one, and the variable a result may be bound to."""

from __future__ import annotations

import builtins
import difflib
import re
from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.utils.process import arg_split

from .. import BatchResult
from .cell import identity_option, one_line

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
    """The magic's options, or None after ``--help``. An unknown option is named with the nearest
    real one; with ``expr_options``, stray words are explained (spaced identity fields, a flag's
    value)."""
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
    for i, word in enumerate(words[:-1]):
        if word in flags and extra and words[i + 1] == extra[0]:
            return word
    return None


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
    """``--identity task_id case_id``: a space ended the value, so argparse found the rest
    unrecognized; when those words are exactly what followed ``--identity``, show the right
    spelling."""
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
    """The variable a result is bound to must be free or hold an earlier BatchResult: a result never
    replaces the user's own data, nor shadows a builtin (the body's next run would call the
    result)."""
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
