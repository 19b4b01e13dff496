"""How big an answer to a schema can be, read from the schema alone: the least a pack's answers
can be (for the input check) and the most characters any valid answer takes. Both are bounds: the
least reads only keywords asking for a least, the most is None wherever a size is uncapped."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from .schema import MISSING, ItemSchema, resolve_pointer

_DEPTH = 48  # nesting a chain of $refs may reach before it is called endless
_KINDS = (("object", ("properties", "required", "additionalProperties", "minProperties")),
          ("array", ("items", "prefixItems", "minItems", "maxItems")),
          ("string", ("minLength", "maxLength", "pattern", "format")),
          ("number", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                      "multipleOf")))
# The shortest text of the formats with one shape (pydantic's datetime, date, time and UUID).
_SHAPED = {"date-time": "2024-01-01T00:00:00Z", "date": "2024-01-01", "time": "00:00:00Z",
           "uuid": "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"}
_LONGEST_FLOAT = 24  # the longest repr of a double: -2.2250738585072014e-308
_ESCAPED = 6  # the most one character of a string takes in JSON: a control character \u001f


def smallest_answers(schema: ItemSchema, tasks: Sequence[Mapping[str, Any]],
                     identity: Sequence[str], mode: str) -> list[str]:
    """The smallest answer each task can get, as compact JSON, its identity values first."""
    least = _read(schema.json_schema, schema.json_schema, 0, False)
    if mode == "value":
        return [_compact(least)] * len(tasks)
    fields = least.items() if isinstance(least, dict) else ()
    rest = {k: v for k, v in fields if k not in identity}
    return [_compact({**{k: t[k] for k in identity}, **rest}) for t in tasks]


def largest_answer(schema: Mapping[str, Any], *, declared: bool = False) -> int | None:
    """The most characters any answer valid under ``schema`` takes as compact JSON, or None; with
    ``declared``, an object naming its properties holds only those (as strict mode answers)."""
    if declared:
        schema = _declared_only(schema)
    return _read(schema, schema, 0, True)


def _declared_only(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` where properties are named, others not."""
    if isinstance(node, list):
        return [_declared_only(member) for member in node]
    if not isinstance(node, Mapping):
        return node
    out = {key: _declared_only(value) for key, value in node.items()}
    if "properties" in out and not {"additionalProperties", "patternProperties"} & out.keys():
        out["additionalProperties"] = False
    return out


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _size(value: Any) -> int:
    return len(_compact(value))


def _joined(node: Mapping[str, Any], root: Any) -> list[Any]:
    """``node`` less ``$ref`` and ``allOf``, then the ref's target and the members: all to meet."""
    ref, members = node.get("$ref"), node.get("allOf")
    if not isinstance(ref, str) and not isinstance(members, list):
        return []
    parts: list[Any] = [{k: v for k, v in node.items() if k not in ("$ref", "allOf")}]
    if isinstance(ref, str):
        target = resolve_pointer(root, ref)
        parts.append(False if target is MISSING else target)  # to nothing: no value meets it
    return parts + (members if isinstance(members, list) else [])


def _branches(node: Mapping[str, Any]) -> list[Any]:
    """``anyOf`` (or ``oneOf``) as one schema per branch joined with the rest of ``node``."""
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and node[key]:
            rest = {k: v for k, v in node.items() if k != key}
            return [{"allOf": [rest, branch]} for branch in node[key]]
    return []


def _array_items(node: Mapping[str, Any]) -> tuple[list[Any], Any]:
    """(the tuple's item schemas, the schema of the items after them)."""
    prefix, items = node.get("prefixItems"), node.get("items", True)
    if isinstance(items, list):  # draft 4-7 tuples: items is the list
        prefix, items = items, node.get("additionalItems", True)
    return (prefix if isinstance(prefix, list) else []), items


def _kinds(node: Mapping[str, Any]) -> list[str]:
    kinds = node.get("type")
    return [kinds] if isinstance(kinds, str) else list(kinds) if isinstance(kinds, list) else []


def _read(node: Any, root: Any, depth: int, most: bool) -> Any:
    """One walk for both bounds. The least (``most`` False): a value no larger, as compact JSON,
    than any ``node`` accepts (``0`` where nothing is asked or can be weighed), without ``type``
    of the kind its keywords describe. The most: the characters any value it accepts takes at
    most, None when unbounded."""
    if depth > _DEPTH or not isinstance(node, Mapping):
        return None if most and node is not False else 0  # False: no value takes room
    if joined := _joined(node, root):  # a value meets every part
        parts = [_read(part, root, depth + 1, most) for part in joined]
        return min((p for p in parts if p is not None), default=None) if most \
            else max(parts, key=_size)
    if "const" in node or (isinstance(node.get("enum"), list) and node["enum"]):
        values = [node["const"]] if "const" in node else node["enum"]
        return max(map(_size, values)) if most else min(values, key=_size)
    if branches := _branches(node):
        parts = [_read(branch, root, depth + 1, most) for branch in branches]
    elif most:
        parts = [_most_of_kind(kind, node, root, depth) for kind in _kinds(node)]
    else:
        kinds = _kinds(node) or [next((k for k, keys in _KINDS if any(key in node for key in keys)),
                                      "any")]
        parts = [_least_of_kind(kind, node, root, depth) for kind in kinds]
    if most:  # a value meets one part: no more than the largest limit, if all have one
        return None if None in parts or not parts else max(parts)
    return min(parts, key=_size)


def _least_of_kind(kind: str, node: Mapping[str, Any], root: Any, depth: int) -> Any:
    if kind == "object":
        props = node.get("properties") if isinstance(node.get("properties"), Mapping) else {}
        required = [name for name in node.get("required") or () if isinstance(name, str)]
        return {name: _read(props.get(name, True), root, depth + 1, False)
                for name in dict.fromkeys(required)}
    if kind == "array":
        prefix, items = _array_items(node)
        count = node.get("minItems") if isinstance(node.get("minItems"), int) else 0
        return [_read(prefix[i] if i < len(prefix) else items, root, depth + 1, False)
                for i in range(count)]
    if kind == "string":
        low = node.get("minLength") if isinstance(node.get("minLength"), int) else 0
        fmt = node.get("format")
        shaped = _SHAPED.get(fmt, "") if isinstance(fmt, str) else ""
        return shaped if len(shaped) >= low else "a" * low
    if kind in ("integer", "number"):
        return _least_number(node, kind == "integer")
    return {"boolean": True, "null": None}.get(kind, 0)


def _least_number(node: Mapping[str, Any], integer: bool) -> int | float:
    """The allowed number nearest zero: zero, or the bound nearest it moved onto the step
    (``multipleOf`` as written, 1 for integers)."""
    low, low_open = _bound(node, "minimum", "exclusiveMinimum", lower=True)
    high, high_open = _bound(node, "maximum", "exclusiveMaximum", lower=False)
    if low is not None and low > 0:
        target, is_open, up = low, low_open, True
    elif high is not None and high < 0:
        target, is_open, up = high, high_open, False
    else:
        return 0
    step = _decimal(node.get("multipleOf")) or (Fraction(1) if integer else None)
    if step is not None and step > 0:
        steps = math.ceil(target / step) if up else math.floor(target / step)
        if is_open and steps * step == target:
            steps += 1 if up else -1
        target = steps * step
    return int(target) if target.denominator == 1 else float(target)


def _bound(node: Mapping[str, Any], key: str, exclusive: str, *, lower: bool
           ) -> tuple[Fraction | None, bool]:
    """(the tighter of ``key`` and ``exclusive``, whether it excludes itself; draft 4's boolean
    ``exclusiveMinimum`` makes ``minimum`` exclusive)."""
    value, other = _decimal(node.get(key)), node.get(exclusive)
    if other is True:
        return value, value is not None
    limit = _decimal(other)
    if limit is not None and (value is None or (limit >= value if lower else limit <= value)):
        return limit, True
    return value, False


def _decimal(value: Any) -> Fraction | None:
    """A schema's number as written (``0.1`` is a tenth), None when it is not a finite one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return Fraction(str(value)) if math.isfinite(value) else None


def _most_of_kind(kind: str, node: Mapping[str, Any], root: Any, depth: int) -> int | None:
    if kind == "object":
        return _most_object(node, root, depth)
    if kind == "array":
        return _most_array(node, root, depth)
    if kind == "string":
        high = node.get("maxLength")
        return 2 + _ESCAPED * high if isinstance(high, int) else None
    if kind in ("integer", "number"):
        low = _bound(node, "minimum", "exclusiveMinimum", lower=True)[0]
        high = _bound(node, "maximum", "exclusiveMaximum", lower=False)[0]
        if low is None or high is None:
            return None
        # an integral float (5.0) takes two characters more than its integer
        longest = 2 + max(len(str(math.ceil(low))), len(str(math.floor(high))))
        return longest if kind == "integer" else max(longest, _LONGEST_FLOAT)
    return {"boolean": len("false"), "null": len("null")}.get(kind)


def _most_object(node: Mapping[str, Any], root: Any, depth: int) -> int | None:
    """Every declared property at its longest; unbounded when others may be added."""
    if node.get("additionalProperties", True) is not False or node.get("patternProperties"):
        return None
    props = node.get("properties") if isinstance(node.get("properties"), Mapping) else {}
    sizes = [_read(sub, root, depth + 1, True) for sub in props.values()]
    if None in sizes:
        return None
    fields = sum(_size(name) + 1 + size for name, size in zip(props, sizes, strict=True))
    return 2 + fields + max(0, len(props) - 1)


def _most_array(node: Mapping[str, Any], root: Any, depth: int) -> int | None:
    """``maxItems`` items (or only the tuple's, where no others may follow) at their longest."""
    prefix, items = _array_items(node)
    count = node.get("maxItems") if isinstance(node.get("maxItems"), int) else None
    if items is False:
        count = len(prefix) if count is None else min(count, len(prefix))
    if count is None:
        return None
    sizes = [_read(prefix[i] if i < len(prefix) else items, root, depth + 1, True)
             for i in range(count)]
    return None if None in sizes else 2 + sum(sizes) + max(0, count - 1)
