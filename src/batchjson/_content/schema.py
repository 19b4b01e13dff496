"""Answer schemas (a pydantic model or a JSON Schema dict) and the per-call wire schema; and what
is read from a schema alone: a ``null`` read as absent (how an answer in OpenAI's strict mode,
where an optional property is sent as nullable, docs/providers.md "Strict schemas", leaves it out:
before an item is judged, a ``null`` the schema neither requires nor allows is taken out), and how
big an answer can be."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from typing import Any

import jsonschema
from jsonschema_specifications import REGISTRY as METASCHEMAS
from pydantic import BaseModel, ValidationError

from .._canon import canonical_json, read_json
from .._checks import surrogate_at
from .._errors import InvalidBatch
from .._fingerprint.fingerprint import fingerprint_function, model_fingerprint
from .tasks import sha


@dataclass
class ItemSchema:
    """A compiled answer schema: validates items and stores/restores validated values."""

    json_schema: dict
    fingerprint: str
    model: type[BaseModel] | None = None
    _validator: Any = field(default=None, repr=False)
    # what the model's validators read that no fingerprint can see (``globals()["X"]``)
    unseen: tuple[str, ...] = ()
    # keywords JSON Schema does not define (``x-...``, vendors'): kept, never checked, noted
    unknown_keywords: tuple[str, ...] = ()
    strict_integers: bool = field(default=False, repr=False)  # integers by literal only

    @cached_property
    def declared_fields(self) -> frozenset[str] | None:
        """The item fields the schema declares (read for every item judged: made once)."""
        if self.model is not None:
            return frozenset(self.model.model_fields)
        props = self.json_schema.get("properties")
        return frozenset(props) if isinstance(props, Mapping) else None

    @property
    def document(self) -> tuple[str, str]:
        """(component, canonical text) a revision keeps to recheck its export: ``schema_doc``
        when it compiles back to this fingerprint, else ``schema_shape`` (a model's)."""
        text = json.dumps(self.json_schema, sort_keys=True, separators=(",", ":"))
        exact = self.model is None and not self.strict_integers
        return ("schema_doc" if exact else "schema_shape"), text

    def validate(self, value: Any, path: str) -> tuple[Any, list[str]]:
        """Return (validated value, error messages); messages name the path and the field."""
        if self.model is not None:
            try:
                return self.model.model_validate(value), []
            except ValidationError as exc:
                return None, [f"{path}.{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}"
                              for err in exc.errors()]
        errors = sorted(self._validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        return (None if errors else value), [
            f"{path}{''.join(f'.{p}' for p in err.absolute_path)}: {err.message}" for err in errors]

    def exact_errors(self, exact: Any, plain: Any, path: str) -> list[str]:
        """The verdicts that change when a return's numbers are judged as written (``exact``)
        instead of as floats (``plain``, which passed; docs/design.md, "The commit boundary")."""
        exact_validator, plain_validator = self._exact_validators
        errors = list(exact_validator.iter_errors(exact))
        if errors and self.model is not None:
            known = {(tuple(e.absolute_path), e.validator)
                     for e in plain_validator.iter_errors(plain)}
            errors = [e for e in errors if (tuple(e.absolute_path), e.validator) not in known]
        return [f"{path}{''.join(f'.{p}' for p in e.absolute_path)}: "
                f"{_as_written(e.message)} (the number as written; as a float it "
                "would round to a value the check passes)"
                for e in sorted(errors, key=lambda e: list(map(str, e.absolute_path)))]

    @cached_property
    def _exact_validators(self) -> tuple[Any, Any]:
        """(a validator reading numbers as Decimals, a model's JSON Schema's over floats)."""
        text = json.dumps(self.json_schema, sort_keys=True)
        cls = jsonschema.validators.validator_for(self.json_schema,
                                                  default=jsonschema.Draft202012Validator)
        plain = cls(json.loads(text)) if self.model is not None else None
        base = type(self._validator) if self._validator is not None else cls
        exact = jsonschema.validators.extend(
            base, {"multipleOf": _exact_multiple_of},
            type_checker=base.TYPE_CHECKER if self.strict_integers
            else base.TYPE_CHECKER.redefine("integer", _exact_integer))
        return exact(json.loads(text, parse_float=Decimal)), plain

    @cached_property
    def _text(self) -> str:
        return json.dumps(self.json_schema)

    def dump(self, value: Any) -> Any:
        return value.model_dump(mode="json") if isinstance(value, BaseModel) else value

    def load(self, stored: Any) -> Any:
        """Value handed back to the caller: a model instance for a pydantic schema."""
        return stored if self.model is None else self.model.model_validate(stored)


def compile_schema(schema: Any, *, strict_integers: bool = False) -> ItemSchema:
    """Refuse an invalid schema before any call is made. ``strict_integers``: ``"integer"``
    admits integer literals only (not ``1.0``), as droste's checker does: another schema."""
    if isinstance(schema, ItemSchema):
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            js = schema.model_json_schema()
        except Exception as exc:  # pydantic raises several types for unschemable models
            raise InvalidBatch(
                f"pydantic model {schema.__qualname__} has no JSON schema: {exc}") from None
        # the whole class, not only its JSON schema: an edited field_validator is a new schema
        _refuse_surrogates(js, "")
        whole = fingerprint_function(schema)
        return ItemSchema(js, model_fingerprint(schema, js, whole), model=schema,
                          unseen=whole.unseen)
    if isinstance(schema, Mapping):
        try:
            return _compile_mapping(schema, strict_integers)
        except RecursionError:
            raise InvalidBatch("schema is nested too deeply to check; flatten it, or name its "
                               "repeated parts under $defs and $ref them") from None
    raise InvalidBatch(f"schema must be a pydantic model class or a JSON Schema dict, got "
                       f"{type(schema).__name__}")


def _compile_mapping(schema: Mapping[str, Any], strict_integers: bool = False) -> ItemSchema:
    """A JSON Schema dict, checked; compile_schema guards its recursion."""
    bad = _non_string_key(schema, "")
    if bad is not None:  # json.dumps would quietly turn 1 into "1": another schema
        where, key = bad
        raise InvalidBatch(f"schema keys must be strings: {key!r} ({type(key).__name__}) at "
                           f"{where or '<root>'}; JSON objects have only string keys, so write "
                           f"{str(key)!r} if that is the name meant")
    try:
        js = json.loads(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidBatch(f"schema is not JSON-serialisable: {exc}") from None
    _refuse_surrogates(js, "")
    cls = jsonschema.validators.validator_for(js, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(js)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise InvalidBatch(f"invalid JSON Schema at {where}: {exc.message}; fix the schema "
                           "(see json-schema.org) before running") from None
    unknown = tuple(_unknown_keywords(js, "", cls))
    text = json.dumps(js, sort_keys=True, separators=(",", ":"))
    fingerprint = sha(text)
    if strict_integers:
        cls = jsonschema.validators.extend(cls, type_checker=cls.TYPE_CHECKER.redefine(
            "integer", lambda _, value: isinstance(value, int) and not isinstance(value, bool)))
        fingerprint = sha(f"strict-integers:{text}")
    # the validator judges its own copy: the schema handed to providers (a value-mode call
    # carries json_schema itself) can be changed by one without widening what is accepted
    return ItemSchema(js, fingerprint, _validator=cls(json.loads(text)),
                      unknown_keywords=unknown, strict_integers=strict_integers)


# every keyword of every JSON Schema draft's metaschema (their vocabularies included)
KEYWORDS = frozenset(key for uri in METASCHEMAS
                     for key in (METASCHEMAS.contents(uri) or {}).get("properties", {}))
_DRAFTS = {"draft-03": jsonschema.Draft3Validator, "draft-04": jsonschema.Draft4Validator,
           "draft-06": jsonschema.Draft6Validator, "draft-07": jsonschema.Draft7Validator,
           "draft 2019-09": jsonschema.Draft201909Validator,
           "draft 2020-12": jsonschema.Draft202012Validator}
# the keywords that constrain (an annotation's typo, ``exampels``, changes no verdict)
_CONSTRAINTS = frozenset({"then", "else", "$defs", "definitions"}).union(
    *(cls.VALIDATORS for cls in _DRAFTS.values()))
# constraints a draft reads through another keyword (draft 3's boolean ``required`` through
# ``properties``, draft 4's boolean ``exclusiveMaximum`` through ``maximum``), never ignored
_READ_BY_OTHERS = frozenset({"then", "else", "$defs", "definitions", "required",
                             "exclusiveMaximum", "exclusiveMinimum"})
# what a draft that ignores a keyword writes instead
_RENAMED = {"dependencies": ("dependentRequired", "dependentSchemas"),
            "dependentRequired": ("dependencies",), "dependentSchemas": ("dependencies",),
            "prefixItems": ("items",), "additionalItems": ("items",),
            "divisibleBy": ("multipleOf",), "extends": ("allOf",), "disallow": ("not",),
            "$recursiveRef": ("$dynamicRef",), "$dynamicRef": ("$recursiveRef",)}
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas", "dependencies")
_SUBSCHEMAS = ("items", "prefixItems", "additionalItems", "contains", "additionalProperties",
               "unevaluatedProperties", "unevaluatedItems", "propertyNames", "allOf", "anyOf",
               "oneOf", "not", "if", "then", "else", "contentSchema", "extends", "disallow")


def _unknown_keywords(node: Any, where: str, cls: Any) -> Iterator[str]:
    """Each keyword of ``node`` and its subschemas that no draft defines, as ``keyword (at
    path)``. Refused, since its check would silently never run: a near miss of a constraint
    (``requried``), and a constraint the schema's own draft ``cls`` ignores."""
    if not isinstance(node, Mapping):
        return
    for key, value in node.items():
        here = f"{where}/{key}" if where else key
        if key in _CONSTRAINTS and key not in cls.VALIDATORS and key not in _READ_BY_OTHERS:
            raise InvalidBatch(_ignored_by_draft(key, where, cls))
        if key in _SUBSCHEMA_MAPS and isinstance(value, Mapping):
            for name, child in value.items():
                yield from _unknown_keywords(child, f"{here}/{name}", cls)
        elif key in _SUBSCHEMAS:
            for index, child in enumerate(value if isinstance(value, list) else [value]):
                yield from _unknown_keywords(child, f"{here}/{index}"
                                             if isinstance(value, list) else here, cls)
        elif key not in KEYWORDS:
            near = None if key.startswith("x-") else near_miss(key, _CONSTRAINTS)
            if near is not None:
                raise InvalidBatch(f"schema keyword {key!r} at {where or '<root>'} is not JSON "
                                   f"Schema (did you mean {near!r}?); a validator ignores it, "
                                   "so nothing it meant would be checked: fix the spelling")
            yield f"{key} (at {where or '<root>'})"


def _ignored_by_draft(key: str, where: str, cls: Any) -> str:
    """Why a constraint the schema's own draft ignores is refused, and the fix."""
    draft = next((name for name, each in _DRAFTS.items() if each is cls), cls.__name__)
    has = [name for name, each in _DRAFTS.items() if key in each.VALIDATORS]
    ours = " or ".join(repr(k) for k in _RENAMED.get(key, ()) if k in cls.VALIDATORS)
    return (f"schema keyword {key!r} at {where or '<root>'} is ignored by JSON Schema {draft}, "
            "the draft this schema is judged by (its $schema, else 2020-12), so nothing it "
            "meant would be checked: "
            + (f"write it as {ours}, as {draft} does, or " if ours else "")
            + f"set $schema to a draft that has {key!r} ({', '.join(has)})")


def near_miss(word: str, known: Iterable[str]) -> str | None:
    """The one of ``known`` that ``word`` is a likely typo of (``enun``), if any: one edit away
    (two past four letters), and not a known word extended (``typeof``: a vendor's keyword)."""
    for close in difflib.get_close_matches(word, known, n=3, cutoff=0.75):
        if close not in word and _edits(word, close) <= (1 if len(close) <= 4 else 2):
            return close
    return None


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap neighbours) from ``a`` to ``b``."""
    before, last = [], list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        row = [i]
        for j, y in enumerate(b, 1):
            row.append(min(last[j] + 1, row[j - 1] + 1, last[j - 1] + (x != y)))
            if i > 1 and j > 1 and x == b[j - 2] and a[i - 2] == y:
                row[j] = min(row[j], before[j - 2] + 1)
        before, last = last, row
    return last[-1]


_DECIMAL = re.compile(r"Decimal\('([^']*)'\)")


def _as_written(message: str) -> str:
    """A jsonschema message showing numbers as written, not as ``Decimal('0.3')``."""
    return _DECIMAL.sub(r"\1", message)


def _exact_integer(checker: Any, value: Any) -> bool:
    """JSON Schema's integer (``5.0`` is one) over exact numbers."""
    if isinstance(value, bool):
        return False
    if isinstance(value, Decimal):
        return value.is_finite() and value == value.to_integral_value()
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _exact_multiple_of(validator: Any, step: Any, instance: Any, schema: Any) -> Any:
    """``multipleOf`` in exact fractions: no float division, no decimal precision limit."""
    if not validator.is_type(instance, "number"):
        return
    if (Fraction(instance) / Fraction(step)).denominator != 1:
        yield jsonschema.ValidationError(f"{_as_written(repr(instance))} is not a "
                                         f"multiple of {_as_written(repr(step))}")


def _refuse_surrogates(value: Any, where: str) -> None:
    """A schema is keyed and sent as UTF-8: an unpaired surrogate in any of its texts is refused,
    named by where it is (compile_schema guards the recursion)."""
    if isinstance(value, str):
        if (at := surrogate_at(value)) is not None:
            raise InvalidBatch(f"schema holds an unpaired surrogate at {where or '<root>'} "
                               f"(position {at} of {value!r}), which is not valid Unicode and "
                               "cannot be sent or stored; fix the text")
    elif isinstance(value, dict):
        for key, child in value.items():
            _refuse_surrogates(key, f"{where}/{key!r} (a key)" if where else f"{key!r} (a key)")
            _refuse_surrogates(child, f"{where}/{key}" if where else str(key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            _refuse_surrogates(child, f"{where}/{index}" if where else str(index))


def _non_string_key(value: Any, where: str) -> tuple[str, Any] | None:
    """The first key of an object in ``value`` that is not a string, and where it is."""
    mapping = isinstance(value, Mapping)
    children = value.items() if mapping else enumerate(value) if isinstance(
        value, (list, tuple)) else ()
    for key, child in children:
        if mapping and not isinstance(key, str):
            return where, key
        found = _non_string_key(child, f"{where}/{key}" if where else str(key))
        if found is not None:
            return found
    return None


def wire_schema(item: ItemSchema, tasks: Sequence[Mapping[str, Any]],
                identity: Sequence[str], pinned: bool = True) -> dict:
    """The schema a provider may enforce, with the exact item count: identity fields pinned, or
    only typed (one schema for the batch, for a prompt cache; acceptance checks them anyway)."""
    base = read_json(item._text)  # the provider's own: it may change it, nothing else sees that
    defs = base.pop("$defs", None)
    props = dict(base.get("properties") or {})
    for name in identity:
        if not pinned:
            props.setdefault(name, _typed(tasks, name))
            continue
        distinct = {canonical_json(t[name]): t[name] for t in tasks}
        props[name] = {"enum": [distinct[text] for text in sorted(distinct)]}
    required = list(dict.fromkeys([*identity, *(base.get("required") or [])]))
    item_schema = {**base, "type": "object", "properties": props, "required": required}
    items = {"type": "array", "items": item_schema, "minItems": len(tasks),
             "maxItems": len(tasks)}
    wire = {"type": "object", "properties": {"items": items}, "required": ["items"],
            "additionalProperties": False}
    return {**wire, "$defs": defs} if defs else wire


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"), (dict, "object"))


def _typed(tasks: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """An identity field's JSON type(s) across ``tasks``, without their values."""
    kinds = sorted({next((kind for cls, kind in _JSON_TYPES if isinstance(t[name], cls)), "null")
                    for t in tasks})
    return {"type": kinds[0] if len(kinds) == 1 else kinds}


MISSING = object()  # what resolve_pointer gives for a $ref that names nothing in the schema


def resolve_pointer(root: Any, ref: str) -> Any:
    """The node ``ref`` (``#/$defs/Name``) names within the schema, else ``MISSING``."""
    if not ref.startswith("#"):
        return MISSING
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return MISSING
    return node


# -- a null read as absent ---------------------------------------------------------------------
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
    if isinstance(ref, str) and _hops < _REF_HOPS:
        target = resolve_pointer(root, ref)  # one it cannot follow says nothing either way
        if target is not MISSING and not allows_null(target, root, _hops + 1):
            return False
    kind = node.get("type")
    if isinstance(kind, (str, list)) and "null" not in ([kind] if isinstance(kind, str) else kind):
        return False
    if isinstance(node.get("enum"), list) and None not in node["enum"]:
        return False
    if "const" in node and node["const"] is not None:
        return False
    for key, needed in (("anyOf", any), ("oneOf", any), ("allOf", all)):
        branches = node.get(key)
        if isinstance(branches, list) and not needed(allows_null(b, root, _hops + 1)
                                                     for b in branches):
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
    if depth > _MAX_DEPTH or not isinstance(value, (dict, list)):
        return value
    node = _resolved(node, root)
    if not isinstance(node, Mapping):
        return value
    return (_object if isinstance(value, dict) else _array)(value, node, root, depth)


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
        if item is None and declaring and not any(  # each leaves it optional, not nullable
                key in (s["required"] if isinstance(s.get("required"), list) else ())
                or allows_null(s["properties"][key], root) for s in declaring):
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


# -- how big an answer can be, from the schema alone: the least a pack's answers can be (for the
# input check), the most characters any valid answer takes. Both are bounds: the least reads only
# keywords asking for a least; the most is None wherever a size is uncapped. --------------------
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


def _alternatives(node: Mapping[str, Any]) -> list[Any]:
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
    if branches := _alternatives(node):
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
    if kind == "object":  # every declared property at its longest; unbounded if others may be
        if node.get("additionalProperties", True) is not False or node.get("patternProperties"):
            return None
        props = node.get("properties") if isinstance(node.get("properties"), Mapping) else {}
        sizes = {name: _read(sub, root, depth + 1, True) for name, sub in props.items()}
        return _bracketed([None if size is None else _size(name) + 1 + size
                           for name, size in sizes.items()])
    if kind == "array":  # maxItems items (or only the tuple's, where no others may follow)
        prefix, items = _array_items(node)
        count = node.get("maxItems") if isinstance(node.get("maxItems"), int) else None
        if items is False:
            count = len(prefix) if count is None else min(count, len(prefix))
        return None if count is None else _bracketed([
            _read(prefix[i] if i < len(prefix) else items, root, depth + 1, True)
            for i in range(count)])
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


def _bracketed(sizes: list[int | None]) -> int | None:
    """Parts between brackets with a comma between each; unbounded if one is."""
    return None if None in sizes else 2 + sum(sizes) + max(0, len(sizes) - 1)
