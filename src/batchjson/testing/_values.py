"""Values a JSON Schema allows, drawn from a seed: the simulated model's answers.

Every keyword batchjson accepts, the same seed giving the same value in every process, each
value checked against the schema before it is handed out; a keyword the generator cannot meet
raises :class:`Unanswerable`, naming it, so the simulated model refuses before anything runs.
The product never draws values: what it needs of a schema's answer size is
:mod:`batchjson._content.schema`."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from copy import deepcopy
from fractions import Fraction
from typing import Any

import jsonschema

from .._content.schema import MISSING, resolve_pointer
from .._content.tasks import sha
from ._patterns import NoString, format_string, pattern_string, plain_string
from ._valueparts import (
    PLAIN_ENUM,
    Unanswerable,
    as_schema,
    between,
    bound,
    canonical,
    few_values,
    float_multiple,
    has_type,
    interval,
    invented_name,
    merge,
    multiples,
    number_out,
    property_schema,
    size,
    step_of,
    with_dependencies,
)

# The seed of the draws: kept while a new generator leaves the answers to schemas it did not
# change as they were (schemagen-2 changed oneOf, uniqueItems, not and enum equality).
_DRAWS = "schemagen-1"
MAX_DEPTH = 48  # nesting a required chain of $refs may reach before it is called endless
_SAMPLE_DEPTH = 6  # below this, optional parts are left out so recursive schemas end
_OBJECT = ("properties", "required", "additionalProperties", "patternProperties",
           "minProperties", "maxProperties", "dependentRequired", "propertyNames")
_ARRAY = ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains")
_STRING = ("minLength", "maxLength", "pattern", "format")
_NUMBER = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


class Generator:
    """Values of one schema document (``root``, where ``$ref``s resolve) from one seed."""

    def __init__(self, root: Any, seed: str = "", *, minimal: bool = False) -> None:
        self.root = root
        self.rng = random.Random(int(sha(f"{_DRAWS}:{seed}")[:16], 16))
        self.minimal = minimal
        self._validator: Any = None

    def value(self, node: Any = None, *, fixed: Mapping[str, Any] | None = None,
              verify: bool = True) -> Any:
        """A value of ``node`` (default: the root); ``fixed`` sets top-level object fields
        (identity echoes). With ``verify`` the value is checked against ``node`` first."""
        node = self.root if node is None else node
        made = self._gen(node, "$", 0, fixed)
        if verify:
            self.verify(node, made)
        return made

    def verify(self, node: Any, value: Any, where: str = "$") -> None:
        """Raise Unanswerable naming the keyword ``value`` fails, if it fails one."""
        try:
            errors = list(self._checker(node).iter_errors(value))
        except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.RefResolutionError,
                LookupError, ValueError) as exc:  # a schema jsonschema itself cannot apply
            raise Unanswerable("$schema", where, f"cannot be checked ({exc})") from None
        if errors:
            best = jsonschema.exceptions.best_match(errors)
            raise Unanswerable(str(best.validator), where + best.json_path[1:], best.message)

    def _checker(self, node: Any) -> Any:
        if self._validator is None:
            cls = jsonschema.validators.validator_for(
                self.root if isinstance(self.root, Mapping) else {},
                default=jsonschema.Draft202012Validator)
            self._validator = cls(self.root, format_checker=cls.FORMAT_CHECKER)
        return self._validator if node is self.root else self._validator.evolve(schema=node)

    def fits(self, node: Any, value: Any) -> bool:
        try:
            return bool(self._checker(node).is_valid(value))
        except Exception:  # noqa: BLE001 - a value jsonschema cannot judge does not fit
            return False

    # -- dispatch ------------------------------------------------------------------------------
    def _gen(self, node: Any, where: str, depth: int, fixed: Mapping[str, Any] | None = None
             ) -> Any:
        if depth > MAX_DEPTH:
            raise Unanswerable("$ref", where.split(".")[0] + "." + ".".join(
                where.split(".")[1:4]) + "...", f"nests more than {MAX_DEPTH} levels: a "
                "recursive schema must allow an answer that ends")
        if not self.minimal and depth > _SAMPLE_DEPTH:
            return self._minimally(lambda: self._gen(node, where, depth, fixed))
        if node is True or node is None:
            return self._anything()
        if node is False:
            raise Unanswerable("false", where, "allows no value")
        if not isinstance(node, Mapping):
            raise Unanswerable("schema", where, f"{node!r} is not a schema")
        node = self.flat(node, where)
        if "const" in node:
            return deepcopy(node["const"])
        if "enum" in node:
            return self._enum(node, where)
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                return self._branch(node, key, where, depth, fixed)
        if "if" in node:
            return self._conditional(node, where, depth, fixed)
        if "not" in node:
            return self._negated(node, where, depth, fixed)
        kind = self._kind(node)
        if kind == "object":
            return self._object(node, where, depth, fixed)
        if kind == "array":
            return self._array(node, where, depth)
        if kind == "string":
            return self._string(node, where)
        if kind in ("integer", "number"):
            return self._number(node, where, kind == "integer")
        if kind == "boolean":
            return True if self.minimal else self.rng.random() < 0.5
        if kind == "null":
            return None
        return self._anything()

    def _minimally(self, make: Any) -> Any:
        return self._as(True, make)

    def _drawing(self, make: Any) -> Any:
        return self._as(False, make)

    def _as(self, minimal: bool, make: Any) -> Any:
        """``make()`` with the smallest (True) or drawn (False) values, then as before."""
        saved, self.minimal = self.minimal, minimal
        try:
            return make()
        finally:
            self.minimal = saved

    def _anything(self) -> Any:
        """A value where the schema allows any: the smallest (0), or a drawn string, number or
        boolean (drawn afresh, so a ``not`` can be met by another kind)."""
        if self.minimal:
            return 0
        kind = self.rng.choice(("string", "string", "integer", "boolean"))
        if kind == "integer":
            return self.rng.randint(0, 100)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return plain_string(self.rng, minimal=False, min_length=1, max_length=12)

    def _kind(self, node: Mapping[str, Any]) -> str:
        kinds = node.get("type")
        if isinstance(kinds, str):
            return kinds
        if isinstance(kinds, list) and kinds:
            if self.minimal and "null" in kinds:
                return "null"
            return next((k for k in kinds if k != "null"), kinds[0])
        for kind, keys in (("object", _OBJECT), ("array", _ARRAY), ("string", _STRING),
                           ("number", _NUMBER)):
            if any(k in node for k in keys):
                return kind
        return "any"

    # -- $ref, allOf -------------------------------------------------------------------------
    def flat(self, node: Mapping[str, Any], where: str) -> Mapping[str, Any]:
        """``node`` with its ``$ref`` resolved and its ``allOf`` merged in (bounded, so a
        schema that refers to itself without end is named instead of followed forever)."""
        for _ in range(MAX_DEPTH):
            if isinstance(node.get("$ref"), str):
                target = resolve_pointer(self.root, node["$ref"])
                if target is MISSING:
                    raise Unanswerable("$ref", where, f"{node['$ref']!r} does not resolve within "
                                       "the schema")
                rest = {k: v for k, v in node.items() if k != "$ref"}
                node = merge(as_schema(target, where), rest, where)
            elif isinstance(node.get("allOf"), list):
                rest = {k: v for k, v in node.items() if k != "allOf"}
                for member in node["allOf"]:
                    rest = merge(rest, self.flat(as_schema(member, where), where), where)
                node = rest
            else:
                return node
        raise Unanswerable("$ref", where, "refers to itself without end")

    # -- choices -------------------------------------------------------------------------------
    def _enum(self, node: Mapping[str, Any], where: str) -> Any:
        members = node["enum"] if isinstance(node["enum"], list) else []
        if set(node) <= PLAIN_ENUM and all(has_type(m, node.get("type")) for m in members):
            fitting = members  # nothing else to meet: no validator needed (the common case)
        else:
            fitting = [m for m in members if self.fits(node, m)]
        if not fitting:
            raise Unanswerable("enum", where, "no member satisfies the rest of the schema")
        if self.minimal:
            return deepcopy(min(fitting, key=size))
        return deepcopy(self.rng.choice(fitting))

    def _branch(self, node: Mapping[str, Any], key: str, where: str, depth: int,
                fixed: Mapping[str, Any] | None) -> Any:
        rest = {k: v for k, v in node.items() if k != key}
        branches = list(node[key])
        # a real answer is rarely null: a nullable field gets its value, null only if nothing
        branches.sort(key=lambda b: isinstance(b, Mapping) and b.get("type") == "null")
        made: list[Any] = []
        reasons: list[str] = []
        for drawn in (False, True):  # the smallest of each branch may fit several: draw then
            for branch in branches:
                try:
                    sub = merge(rest, self.flat(as_schema(branch, where), where), where)
                    others = [b for b in branches if b is not branch]
                    if key == "oneOf" and others:  # exactly one: a value none of the others takes
                        sub = merge(sub, {"not": {"anyOf": others}}, where)
                    make = (lambda sub=sub: self._gen(sub, where, depth + 1, fixed))  # noqa: E731
                    value = self._drawing(make) if drawn else make()
                except Unanswerable as exc:
                    reasons.append(exc.why)
                    continue
                if self.fits(node, value):
                    if not self.minimal:
                        return value
                    made.append(value)
            if made or not self.minimal:
                break
        if made:
            return min(made, key=size)
        why = f" (first: {reasons[0]})" if reasons else ""
        raise Unanswerable(key, where, f"no branch could be answered{why}")

    def _conditional(self, node: Mapping[str, Any], where: str, depth: int,
                     fixed: Mapping[str, Any] | None) -> Any:
        rest = {k: v for k, v in node.items() if k not in ("if", "then", "else")}
        tries = [merge(merge(rest, as_schema(node["if"], where), where),
                       as_schema(node.get("then", True), where), where),
                 merge(rest, as_schema(node.get("else", True), where), where)]
        for attempt in tries:
            try:
                value = self._gen(attempt, where, depth + 1, fixed)
            except Unanswerable:
                continue
            if self.fits(node, value):
                return value
        raise Unanswerable("if", where, "neither the then nor the else branch could be met")

    def _negated(self, node: Mapping[str, Any], where: str, depth: int,
                 fixed: Mapping[str, Any] | None) -> Any:
        rest = {k: v for k, v in node.items() if k != "not"}
        make = (lambda: self._gen(rest, where, depth + 1, fixed))  # noqa: E731
        for attempt in range(14):  # as asked, the smallest, then drawn afresh
            value = (make() if attempt == 0 else self._minimally(make) if attempt == 1
                     else self._drawing(make))
            if self.fits(node, value):
                return value
        raise Unanswerable("not", where, "every value tried matches the schema under not")

    # -- objects and arrays ----------------------------------------------------------------
    def _object(self, node: Mapping[str, Any], where: str, depth: int,
                fixed: Mapping[str, Any] | None) -> dict[str, Any]:
        fixed = fixed or {}
        props = node.get("properties") if isinstance(node.get("properties"), Mapping) else {}
        required = [n for n in node.get("required") or [] if isinstance(n, str)]
        names = list(dict.fromkeys([*fixed, *required]))
        optional = [n for n in props if n not in names]
        if not self.minimal:
            names += optional
        names = with_dependencies(node, names)
        low, high = node.get("minProperties", 0), node.get("maxProperties")
        spare = iter(n for n in optional if n not in names)
        while isinstance(low, int) and len(names) < low:
            names.append(next(spare, None) or invented_name(node, names, where))
        if isinstance(high, int) and len(names) > high:
            keep = [n for n in names if n in fixed or n in required]
            names = keep + [n for n in names if n not in keep][:max(0, high - len(keep))]
        out: dict[str, Any] = {}
        for name in names:
            out[name] = (deepcopy(fixed[name]) if name in fixed else self._gen(
                property_schema(node, name, where), f"{where}.{name}", depth + 1))
        return out

    def _array(self, node: Mapping[str, Any], where: str, depth: int) -> list[Any]:
        prefix, items = node.get("prefixItems"), node.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuples: items is the list
            prefix, items = items, node.get("additionalItems", True)
        prefix = list(prefix) if isinstance(prefix, list) else []
        low = node.get("minItems", 0) if isinstance(node.get("minItems"), int) else 0
        high = node.get("maxItems") if isinstance(node.get("maxItems"), int) else None
        count = low if self.minimal else self.rng.randint(max(low, 1), max(low, 1) + 2)
        if high is not None:
            count = min(count, high)
        if items is False:
            count = min(count, len(prefix))
        values: list[Any] = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            try:
                values.append(self._distinct(sub, values, f"{where}[{i}]", depth + 1,
                                             node.get("uniqueItems") is True))
            except Unanswerable as exc:  # fewer distinct values than drawn: stop at enough
                if exc.keyword != "uniqueItems" or i < max(low, len(prefix)):
                    raise
                break
        if "contains" in node:
            self._contain(node, values, items, high, where, depth)
        return values

    def _distinct(self, sub: Any, values: Sequence[Any], where: str, depth: int,
                  unique: bool) -> Any:
        """A value of ``sub``; with ``unique``, one no earlier value equals as JSON Schema
        compares (``1`` is ``1.0``, not ``true``): drawn afresh, then picked from the few
        values a small domain has (an enum, booleans, a short integer range)."""
        value = self._gen(sub, where, depth)
        if not unique:
            return value
        seen = {canonical(v) for v in values}
        for _ in range(24):
            if canonical(value) not in seen:
                return value
            value = self._drawing(lambda: self._gen(sub, where, depth))
        flat = self.flat(as_schema(sub, where), where)
        for candidate in few_values(flat):
            if canonical(candidate) not in seen and self.fits(sub, candidate):
                return deepcopy(candidate)
        raise Unanswerable("uniqueItems", where, f"no value other than the {len(values)} "
                           "already made could be found")

    def _contain(self, node: Mapping[str, Any], values: list[Any], items: Any,
                 high: int | None, where: str, depth: int) -> None:
        contains = as_schema(node["contains"], where)
        need = node.get("minContains", 1) if isinstance(node.get("minContains"), int) else 1
        have = sum(self.fits(contains, v) for v in values)
        both = merge(self.flat(as_schema(items, where), where),
                     self.flat(contains, where), where) if isinstance(contains, Mapping) \
            else contains
        while have < need:
            value = self._gen(both, f"{where}[{len(values)}]", depth + 1)
            if high is None or len(values) < high:
                values.append(value)
            else:
                spot = next((i for i, v in enumerate(values) if not self.fits(contains, v)),
                            None)
                if spot is None:
                    raise Unanswerable("contains", where, "maxItems leaves no room for the "
                                       "items contains asks for")
                values[spot] = value
            have += 1

    # -- scalars -------------------------------------------------------------------------------
    def _string(self, node: Mapping[str, Any], where: str) -> str:
        low = node.get("minLength", 0) if isinstance(node.get("minLength"), int) else 0
        high = node.get("maxLength") if isinstance(node.get("maxLength"), int) else None
        if high is not None and low > high:
            raise Unanswerable("minLength", where, f"minLength {low} is above maxLength {high}")
        if isinstance(node.get("pattern"), str):
            try:
                return pattern_string(node["pattern"], self.rng, minimal=self.minimal,
                                      min_length=low, max_length=high)
            except NoString as exc:
                raise Unanswerable("pattern", where, str(exc)) from None
        fmt = node.get("format")
        made = format_string(fmt, self.rng, minimal=self.minimal) if isinstance(fmt, str) \
            else None
        if made is None:
            return plain_string(self.rng, minimal=self.minimal, min_length=low, max_length=high)
        if len(made) < low or (high is not None and len(made) > high):
            raise Unanswerable("format", where, f"a {fmt} value of {low} to {high} characters "
                               "is beyond the generator")
        return made

    def _number(self, node: Mapping[str, Any], where: str, integer: bool) -> int | float:
        low, low_open = bound(node, "minimum", "exclusiveMinimum", lower=True)
        high, high_open = bound(node, "maximum", "exclusiveMaximum", lower=False)
        step = step_of(node.get("multipleOf"), integer)

        def fits(v: Fraction) -> bool:
            return ((low is None or v > low or (v == low and not low_open))
                    and (high is None or v < high or (v == high and not high_open))
                    and (step is None or (v / step).denominator == 1)
                    and float_multiple(node.get("multipleOf"), v))

        for candidate in self._numbers(low, high, step, integer):
            if fits(candidate):
                return number_out(candidate, integer, self.minimal)
        keyword = "multipleOf" if step is not None else "minimum"
        raise Unanswerable(keyword, where, f"no {'integer' if integer else 'number'} lies "
                           f"within the bounds {interval(low, low_open, high, high_open)}"
                           + (f" and is a multiple of {node.get('multipleOf')}" if step else ""))

    def _numbers(self, low: Fraction | None, high: Fraction | None, step: Fraction | None,
                 integer: bool) -> Iterator[Fraction]:
        """Candidates, lazily: nearest zero first when minimal, else one drawn from a window
        first; then multiples of the step across the window, then points between the bounds."""
        unit = step if step is not None else Fraction(1)
        start = low if low is not None else (high - 100 * unit if high is not None else
                                             Fraction(0))
        end = high if high is not None else start + 100 * unit
        if self.minimal:
            yield from sorted([Fraction(0), *multiples(start, end, unit)], key=abs)
        else:
            if not integer and step is None and low is not None and high is not None:
                yield Fraction(round(self.rng.uniform(float(low), float(high)), 2))
            elif not integer and step is None:
                yield Fraction(self.rng.randint(int(start * 100), int(end * 100)), 100)
            a, b = math.ceil(start / unit), math.floor(end / unit)
            if a <= b:
                yield self.rng.randint(a, b) * unit
            yield Fraction(0)
            yield from multiples(start, end, unit)
        yield from between(low, high, integer)

