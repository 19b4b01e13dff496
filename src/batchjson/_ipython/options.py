"""How the magics read their line: ``--help``, hints for mistyped options, and the variable a
result may be bound to.

Every magic prints its usage on ``--help`` (or ``-h``) and returns without running anything, as
jupysql's ``%sql --help`` does. A mistyped option is named with the closest real one
("unknown option --identiy (did you mean --identity?)"), read from the magic's own parser.
"""

from __future__ import annotations

import difflib
import re
from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.utils.process import arg_split

from .._result import BatchResult
from .cell import identity_option, one_line

HELP = ("--help", "-h")
_NUMBER = re.compile(r"-\.?\d")


def wants_help(magic: Callable[..., Any], line: str, sigil: str = "%") -> bool:
    """Print the magic's usage and say True when its line asks for help."""
    words = arg_split(line, strict=False)
    if not any(word in HELP for word in words):
        return False
    text = magic.parser.format_help()  # type: ignore[attr-defined]
    head, _, rest = text.partition("%")  # IPython's formatter starts "::\n\n  %name ..."
    print("usage: " + sigil + rest if head.strip(": \n") == "" else text)
    return True


def parse(magic: Callable[..., Any], line: str, sigil: str = "%", *,
          expr_options: bool = False) -> Namespace | None:
    """The magic's options, or None after ``--help`` printed its usage. An unknown option is
    named with the nearest real one; with ``expr_options`` (``%%batch_json``), stray words are
    explained (identity fields written with spaces, an EXPR that holds spaces)."""
    try:
        if wants_help(magic, line, sigil):
            return None
        return magic.parser.parse_argstring(line)  # type: ignore[attr-defined]
    except ValueError as exc:  # the shell-style splitter's bare error for an unclosed quote
        raise UsageError(f"{sigil}{magic.parser.prog} {line.strip()}: {exc} (a quote is "  # type: ignore[attr-defined]
                         "opened and never closed); close the quote, or build the value in "
                         "the cell body and pass its name") from None
    except UsageError as exc:
        parser = magic.parser  # type: ignore[attr-defined]
        if "unrecognized arguments" not in str(exc):
            raise
        words = arg_split(line, strict=False)
        extra = parser.parse_known_args(words)[1]
        unknown = next((w for w in extra if w.startswith("-") and w != "-"
                        and not _NUMBER.match(w)), None)
        if unknown is not None:
            raise UsageError(unknown_option(unknown, parser, sigil)) from None
        if not expr_options:
            raise
        spaced_identity(words, parser)
        raise UsageError(f"{one_line(exc)}. An option's EXPR may not contain spaces: build "
                         "the value in the cell body and pass its name, e.g. --tasks "
                         "my_tasks") from None


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
    """``--identity task_id case_id`` or ``--identity task_id, case_id``: a space ended the
    option's value, so argparse took the first field and found the rest unrecognized. When the
    unrecognized words are exactly what follows ``--identity``, show the spelling to use."""
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
    """The variable a result will be bound to must be free or hold an earlier BatchResult:
    anything else is the user's own data, which a result must never replace."""
    if var not in ns or isinstance(ns[var], BatchResult):
        return
    fix = ("choose another --out VAR" if out else
           f"give the batch another name (%%batch_json {name}_results) or bind the result "
           "elsewhere with --out VAR")
    raise UsageError(f"`{var}` holds {_described(ns[var])}, which the result of batch "
                     f"{name!r} would replace; {fix}. Nothing was run and `{var}` is unchanged")


def _described(value: Any) -> str:
    kind = type(value).__name__
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
        return f"a {kind}"
    try:
        return f"a {kind} of {len(value):,} item(s)"
    except Exception:  # noqa: BLE001 - a __len__ that raises: the type says enough
        return f"a {kind}"
