"""Reading a model's JSON strictly (finite numbers a float holds, no key twice, bounded nesting)
and comparing JSON values exactly (no ``True == 1``, ``1 == 1.0`` or ``-0.0 == 0.0``; a float held
to its text as written): docs/design.md, "The commit boundary", step 1."""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Callable
from decimal import Decimal
from itertools import accumulate
from typing import Any

MAX_DEPTH = 256  # deeper JSON is refused before anything recursive walks it


def reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not valid JSON")


_NONZERO_DIGIT = re.compile(r"[1-9]")


def finite_float(text: str) -> float:
    """A float that means the number written: 1e400 (infinity) and 1e-400 (0.0) do not."""
    value = float(text)
    if math.isinf(value):  # 1e400 and -1e999 are valid JSON but overflow to infinity
        raise ValueError(f"number {text[:40]} overflows a float; only finite numbers are valid")
    if value == 0.0 and _NONZERO_DIGIT.search(text.partition("e")[0].partition("E")[0]):
        # 1e-400 reads as 0.0, which would pass "minimum": 0 as a value nobody wrote
        raise ValueError(f"number {text[:40]} underflows a float (it is not zero but reads as "
                         "0.0); only numbers a float can hold are valid")
    if len(text) > 15 or (value and -_NORMAL < value < _NORMAL):  # 15 digits or fewer always
        _NOTED.long = True  # round-trip, unless subnormal: the exact read decides
    return value


_NORMAL = 2.2250738585072014e-308  # the smallest normal float
_NOTED = threading.local()  # whether the parse running on this thread met such a number


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object naming a key twice is ambiguous (which case_id did the model mean?): refuse."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        out[key] = value
    return out


def strip_fence(text: str) -> str:
    """The text inside one ```json fence, if that is all there is: models add them unasked."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```"):
        lines = stripped.splitlines()
        if len(lines) >= 3 and lines[0].strip().lower() in {"```", "```json"}:
            stripped = "\n".join(lines[1:-1]).strip()
    return stripped


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting(text: str, bound: int = MAX_DEPTH) -> int:
    """Deepest bracket nesting of a JSON text, strings skipped; linear, in C, non-recursive.
    A text with at most ``bound`` brackets is nested at most that deep: not scanned, 0."""
    if text.count("[") + text.count("{") <= bound:
        return 0
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, skeleton)), default=0)


def _loads(text: str, decoder: json.JSONDecoder) -> Any:
    if nesting(text) > MAX_DEPTH:
        raise ValueError(f"JSON is nested deeper than {MAX_DEPTH} levels")
    try:
        return decoder.decode(text)
    except RecursionError:
        raise ValueError("JSON is nested too deeply to read") from None


# Built once: json.loads with options builds a decoder (and its scanner) on every call.
_STRICT = json.JSONDecoder(parse_constant=reject_constant, object_pairs_hook=_unique_keys,
                           parse_float=finite_float)
_EXACT = json.JSONDecoder(parse_constant=reject_constant, object_pairs_hook=_unique_keys,
                          parse_float=Decimal)


def parse_json(text: str) -> Any:
    """Strict JSON, a single ```json fence tolerated; raises ValueError for anything else."""
    return parse_json_noting(text)[0]


def parse_json_noting(text: str) -> tuple[Any, bool]:
    """:func:`parse_json`, and whether one of its numbers may not be the value its float holds
    (16 characters or more, or subnormal): only then is :func:`exact_if_lossy` worth asking."""
    _NOTED.long = False
    return _loads(strip_fence(text), _STRICT), _NOTED.long


def exact_json(text: str) -> Any:
    """The same text with every float kept as its exact decimal value, for identity checks."""
    return _loads(strip_fence(text), _EXACT)


def exact_if_lossy(text: str) -> Any:
    """A text :func:`parse_json_noting` read (its nesting checked) read again with exact numbers
    when one of them is not the value its float holds (``0.30000000000000001`` reads as 0.3),
    else None: only then can floats change a verdict."""
    exact = _EXACT.decode(strip_fence(text))
    return exact if holds_lossy(exact) else None


def holds_lossy(value: Any) -> bool:
    """Whether a value read by :func:`exact_json` holds a number its float does not hold."""
    return _any_leaf(value, _lossy)


def _lossy(x: Any) -> bool:
    """Only a number of 16 characters or more, or a subnormal one, can be (as in finite_float)."""
    return (isinstance(x, Decimal) and (len(str(x)) > 15 or x.adjusted() < -307)
            and Decimal(repr(float(x))) != x)


def _any_leaf(value: Any, test: Callable[[Any], bool]) -> bool:
    """Whether ``test`` holds for a scalar anywhere in a JSON value (iterative: any depth)."""
    stack = [value]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif test(x):
            return True
    return False


# -- files batchjson reads (receipts): not a model's return ----------------------------------
class _Written(str):
    """A number's text as written, so that the field holding one no float holds is named."""


_AS_WRITTEN = json.JSONDecoder(parse_constant=reject_constant, parse_float=_Written)


def parse_as_written(text: str) -> Any:
    """A JSON file's value (keys may repeat, as in any file of records), its floats kept as
    written until :func:`finite_numbers` reads them. Raises ValueError for text that is not JSON."""
    try:
        return _AS_WRITTEN.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def finite_numbers(value: Any) -> tuple[str, str] | None:
    """Read the numbers of a :func:`parse_as_written` value with :func:`finite_float`, in place
    and iteratively; (field, problem) of the first no float holds (``tasks[0].x``), else None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, where = stack.pop()
        pairs = (list(node.items()) if isinstance(node, dict) else list(enumerate(node))
                 if isinstance(node, list) else [])
        for key, child in pairs:
            at = (f"{where}.{key}" if where else str(key)) if isinstance(node, dict) \
                else f"{where}[{key}]"
            if isinstance(child, _Written):
                try:
                    node[key] = finite_float(child)
                except ValueError as exc:
                    return at, str(exc)
            elif isinstance(child, (dict, list)):
                stack.append((child, at))
    return None


# -- exact JSON equality -----------------------------------------------------------------------
def float_equal(got: Any, want: Any) -> bool:
    """``got`` is a float from a return (a Decimal when read exactly), ``want`` the request's."""
    if isinstance(got, Decimal):
        exact = Decimal(repr(want))
        return got == exact and got.is_signed() == exact.is_signed()
    return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


def json_equal(a: Any, b: Any) -> bool:
    """Exact JSON-value equality, iterative (so any depth is safe): no True == 1, no 1 == 1.0,
    no -0.0 == 0.0; ``a`` may hold Decimals (a return read exactly), ``b`` is the request's."""
    kind = type(b)
    if kind is str or kind is int or b is None:  # the common identity value: no walk
        return type(a) is kind and a == b
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, bool) or isinstance(y, bool):
            if not (isinstance(x, bool) and isinstance(y, bool) and x is y):
                return False
        elif isinstance(y, float):
            if not (isinstance(x, (float, Decimal)) and float_equal(x, y)):
                return False
        elif isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif not (type(x) is type(y) and x == y):
            return False
    return True


_SCALARS = frozenset((str, int, bool, type(None)))


def has_float(value: Any) -> bool:
    """Whether a JSON value holds a float anywhere: only then is a return re-read exactly."""
    return type(value) not in _SCALARS and _any_leaf(value, lambda x: isinstance(x, float))
