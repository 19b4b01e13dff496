"""Running a ``%%batch_json`` cell body and making its functions define-once."""

from __future__ import annotations

import dis
import inspect
import keyword
import re
from typing import Any

from IPython.core.error import UsageError

from .. import InvalidBatch, ValidatorRegistry
from .._textview import frame_lines
from ..core import parse_identity

_MISSING = object()
_HEADER = re.compile(r"%%batch_json(\s|$)")


def allow_empty_body(lines: list[str]) -> list[str]:
    """Input transformer: IPython refuses an empty cell-magic body with a generic message, so one
    blank body line lets ``%%batch_json NAME --tasks EXPR`` run and the magic name what is
    missing."""
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


def check_identifier(var: str, option: str) -> None:
    if not var.isidentifier() or keyword.iskeyword(var):
        raise UsageError(f"{var!r} is not a valid Python variable name for the result; "
                         f"{option}")


def running_cell(shell: Any) -> int:
    """The number of the running cell, as its In[n] shows: IPython 9 advances ``execution_count``
    before a cell runs (8 after), and caches the cell under its own number first."""
    mapping = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return max(mapping.values()) if mapping else shell.execution_count


def run_body(shell: Any, cell: str) -> tuple[list[str], set[str]]:
    """Run the body in the user namespace: (names it bound to functions it defined, every name it
    assigned, ``%run`` included). A leading blank line keeps traceback line numbers right."""
    source = "\n" + shell.transform_cell(cell)
    filename = shell.compile.cache(source, running_cell(shell), raw_code="\n" + cell)
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
    """Pass the validator the body defined (one of ``names``) through the registry and rebind its
    variable, so an unchanged re-run keeps ``id(fn)``: (the validator, messages worth saying). One
    the body did not define is returned as it is; the run registers it."""
    name = next((n for n in names if ns[n] is validator), None)
    if validator is None or name is None:
        return validator, []
    definition = registry.register(validator, name=name)
    if definition.fn is not ns[name]:
        ns[name] = definition.fn
    news = definition.kind in ("changed", "reused") or definition.fingerprint.partial
    return definition.fn, [definition.message] if news else []


def evaluate(shell: Any, option: str, expr: str, *, default: bool) -> Any:
    """An option's EXPR in the user namespace; failures become one-line UsageErrors."""
    try:
        return eval(expr, shell.user_global_ns, shell.user_ns)  # the user's own expression
    except NameError as exc:
        if default:
            raise UsageError(f"{exc}: build `{expr}` in the cell body or pass {option} EXPR"
                             ) from None
        raise UsageError(f"{option} {expr}: {exc}") from None
    except Exception as exc:  # any error in the user's expression, reported in one line
        raise UsageError(f"{option} {expr} failed: {type(exc).__name__}: {exc}") from None


def one_line(exc: BaseException | str) -> str:
    return " ".join(str(exc).split())


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


def interrupted_line(name: str) -> str:
    return (f"batchjson: batch {name!r} interrupted. Receipts are kept (calls in flight are "
            "marked cancelled) and nothing partial was committed; re-run the cell to resume.")


class BatchInterrupted(KeyboardInterrupt):
    """The KeyboardInterrupt re-raised by ``%%batch_json``: the kernel sees an interrupt, the
    user sees the one line printed before it instead of a traceback through the event loop."""

    def _render_traceback_(self) -> list[str]:
        return ["KeyboardInterrupt"]
