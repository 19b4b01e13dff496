"""What the real chat-completions API refuses with a 400 before any model runs, so that a
client the loopback server accepts is one the real API accepts too.

- Per model (the reasoning models): o1-mini and o1-preview refuse a ``system`` or
  ``developer`` message, any ``response_format`` and ``stop``; the o-series and the gpt-5
  family refuse ``max_tokens`` and the sampling settings. Messages, params and codes are the
  recorded ones (tests/fixtures/recorded/openai/oa_400_*).
- Strict mode (``response_format`` ``json_schema`` with ``strict: true``): the subset OpenAI's
  Structured Outputs guide lists ("Supported schemas"): an object root without ``anyOf``,
  every object closed and every property required, only the listed keywords and formats, and
  the size limits. The first rule broken is answered, as the API answers one at a time. The
  messages for an unclosed object and a missing ``required`` key are the recorded ones; the
  others keep their shape (``Invalid schema for response_format '<name>': In context=(...),
  ...``).
- JSON mode (``json_object``) needs the word "json" in the messages.

Written from the recordings and the guide, not from batchjson's own provider code, so a test
against this server checks the provider rather than repeating it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ._ratelimits import content_text


class Refusal(NamedTuple):
    """A 400 ``invalid_request_error``: its message, ``param`` and ``code``."""

    message: str
    param: str | None
    code: str | None


EARLY_REASONING = re.compile(r"o1-(mini|preview)(-|$)")
CHAT_TUNED = re.compile(r"gpt-5(\.\d+)?-chat(-|$)")
REASONING = re.compile(r"(o\d+|gpt-5(\.\d+)?)(-|$)")
SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "logprobs",
            "top_logprobs", "logit_bias")
FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4",
                     "ipv6", "uuid"})
KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum",
                      "const", "anyOf", "$ref", "$defs", "definitions", "title", "description",
                      "default", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                      "exclusiveMaximum", "multipleOf", "minItems", "maxItems"})
GUIDE = "https://platform.openai.com/docs/guides/structured-outputs"


def refusal(data: Mapping[str, Any]) -> Refusal | None:
    """The 400 the real API answers ``data`` with, or None when it takes the request."""
    name = str(data.get("model") or "").rsplit("/", 1)[-1].removeprefix("ft:")
    found = _model_refusal(name, data) if REASONING.match(name) and not CHAT_TUNED.match(
        name) else None
    if found is not None:
        return found
    fmt = data.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
        words = " ".join(content_text(m.get("content")) for m in data.get("messages") or []
                         if isinstance(m, Mapping))
        if "json" not in words.lower():
            return Refusal("'messages' must contain the word 'json' in some form, to use "
                           "'response_format' of type 'json_object'.", "messages", None)
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        if isinstance(spec, Mapping) and spec.get("strict") is True:
            problem = schema_problem(spec.get("schema"))
            if problem is not None:
                return Refusal(f"Invalid schema for response_format '{spec.get('name')}': "
                               f"{problem}", "response_format", None)
    return None


def _model_refusal(name: str, data: Mapping[str, Any]) -> Refusal | None:
    early = EARLY_REASONING.match(name) is not None
    messages = data.get("messages") or []
    if early:
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, Mapping) else None
            if role in ("system", "developer"):
                return Refusal(f"Unsupported value: 'messages[{i}].role' does not support "
                               f"'{role}' with this model.", f"messages[{i}].role",
                               "unsupported_value")
        fmt = data.get("response_format")
        if isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object"):
            return Refusal(f"Invalid parameter: 'response_format' of type '{fmt['type']}' is "
                           "not supported with this model. Learn more about supported models "
                           f"at the Structured Outputs guide: {GUIDE}", "response_format", None)
        if "stop" in data:
            return _unsupported("stop")
    if "max_tokens" in data:
        return Refusal("Unsupported parameter: 'max_tokens' is not supported with this model. "
                       "Use 'max_completion_tokens' instead.", "max_tokens",
                       "unsupported_parameter")
    for key in SAMPLING:
        if key in data:
            if name.startswith("gpt-5") and key == "temperature":
                if data[key] == 1:
                    continue
                return Refusal(f"Unsupported value: 'temperature' does not support {data[key]} "
                               "with this model. Only the default (1) value is supported.",
                               "temperature", "unsupported_value")
            return _unsupported(key)
    return None


def _unsupported(key: str) -> Refusal:
    return Refusal(f"Unsupported parameter: '{key}' is not supported with this model.", key,
                   "unsupported_parameter")


def schema_problem(schema: Any) -> str | None:
    """The first strict-mode rule ``schema`` breaks, worded as the API words it."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object" or "anyOf" in schema:
        kind = schema.get("type") if isinstance(schema, Mapping) else None
        return f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{kind}\"'."
    walk = _Walk(schema)
    found = walk.node(schema, ())
    for key in ("$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            found = found or walk.node(sub, (key, name))
    return found or walk.limits()


class _Walk:
    """Walks a schema once, counting what the guide limits."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.properties = self.enum_values = 0
        self.big_enum: str | None = None
        self.chars = sum(len(n) for key in ("$defs", "definitions")
                         for n in (root.get(key) or {}))

    def node(self, node: Any, path: tuple[str, ...]) -> str | None:
        context = f"In context={path!r}, "
        if not isinstance(node, Mapping):
            return f"{context}schema must be a JSON Schema object."
        for key in node:
            if key not in KEYWORDS:
                return f"{context}'{key}' is not permitted."
        if "$ref" in node:
            if len(node) > 1:
                return f"{context}'$ref' may not be combined with other keywords."
            return None
        if not node.keys() & {"type", "enum", "const", "anyOf"}:
            return f"{context}schema must have a 'type' key."
        if "format" in node and node["format"] not in FORMATS:
            return f"{context}'{node['format']}' is not a valid format."
        self._count(node)
        kinds = node.get("type")
        kinds = set(kinds) if isinstance(kinds, list) else {kinds}
        if "object" in kinds:
            found = self._object(node, path, context)
            if found:
                return found
        if "array" in kinds:
            if not isinstance(node.get("items"), Mapping):
                return f"{context}'items' is required to be supplied."
            found = self.node(node["items"], (*path, "items"))
            if found:
                return found
        for i, branch in enumerate(node.get("anyOf") or []):
            found = self.node(branch, (*path, "anyOf", str(i)))
            if found:
                return found
        return None

    def _object(self, node: Mapping[str, Any], path: tuple[str, ...],
                context: str) -> str | None:
        if node.get("additionalProperties") is not False:
            return f"{context}'additionalProperties' is required to be supplied and to be false."
        props = node.get("properties") or {}
        required = node.get("required")
        must = ("'required' is required to be supplied and to be an array including every key "
                "in properties.")
        if props and not isinstance(required, list):
            return f"{context}{must}"
        missing = [k for k in props if k not in (required or [])]
        if missing:
            return f"{context}{must} Missing '{missing[0]}'."
        extra = [k for k in required or [] if k not in props]
        if extra:
            return f"{context}{must} Extra required key '{extra[0]}' supplied."
        self.properties += len(props)
        self.chars += sum(len(k) for k in props)
        for key, sub in props.items():
            found = self.node(sub, (*path, "properties", key))
            if found:
                return found
        return None

    def _count(self, node: Mapping[str, Any]) -> None:
        values = node.get("enum")
        if isinstance(values, list):
            chars = sum(len(v) for v in values if isinstance(v, str))
            self.enum_values += len(values)
            self.chars += chars
            if len(values) > 250 and chars > 15_000:
                self.big_enum = self.big_enum or (
                    f"An enum of {len(values)} values totals {chars} characters; with more "
                    "than 250 values at most 15000 are supported.")
        if isinstance(node.get("const"), str):
            self.chars += len(node["const"])

    def limits(self) -> str | None:
        depth = _depth(self.root, self.root, ())
        for count, limit, what in ((self.properties, 5000, "object properties"),
                                   (depth, 10, "levels of nesting"),
                                   (self.enum_values, 1000, "enum values"),
                                   (self.chars, 120_000, "characters of property names, "
                                    "definition names, enum and const values")):
            if count > limit:
                return f"The schema has more than {limit} {what}, which is not supported."
        return self.big_enum


def _depth(node: Any, root: Mapping[str, Any], refs: Sequence[str]) -> int:
    if not isinstance(node, Mapping):
        return 0
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in refs or not ref.startswith("#/"):
            return 0
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return _depth(target, root, (*refs, ref))
    inner = [*((node.get("properties") or {}).values()), *(node.get("anyOf") or [])]
    if isinstance(node.get("items"), Mapping):
        inner.append(node["items"])
    below = max((_depth(sub, root, refs) for sub in inner), default=0)
    return below + (1 if isinstance(node.get("properties"), Mapping) else 0)
