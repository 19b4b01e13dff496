"""Pieces of a JSON Schema the generator (:mod:`batchjson.testing._values`) reads: ``allOf``
members merged into one schema, numeric bounds as exact fractions, the schema of one property,
and :class:`Unanswerable`, which names a keyword no value can meet."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any


class Unanswerable(Exception):
    """A keyword no generated value satisfies: ``keyword`` at ``where`` (a JSON path)."""

    def __init__(self, keyword: str, where: str, why: str) -> None:
        self.keyword, self.where, self.why = keyword, where, why
        super().__init__(f"keyword {keyword!r} at {where}: {why}")


_MIN_KEYS = ("minimum", "minLength", "minItems", "minProperties", "minContains")
_MAX_KEYS = ("maximum", "maxLength", "maxItems", "maxProperties", "maxContains")
_BOTH = ("items", "additionalProperties", "contains", "propertyNames", "not")


def as_schema(node: Any, where: str) -> Any:
    """A schema as a mapping: ``true`` is ``{}``; ``false`` and non-schemas are refused."""
    if node is True:
        return {}
    if node is False:
        raise Unanswerable("false", where, "allows no value")
    if not isinstance(node, Mapping):
        raise Unanswerable("schema", where, f"{node!r} is not a schema")
    return node


def merge(a: Any, b: Any, where: str) -> dict[str, Any]:
    """One schema asking for what both ask (allOf): bounds tightened, properties and required
    joined, types and enums intersected. What cannot be joined keeps ``a``'s word; the value
    made is checked against the original schema anyway."""
    a, b = dict(as_schema(a, where)), as_schema(b, where)
    for key, theirs in b.items():
        if key not in a:
            a[key] = theirs
        elif key == "required":
            a[key] = list(dict.fromkeys([*a[key], *theirs]))
        elif key == "properties" and isinstance(theirs, Mapping):
            joined = dict(a[key])
            for name, sub in theirs.items():
                joined[name] = {"allOf": [joined[name], sub]} if name in joined else sub
            a[key] = joined
        elif key == "type":
            a[key] = _common_types(a[key], theirs, where)
        elif key == "enum" and isinstance(theirs, list):
            kept = {canonical(v) for v in theirs}
            a[key] = [v for v in a[key] if canonical(v) in kept]
        elif key in (*_MIN_KEYS, "exclusiveMinimum") and _numbers_both(a[key], theirs):
            a[key] = max(a[key], theirs)
        elif key in (*_MAX_KEYS, "exclusiveMaximum") and _numbers_both(a[key], theirs):
            a[key] = min(a[key], theirs)
        elif key == "not" and a[key] != theirs:  # neither: not (either)
            a[key] = {"anyOf": [a[key], theirs]}
        elif key in _BOTH and a[key] != theirs:
            a[key] = {"allOf": [a[key], theirs]}
        elif key in ("anyOf", "oneOf") and a[key] != theirs:
            a["allOf"] = [*a.get("allOf", []), {key: theirs}]
        elif key == "const" and canonical(a[key]) != canonical(theirs):
            raise Unanswerable("const", where, "allOf asks for two different constants")
    return a


PLAIN_ENUM = frozenset({"enum", "type", "title", "description", "default", "examples",
                         "$comment"})
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "null": (type(None),), "object": (dict,), "array": (list,)}


def has_type(value: Any, kinds: Any) -> bool:
    if kinds is None:
        return True
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        allowed = _JSON_TYPES.get(kind, ())
        if isinstance(value, allowed) and (kind == "boolean" or not isinstance(value, bool)):
            return True
    return False


def _numbers_both(a: Any, b: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))


def _common_types(a: Any, b: Any, where: str) -> Any:
    left = {a} if isinstance(a, str) else set(a)
    right = {b} if isinstance(b, str) else set(b)
    common = (left & right) | ({"integer"} if ("integer" in left and "number" in right) or
                               ("number" in left and "integer" in right) else set())
    if not common:
        raise Unanswerable("type", where, f"allOf asks for {sorted(left)} and {sorted(right)}, "
                           "which no value is")
    ordered = [t for t in ([a] if isinstance(a, str) else a) if t in common]
    ordered += sorted(common.difference(ordered))
    return ordered[0] if len(ordered) == 1 else ordered


def few_values(node: Mapping[str, Any]) -> list[Any]:
    """Every value a small domain holds (the members of an enum, a const, both booleans, an
    integer range of at most 64), or ``[]`` when it is not small."""
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    kinds = node.get("type")
    if kinds == "boolean":
        return [False, True]
    if kinds == "integer":
        low, low_open = bound(node, "minimum", "exclusiveMinimum", lower=True)
        high, high_open = bound(node, "maximum", "exclusiveMaximum", lower=False)
        if low is not None and high is not None and high - low <= 64:
            first = math.floor(low) + 1 if low_open and low.denominator == 1 else math.ceil(low)
            last = math.ceil(high) - 1 if high_open and high.denominator == 1 else \
                math.floor(high)
            return list(range(first, last + 1))
    return []


def property_schema(node: Mapping[str, Any], name: str, where: str) -> Any:
    props = node.get("properties")
    if isinstance(props, Mapping) and name in props:
        return props[name]
    for pattern, sub in (node.get("patternProperties") or {}).items():
        try:
            if re.search(pattern, name):
                return sub
        except Exception:  # noqa: BLE001 - a pattern Python cannot read matches nothing here
            continue
    extra = node.get("additionalProperties", True)
    if extra is False:
        raise Unanswerable("additionalProperties", where, f"{name!r} is required but not "
                           "declared under properties, and additionalProperties is false")
    return extra


def with_dependencies(node: Mapping[str, Any], names: list[str]) -> list[str]:
    """``names`` plus what dependentRequired (or draft 7's list-valued dependencies) asks."""
    rules = {**{k: v for k, v in (node.get("dependencies") or {}).items()
                if isinstance(v, list)}, **(node.get("dependentRequired") or {})}
    out = list(names)
    changed = bool(rules)
    while changed:
        changed = False
        for name in list(out):
            for needed in rules.get(name, ()):
                if needed not in out:
                    out.append(needed)
                    changed = True
    return out


def invented_name(node: Mapping[str, Any], names: Sequence[str], where: str) -> str:
    if node.get("additionalProperties", True) is False and not node.get("patternProperties"):
        raise Unanswerable("minProperties", where, "asks for more properties than the schema "
                           "declares, and additionalProperties is false")
    return next(f"field{i}" for i in range(len(names) + 1) if f"field{i}" not in names)


def bound(node: Mapping[str, Any], key: str, exclusive: str, *, lower: bool
           ) -> tuple[Fraction | None, bool]:
    value, other = node.get(key), node.get(exclusive)
    bound = _fraction(value)
    if other is True:  # draft 4: a flag on the bound
        return bound, bound is not None
    limit = _fraction(other)
    if limit is not None and (bound is None or (limit >= bound if lower else limit <= bound)):
        return limit, True
    return bound, False


def _fraction(value: Any) -> Fraction | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return Fraction(value) if math.isfinite(value) else None


def step_of(multiple: Any, integer: bool) -> Fraction | None:
    step = _fraction(multiple)
    if step is None or step <= 0:
        return None
    return Fraction(step.numerator) if integer else step


def float_multiple(multiple: Any, value: Fraction) -> bool:
    """jsonschema checks a float multipleOf by float division; keep to values it accepts."""
    if not isinstance(multiple, float):
        return True
    quotient = float(value) / multiple
    return math.isfinite(quotient) and int(quotient) == quotient


def multiples(start: Fraction, end: Fraction, unit: Fraction) -> list[Fraction]:
    a, b = math.ceil(start / unit), math.floor(end / unit)
    picks = {a, b, a + 1, b - 1, *range(a, min(b, a + 40) + 1)}
    return [k * unit for k in sorted(picks) if a <= k <= b]


def between(low: Fraction | None, high: Fraction | None, integer: bool) -> list[Fraction]:
    if integer or low is None or high is None:
        return []
    return [(low + high) / 2, low + (high - low) / 4]


def number_out(value: Fraction, integer: bool, minimal: bool) -> int | float:
    if value.denominator == 1 and (integer or minimal or value == 0):
        return int(value)
    return float(value)


def interval(low: Fraction | None, low_open: bool, high: Fraction | None,
              high_open: bool) -> str:
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    return (f"{left}{'-inf' if low is None else float(low):g}, "
            f"{'inf' if high is None else float(high):g}{right}")


def canonical(value: Any) -> str:
    """A key equal for values JSON Schema holds equal (``enum``, ``const``, ``uniqueItems``):
    ``1`` and ``1.0`` are one number, ``true`` is not ``1``, key order does not count."""
    return json.dumps(_json_equal_form(value), sort_keys=True, separators=(",", ":"),
                      default=str)


def _json_equal_form(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _json_equal_form(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_equal_form(v) for v in value]
    return value


def size(value: Any) -> int:
    """The length of ``value`` as JSON text (what the smallest answer is measured by)."""
    return len(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))
