"""A ``null`` read as absent: how an answer in OpenAI's strict mode, where an optional property is
sent as nullable (docs/providers.md, "Strict schemas"), leaves it out. Before an item is judged, a
``null`` the answer schema neither requires nor allows is taken out, by the schema alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .schema import MISSING, resolve_pointer

_MAX_DEPTH = 64  # deeper answers keep their nulls: judging stays total on a crafted return
_REF_HOPS = 32  # a $ref chain longer than this is a cycle: the node is taken as it stands


def without_absent_nulls(value: Any, schema: Any) -> Any:
    """``value`` without the nulls that stand for absent optional properties (itself if none)."""
    return _walk(value, schema, schema, 0) if isinstance(schema, Mapping) else value


def allows_null(node: Any, root: Any, _hops: int = 0) -> bool:
    """Whether ``null`` may pass ``node`` as far as ``type``, ``enum``, ``const``, ``anyOf``/
    ``oneOf``/``allOf``, ``not: {"type": "null"}`` and local ``$ref``s say (others let it by)."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, Mapping):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = resolve_pointer(root, ref)  # one it cannot follow says nothing either way
        if (target is not MISSING and _hops < _REF_HOPS
                and not allows_null(target, root, _hops + 1)):
            return False
    kind = node.get("type")
    if isinstance(kind, str) and kind != "null":
        return False
    if isinstance(kind, list) and "null" not in kind:
        return False
    if isinstance(node.get("enum"), list) and None not in node["enum"]:
        return False
    if "const" in node and node["const"] is not None:
        return False
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and not any(allows_null(b, root, _hops + 1)
                                                  for b in branches):
            return False
    branches = node.get("allOf")
    if isinstance(branches, list) and not all(allows_null(b, root, _hops + 1) for b in branches):
        return False
    negated = node.get("not")
    return not (isinstance(negated, Mapping) and negated.get("type") == "null")


def _resolved(node: Any, root: Any) -> Any:
    """The schema a ``$ref`` names (followed while the node declares no properties itself)."""
    for _ in range(_REF_HOPS):
        if not isinstance(node, Mapping) or "properties" in node:
            return node
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return node
        target = resolve_pointer(root, ref)
        if target is MISSING:
            return node
        node = target
    return node


def _walk(value: Any, node: Any, root: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return value
    node = _resolved(node, root)
    if not isinstance(node, Mapping):
        return value
    if isinstance(value, dict):
        return _object(value, node, root, depth)
    if isinstance(value, list):
        return _array(value, node, root, depth)
    return value


def _array(value: list[Any], node: Mapping[str, Any], root: Any, depth: int) -> list[Any]:
    items, prefix = node.get("items"), node.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    if not isinstance(items, Mapping) and not prefix:
        return value
    out = [_walk(item, prefix[i] if i < len(prefix) else items, root, depth + 1)
           for i, item in enumerate(value)]
    return out if any(a is not b for a, b in zip(out, value, strict=True)) else value


def _object(value: dict[str, Any], node: Mapping[str, Any], root: Any,
            depth: int) -> dict[str, Any]:
    """Drop a null where every declaring schema (the node or a branch) leaves the property
    optional and not nullable; walk into the other values a single subschema declares."""
    shapes = [s for s in (node, *_branches(node, root)) if isinstance(s.get("properties"),
                                                                       Mapping)]
    if not shapes:
        return value
    out: dict[str, Any] = {}
    changed = False
    for key, item in value.items():
        declaring = [s for s in shapes if key in s["properties"]]
        if item is None and declaring and all(_absent_null(s, key, root) for s in declaring):
            changed = True
            continue
        subschemas = {id(s["properties"][key]): s["properties"][key] for s in declaring}
        if len(subschemas) == 1 and isinstance(item, (dict, list)):
            walked = _walk(item, next(iter(subschemas.values())), root, depth + 1)
            changed = changed or walked is not item
            item = walked
        out[key] = item
    return out if changed else value


def _branches(node: Mapping[str, Any], root: Any) -> list[Mapping[str, Any]]:
    found = []
    for key in ("anyOf", "oneOf", "allOf"):
        branches = node.get(key)
        if isinstance(branches, list):
            found += [b for b in (_resolved(b, root) for b in branches) if isinstance(b, Mapping)]
    return found


def _absent_null(shape: Mapping[str, Any], key: str, root: Any) -> bool:
    required = shape.get("required")
    optional = not (isinstance(required, list) and key in required)
    return optional and not allows_null(shape["properties"][key], root)
