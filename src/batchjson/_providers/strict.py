"""OpenAI's strict mode: a wire schema's strict form, or why it has none. A schema is rewritten
only where the rewrite accepts a subset of what it accepts; else the provider uses JSON mode."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pydantic_core

from .._content.schema import MISSING, allows_null, resolve_pointer

SUPPORTED_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname",
                               "ipv4", "ipv6", "uuid"})
TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
KEPT_ANNOTATIONS = frozenset({"title", "description"})
# Annotations no JSON Schema validator judges by (``nullable`` is OpenAPI's): dropped freely.
DROPPED_ANNOTATIONS = frozenset({"default", "examples", "example", "deprecated", "readOnly",
                                 "writeOnly", "$comment", "$schema", "$id", "nullable"})
CONSTRAINTS = frozenset({"enum", "const", "pattern", "minimum", "maximum", "exclusiveMinimum",
                         "exclusiveMaximum", "multipleOf", "minItems", "maxItems"})
MAX_PROPERTIES = 5000
MAX_DEPTH = 10
MAX_ENUM_VALUES = 1000
MAX_CHARS = 120_000
BIG_ENUM, BIG_ENUM_CHARS = 250, 15_000
_NULL = {"type": "null"}


@dataclass(frozen=True)
class StrictForm:
    """The strict form of a schema, or ``None`` with the ``problems`` that keep it from one; a
    shape's (cached, shared) also says what its size counts so far, for a call's values to add."""

    schema: dict[str, Any] | None
    problems: tuple[str, ...] = ()
    counts: Mapping[str, int] = field(default_factory=dict)
    depth: int = 0


def strict_form(schema: Mapping[str, Any], shape: str = "",
                pinned: Sequence[str] = ()) -> StrictForm:
    """``schema``'s strict form: its shape's made once, a call's own values put back on a copy
    of the path to them (below it the form is shared: never change it). ``shape``: a key the
    calls of a run share (``Call.schema_shape``), by which their shape's form is found without
    the shape being rebuilt and serialised for each; ``pinned``: with it, the identity fields
    whose values the items array pins (none: the schema is the same for every call)."""
    if not shape:
        pins = _pins(schema)
        return _pinned(_form_of(_lifted(schema, pins)), pins)
    pins = _pins_of(schema, pinned) if pinned else {}
    form = _by_shape.get(shape)
    if form is None:
        if len(_by_shape) >= SHAPES_HELD:
            _by_shape.clear()
        form = _by_shape[shape] = _form_of(_lifted(schema, pins))
    return _pinned(form, pins)


SHAPES_HELD = 64
_by_shape: dict[str, StrictForm] = {}


def _form_of(shape: Mapping[str, Any]) -> StrictForm:
    try:
        text = pydantic_core.to_json(shape, inf_nan_mode="constants")  # a fast key
    except ValueError:  # not JSON (a test's own schema): made as it is, uncached
        return _shape_form(shape)
    return _cached_form(text)


@lru_cache(maxsize=64)
def _cached_form(text: bytes) -> StrictForm:
    return _shape_form(json.loads(text))


def _shape_form(schema: Mapping[str, Any]) -> StrictForm:
    walker = _Walker(schema)
    if schema.get("type") != "object" or "anyOf" in schema:
        walker.problem("", "a root that is not an object (strict mode needs an object root "
                       "without anyOf)")
    out = walker.node(schema, "")
    for key in ("$defs", "definitions"):
        defs = schema.get(key)
        if isinstance(defs, Mapping):
            walker.counts["chars"] += sum(len(name) for name in defs)
            out[key] = {name: walker.node(sub, f"{key}.{name}") for name, sub in defs.items()}
    if walker.problems:
        return StrictForm(None, tuple(walker.problems))
    return StrictForm(out, tuple(walker.sizes), walker.counts, _depth(out, out, ()))


# A call's own values in its wire schema: its item count, and its items' pinned identity values.
_COUNTS = ("minItems", "maxItems")


def _pins(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A wire schema's values of one call: its item count and pinned identity values (a
    required property that is one ``enum`` alone); empty when it has no items array."""
    array = _at(schema, "properties", "items")
    item = _at(array, "items")
    props = _at(item, "properties")
    if (array is None or item is None or props is None or not _required("items", schema)
            or "$ref" in array or "allOf" in array or "anyOf" in array
            or "$ref" in item or "allOf" in item or "anyOf" in item):
        return {}
    required = item["required"] if isinstance(item.get("required"), list) else ()
    enums = {name: node["enum"] for name, node in props.items() if isinstance(node, Mapping)
             and len(node) == 1 and isinstance(node.get("enum"), list) and name in required}
    return {"counts": {key: array[key] for key in _COUNTS if key in array}, "enums": enums}


def _pins_of(schema: Mapping[str, Any], pinned: Sequence[str]) -> dict[str, Any]:
    """The values of one call of a known shape: its item count, the ``pinned`` fields' values."""
    array = schema["properties"]["items"]
    props = array["items"]["properties"]
    return {"counts": {key: array[key] for key in _COUNTS},
            "enums": {name: props[name]["enum"] for name in pinned}}


def _lifted(schema: Mapping[str, Any], pins: Mapping[str, Any]) -> Mapping[str, Any]:
    """A wire schema without its ``pins`` (a pinned value leaves an empty ``enum``)."""
    if not pins:
        return schema
    array = schema["properties"]["items"]
    item = array["items"]
    item = {**item, "properties": {**item["properties"],
                                   **dict.fromkeys(pins["enums"], _EMPTY_ENUM)}}
    array = {k: v for k, v in array.items() if k not in pins["counts"]}
    array["items"] = item
    return {**schema, "properties": {**schema["properties"], "items": array}}


_EMPTY_ENUM: Mapping[str, Any] = {"enum": []}  # only serialised, as a cache key's part


def _pinned(shape: StrictForm, pins: Mapping[str, Any]) -> StrictForm:
    """The shape's form with a call's values put back (counted as the walk would), or why not."""
    if shape.schema is None:
        return shape
    counts, problems = shape.counts, list(shape.problems)
    enums = pins.get("enums")
    if enums:
        counts = dict(counts)
        for values in enums.values():
            _count_values({"enum": values}, counts, problems)
    if (counts["properties"] > MAX_PROPERTIES or shape.depth > MAX_DEPTH
            or counts["enum"] > MAX_ENUM_VALUES or counts["chars"] > MAX_CHARS):
        problems += [f"{value:,} {what}, more than strict mode's {limit:,}" for what, value, limit
                     in (("object properties", counts["properties"], MAX_PROPERTIES),
                         ("levels of nested objects", shape.depth, MAX_DEPTH),
                         ("enum values", counts["enum"], MAX_ENUM_VALUES),
                         ("characters of names, enum and const values", counts["chars"],
                          MAX_CHARS))
                     if value > limit]
    if problems or not pins:
        return StrictForm(None, tuple(problems)) if problems else shape
    form = shape.schema
    array = {**form["properties"]["items"], **pins["counts"]}
    if enums:
        item = array["items"]
        array["items"] = {**item, "properties": {**item["properties"], **{
            name: {"enum": values} for name, values in enums.items()}}}
    return StrictForm({**form, "properties": {**form["properties"], "items": array}})


def _at(node: Any, *keys: str) -> Mapping[str, Any] | None:
    for key in keys:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else None


def _required(name: str, node: Mapping[str, Any]) -> bool:
    required = node.get("required")
    return isinstance(required, list) and name in required


class _Walker:
    """Makes a schema's strict form, noting what keeps it from one and what its size counts;
    a ``path`` is a field path (``a[].b``; ``""``: the root)."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.problems: list[str] = []
        self.counts = {"properties": 0, "enum": 0, "chars": 0}  # of the form made
        self.sizes: list[str] = []  # enums too big on their own

    def problem(self, path: str, what: str) -> None:
        self.problems.append(f"{path or 'the root'}: {what}")

    def node(self, node: Any, path: str) -> Any:
        if not isinstance(node, Mapping):
            self.problem(path, "a schema of true/false (any value, or none)")
            return node
        node = self._inlined(node)
        if "$ref" in node:
            return self._ref(node, path)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in DROPPED_ANNOTATIONS or key in ("properties", "required",
                                                      "additionalProperties"):
                continue
            if key in ("$defs", "definitions"):
                if path:
                    self.problem(path, f"{key} below the root")
            elif key in KEPT_ANNOTATIONS:
                if isinstance(value, str):  # else an annotation of no use to anyone
                    out[key] = value
            elif key in CONSTRAINTS:
                if key.startswith("exclusive") and isinstance(value, bool):
                    self.problem(path, f"{key}: {value} (draft 4's flag; give the bound)")
                out[key] = value
            elif key == "type":
                kinds = value if isinstance(value, list) else [value]
                if not kinds or not all(isinstance(k, str) and k in TYPES for k in kinds):
                    self.problem(path, f"type {value!r}")
                out[key] = value
            elif key == "format":
                if value not in SUPPORTED_FORMATS:
                    self.problem(path, f"format {value!r} (strict mode takes "
                                 f"{', '.join(sorted(SUPPORTED_FORMATS))})")
                out[key] = value
            elif key == "anyOf" and isinstance(value, list):
                out[key] = [self.node(b, f"{path}(anyOf {i})") for i, b in enumerate(value)]
            elif key == "items" and isinstance(value, Mapping):
                out[key] = self.node(value, path + "[]")
            else:
                self.problem(path, f"the keyword {key!r}, which strict mode does not take")
        _count_values(out, self.counts, self.sizes)
        return self._shaped(node, out, path)

    def _inlined(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """``allOf`` of one schema (older pydantic's ``$ref``) beside annotations only is it."""
        parts = node.get("allOf")
        if (not (isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], Mapping))
                or set(node) - {"allOf"} - KEPT_ANNOTATIONS - DROPPED_ANNOTATIONS):
            return node  # judged as it is: allOf is outside the subset
        return {**{k: v for k, v in node.items() if k != "allOf"}, **parts[0]}

    def _ref(self, node: Mapping[str, Any], path: str) -> dict[str, Any]:
        """A local ``$ref`` into ``$defs``; annotations beside it dropped, anything else refused."""
        ref = node["$ref"]
        beside = set(node) - {"$ref"} - KEPT_ANNOTATIONS - DROPPED_ANNOTATIONS
        if beside:
            self.problem(path, f"$ref beside {', '.join(sorted(beside))}")
        if not (isinstance(ref, str) and ref.split("/")[:2] in (["#", "$defs"],
                                                                ["#", "definitions"])
                and resolve_pointer(self.root, ref) is not MISSING):
            self.problem(path, f"$ref {ref!r} (strict mode follows only #/$defs/... here)")
        return {"$ref": ref}

    def _shaped(self, node: Mapping[str, Any], out: dict[str, Any],
                path: str) -> dict[str, Any]:
        kinds = node.get("type")
        kinds = set(kinds) if isinstance(kinds, list) else {kinds}
        if "object" in kinds or "properties" in node or "additionalProperties" in node:
            self._object(node, out, path)
        if ("array" in kinds or "items" in node) and not isinstance(out.get("items"), Mapping):
            self.problem(path, "an array whose items have no schema")
            return out
        if not out.keys() & {"type", "enum", "const", "anyOf"}:
            if "items" in out:
                out["type"] = "array"  # items alone also let non-arrays through: a subset
            else:
                self.problem(path, "a value of any type (no type, enum or anyOf)")
        return out

    def _object(self, node: Mapping[str, Any], out: dict[str, Any],
                path: str) -> None:
        props = node.get("properties")
        extra = node.get("additionalProperties")
        keyed = isinstance(extra, Mapping) and bool(extra)
        if keyed:
            self.problem(path, "keys of any name with a schema of their own "
                         "(additionalProperties: {...}, a dict[str, X])")
        out.setdefault("type", "object")
        if not isinstance(props, Mapping) or not props:
            if extra is not False and not keyed:
                self.problem(path, "a free-form object (no declared properties)")
            out["additionalProperties"] = False
            return
        required = node["required"] if isinstance(node.get("required"), list) else []
        undeclared = [name for name in required if name not in props]
        if undeclared:
            self.problem(path, f"required {', '.join(map(repr, undeclared))} not declared "
                         "under properties")
        self.counts["properties"] += len(props)
        self.counts["chars"] += sum(len(name) for name in props)
        forms = {name: self.node(sub, f"{path}.{name}" if path else name)
                 for name, sub in props.items()}
        out.update(properties={name: form if name in required else self._nullable(form)
                               for name, form in forms.items()},
                   required=list(props), additionalProperties=False)

    def _nullable(self, node: Any) -> Any:
        """An optional property's schema, taking ``null`` too (which acceptance reads as absent)."""
        if not isinstance(node, dict) or allows_null(node, self.root):
            return node
        if set(node) - KEPT_ANNOTATIONS == {"anyOf"} and isinstance(node["anyOf"], list):
            return {**node, "anyOf": [*node["anyOf"], _NULL]}
        kind = node.get("type")
        if isinstance(kind, str) and not node.keys() & {"enum", "const"}:
            return {**node, "type": [kind, "null"]}
        return {"anyOf": [node, _NULL]}


def _count_values(node: Mapping[str, Any], counts: dict[str, int], problems: list[str]) -> None:
    values = node.get("enum")
    if isinstance(values, list):
        counts["enum"] += len(values)
        chars = sum(len(v) for v in values if isinstance(v, str))
        counts["chars"] += chars
        if len(values) > BIG_ENUM and chars > BIG_ENUM_CHARS:
            problems.append(f"an enum of {len(values)} values with {chars:,} characters (over "
                            f"{BIG_ENUM} values may total at most {BIG_ENUM_CHARS:,})")
    if isinstance(node.get("const"), str):
        counts["chars"] += len(node["const"])


def _depth(node: Any, root: Mapping[str, Any], refs: tuple[str, ...]) -> int:
    """Levels of objects nested in ``node`` (a recursive ``$ref`` counts once)."""
    if not isinstance(node, Mapping):
        return 0
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in refs:
            return 0
        return _depth(resolve_pointer(root, ref), root, (*refs, ref))
    inner = [*((node.get("properties") or {}).values()), *(node.get("anyOf") or [])]
    if "items" in node:
        inner.append(node["items"])
    below = max((_depth(sub, root, refs) for sub in inner), default=0)
    return below + (1 if isinstance(node.get("properties"), Mapping) else 0)
