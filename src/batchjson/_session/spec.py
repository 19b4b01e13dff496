"""The one public description of a run (:class:`RunSpec`) and the one place that checks its
inputs, so every face refuses the same inputs in the same words before anything is touched; then
:func:`check_fit`: what the provider cannot answer or fit, refused before spending."""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import json
import math
import os
import re
import sys
import textwrap
import tokenize
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import Field, PlainValidator, SkipValidation

from .._acceptance.judge import ECHO_EXEMPT
from .._checks import Count, CountOrNone, Flag, Positive, Seconds, options, surrogate_at
from .._content.schema import MISSING as _MISSING
from .._content.schema import ItemSchema, compile_schema, smallest_answers, wire_schema
from .._content.schema import resolve_pointer as _resolve
from .._content.tasks import (
    Identity,
    Request,
    is_task_file,
    items_prompt_chars,
    normalize_identity,
    normalize_tasks,
)
from .._errors import ConfigError, InvalidBatch, ProviderSetupError
from .._fingerprint.fingerprint import unwrap_callable
from .._ledger import Ledger
from .._providers.ratelimits import request_tokens, request_tokens_of
from .._providers.settings import call_output_cap, declared_output_cap
from .._replay.budget import Budget
from .._replay.pacing import Pacer, pack_that_fits
from .._replay.plan import Plan, first_prompt, system_prompt
from .._secrets import check_name

Mode = Literal["items", "value"]
ValidatorArgs = Literal["task", "index", "droste"]
OnExhausted = Literal["raise", "return"]
TransportName = Literal["live", "batch"]
Accept = Literal["whole", "items"]


@options(InvalidBatch)
class RunSpec:
    """What to resolve and under which rules: :meth:`~batchjson.Session.run_batch`'s arguments and
    these (docs/api.md); a bad option is an :class:`~batchjson.InvalidBatch` when the spec is made.

    - ``mode="items"``: ``pack`` tasks a call, returning ``{"items": [...]}``; ``mode="value"``:
      one task a call, a bare JSON value (droste's shape).
    - ``validator_args``: ``validator(value, task)``, ``validator(value, task["index"])``, or
      that reading verdicts as droste does. ``None`` repairs/replays: the session's setting.
    - ``refuse_short_budget``: refused before spending unless the budget covers a call a request."""

    # checked here, by their own rules: the texts, the validator, the identity's shape
    name: SkipValidation[str]
    tasks: SkipValidation[Iterable[Mapping[str, Any]] | str | os.PathLike]  # or a JSONL path
    schema: Any
    validator: SkipValidation[Callable[..., Any] | None] = None
    validator_name: SkipValidation[str | None] = None
    identity: SkipValidation[Sequence[str] | str | None] = None
    pack: Positive = 1
    instructions: SkipValidation[str | None] = None
    repairs: CountOrNone = None
    replays: CountOrNone = None
    split: Flag = False
    reask_refusals: Flag = False
    max_calls: CountOrNone = None
    on_exhausted: OnExhausted = "raise"
    progress: Annotated[bool | None, Field(description=(
        "True, False or None (on in a terminal or a notebook)"))] = None
    mode: Mode = "items"
    validator_args: ValidatorArgs = "task"
    refuse_short_budget: Flag = True
    transport: TransportName = "live"
    wait: Flag = False
    accept: Accept = "whole"

    def __post_init__(self) -> None:
        """What its types cannot say, each checked alone and cheaply."""
        check_text("batch name", self.name, "run_batch('labels', ...)", required=True)
        check_text("instructions", self.instructions, "instructions='Answer in English.'",
                   free=True)
        if self.transport == "batch" and self.validator_args != "task":
            raise InvalidBatch(
                "transport='batch' is refused for droste's llm_batch_json contract (the droste "
                "and rlm bindings): it returns values now and has no pending result; use "
                "transport='live' there, or run_batch / %%batch_json for batch jobs")
        check_text("validator_name", self.validator_name, "validator_name='label_check'")
        check_validator(self.validator, self.validator_args)
        if isinstance(self.identity, Iterator):  # read once here, so kept as read
            object.__setattr__(self, "identity", tuple(self.identity))
        normalize_identity(self.identity)  # its shape; the tasks are checked against it later

    def checked(self, on_read: Callable[[int], Any] | None = None) -> CheckedRun:
        """The content, checked and in the ledger's JSON form (``on_read(n)``: n more read)."""
        identity = normalize_identity(self.identity)
        hasher = hashlib.sha256() if is_task_file(self.tasks) else None
        tasks, _, fields = normalize_tasks(  # the names an echo or a tasks file's memo reads
            self.tasks, identity, hasher, pack=self.pack, on_read=on_read,
            note_fields=identity.echo or hasher is not None)
        schema = compile_schema(self.schema)
        check_mode(tasks, identity, self.mode, self.pack, self.validator, self.validator_args)
        checked = CheckedRun(tasks, schema, identity, hasher.hexdigest() if hasher else None,
                             fields)
        check_schema(checked, self.mode)
        return checked


@dataclass(frozen=True)
class CheckedRun:
    """A :class:`RunSpec` whose content passed every check, in the forms the run uses."""

    tasks: Sequence[dict[str, Any]]  # packed: each request's canonical JSON (``.texts``) is
    # what keys, ledger rows and prompts reuse
    schema: ItemSchema
    identity: Identity
    file_digest: str | None = None  # the SHA-256 of a tasks file's bytes, as they were read
    noted_fields: tuple[str, ...] | None = None  # :attr:`fields`, if noted while checking

    @cached_property
    def fields(self) -> tuple[str, ...]:
        """Every field name of the tasks, in the order first seen: noted while they were checked
        where a run reads them (an echoing identity, a tasks file's memo), else one pass."""
        if self.noted_fields is not None:
            return self.noted_fields
        return tuple(dict.fromkeys(key for task in self.tasks for key in task))


def check_text(label: str, value: Any, example: str, *, required: bool = False,
               free: bool = False) -> None:
    """Valid Unicode a ledger stores and a terminal shows: no control character unless ``free``."""
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value.strip()):
        kind = "a non-empty string" if required else "a string"
        raise InvalidBatch(f"{label} must be {kind}, e.g. {example}; got {value!r}")
    if (at := surrogate_at(value)) is not None:
        raise InvalidBatch(f"{label} holds an unpaired surrogate at position {at}, which is not "
                           "valid Unicode and cannot be stored; fix the text")
    if free:
        return
    control = next((i for i, ch in enumerate(value) if unicodedata.category(ch) == "Cc"), None)
    if control is not None:
        raise InvalidBatch(f"{label} {value!r} holds the control character "
                           f"{value[control]!r} at position {control}, which a ledger, a "
                           f"terminal or a file name cannot show as written; use printable "
                           f"characters, e.g. {example}")


@options(ConfigError)
class SessionOptions:
    """A :class:`~batchjson.Session`'s settings, refused (a bad budget ``InvalidBatch``) first."""

    strict: Flag
    budget: Annotated[Budget, PlainValidator(Budget.of)]
    concurrency: Positive
    repairs: Count
    replays: Count
    transport_retries: Count
    timeout: Seconds
    model: SkipValidation[str | None]
    max_rate_wait: Seconds  # the longest a run waits on a rate limit that keeps refusing

    def __post_init__(self) -> None:
        check_name(self.model, "Session model", "pass the key as the provider's api_key=... (or "
                   "set OPENAI_API_KEY / ANTHROPIC_API_KEY) and the model's name as model=")


def check_validator(fn: Any, args: str) -> None:
    """A validator callable as ``validator(item, task)`` (or ``(item, index)``)."""
    if fn is None:
        return
    second = "task" if args == "task" else "index"
    check_verdicts(fn, second)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: nothing to check
        return
    try:
        signature.bind(None, None)
    except TypeError:
        name = _name(fn)
        raise InvalidBatch(
            f"validator {name}{signature} cannot be called as validator(item, {second}); "
            f"give it two parameters, e.g. def {name}(item, {second}): ... (raise ValueError "
            "or return False to reject an item)") from None


def check_verdicts(fn: Any, second: str = "task") -> None:
    """Any validator, however called: callable, returning a verdict, whole under ``python -O``."""
    if not callable(fn):
        hint = " (names go by keyword: @validator(name=...))" if isinstance(fn, str) else ""
        raise InvalidBatch(f"validator must be callable, got {type(fn).__qualname__}{hint}")
    # a generator function (or an object whose __call__ is one) says neither yes nor no:
    # refused rather than paid for and failed as a validator_error
    try:
        called = [fn] + ([] if inspect.isroutine(fn) else [type(fn).__call__])
        kind = next(("an async generator function" if inspect.isasyncgenfunction(c) else
                     "a generator function" for c in called
                     if inspect.isasyncgenfunction(c) or inspect.isgeneratorfunction(c)), None)
        name = _name(fn) if kind else ""
    except Exception:  # an object that raises when read: not a generator anyone can see
        kind = None
    if kind:
        raise InvalidBatch(
            f"validator {name} is {kind} (it uses yield), so calling it returns a generator, "
            "not a verdict; write a plain def (or async def) without yield: "
            f"def {name}(item, {second}): ... raising ValueError or returning False to reject "
            "an item")
    # under -O asserts vanish, so one checking with assert would accept everything: refused when
    # its own source holds one (helpers it calls are not read)
    if not sys.flags.optimize:
        return
    try:
        target = unwrap_callable(fn)
        if not inspect.isroutine(target) and not inspect.isclass(target):
            target = type(target).__call__  # a callable object: what is called
        source = textwrap.dedent(inspect.getsource(target))
    except Exception:  # no source to read (a builtin, exec'd code): nothing to see
        return
    if _has_assert(source):
        raise InvalidBatch(
            f"validator {_name(fn)} checks with assert, and this Python runs with -O "
            f"(sys.flags.optimize={sys.flags.optimize}), which removes every assert: it would "
            "accept every item. Raise ValueError instead (if not ok: raise ValueError('...')), "
            "or run Python without -O")


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _has_assert(source: str) -> bool:
    try:
        return any(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(source)))
    except SyntaxError:  # a lambda's line cut from a larger expression: read its tokens
        try:
            return any(t.type == tokenize.NAME and t.string == "assert" for t in
                       tokenize.generate_tokens(io.StringIO(source).readline))
        except (tokenize.TokenError, SyntaxError):
            return False


def compared_candidates(fields: Callable[[], Iterable[str]], identity: Sequence[str]
                        ) -> list[str]:
    """The identity fields, and under the default identity every echoable task field
    (``fields()``: every field name of the tasks, asked for only then)."""
    names = dict.fromkeys(identity)
    if getattr(identity, "echo", False):  # what compared_fields adds, for all tasks at once
        names.update(dict.fromkeys(fields()))
        for name in ECHO_EXEMPT.difference(identity):
            names.pop(name, None)
    return list(names)


def check_schema(content: CheckedRun, mode: str) -> None:
    """Schemas that no return could ever satisfy, or that conflict with the identity fields."""
    schema, tasks, identity = content.schema, content.tasks, content.identity
    root = schema.json_schema
    _check_refs(root)
    never = _never(root, root, mode == "items", 0)
    if never:
        raise InvalidBatch(f"the schema can never be satisfied: {never}; fix the schema")
    if mode != "items":
        return
    names = compared_candidates(lambda: content.fields, identity)
    if schema.model is not None:
        _check_aliases(schema.model, names)
    declared = schema.declared_fields or set()
    required = root.get("required") if isinstance(root, Mapping) else None
    for name in names:
        if isinstance(required, list) and name in required and name not in declared:
            raise InvalidBatch(
                f"the schema requires {name!r} but does not declare it under properties; an "
                "echoed task field the schema does not declare is removed before validation, "
                f"so no item could pass: declare it (e.g. \"{name}\": {{\"type\": \"string\"}}) "
                "or drop it from required" + _EXPLICIT.format(name=name) * _echoes(identity, name))
    props = root.get("properties") if isinstance(root, Mapping) else None
    if not isinstance(props, Mapping):
        return
    cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    defs = {k: root[k] for k in ("$defs", "definitions") if k in root}
    for name in names:
        if name not in props:
            continue
        sub = props[name]
        probe = cls({**defs, **sub} if isinstance(sub, Mapping) else sub)
        for task in tasks:
            if name in task and not _passes(probe, task[name]):
                raise InvalidBatch(
                    f"the schema declares {name!r} as {_short(sub)}, but task "
                    f"{task['task_id']!r} has {name}={_short(task[name])}, so its echoed value "
                    f"could never pass: type {name!r} like the tasks' values, or drop it from "
                    "the schema" + _EXPLICIT.format(name=name) * _echoes(identity, name))


_EXPLICIT = (", or (if the model should answer {name!r} rather than copy it) pass identity= "
             "without it")


def _echoes(identity: Sequence[str], name: str) -> bool:
    return bool(getattr(identity, "echo", False)) and name not in identity


def _passes(probe: Any, value: Any) -> bool:
    try:
        return bool(probe.is_valid(value))
    except Exception:  # a $ref the probe cannot follow: acceptance will judge it
        return True


def _check_aliases(model: type, names: Sequence[str]) -> None:
    wanted = set(names)
    for field_name, info in model.model_fields.items():  # type: ignore[attr-defined]
        aliases = {a for a in (info.alias, info.validation_alias, info.serialization_alias)
                   if a is not None and a != field_name}
        if not aliases:
            continue
        clash = field_name in wanted or any(isinstance(a, str) and a in wanted for a in aliases)
        if clash:
            shown = ", ".join(sorted(map(str, aliases)))
            raise InvalidBatch(
                f"{model.__qualname__}.{field_name} has alias {shown}: identity fields are "
                "matched by the name the task uses, and an alias makes the model read another "
                f"key; remove the alias from {field_name!r} or keep it out of the identity")


def _check_refs(root: Any) -> None:
    """Every ``$ref`` must resolve inside the schema (a dangling one fails only mid-run)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, Mapping):
            continue
        ref = node.get("$ref")
        if isinstance(ref, str) and _resolve(root, ref) is _MISSING:
            raise InvalidBatch(f"$ref {ref!r} does not resolve within the schema; define it "
                               "under $defs (e.g. \"$ref\": \"#/$defs/Name\") or inline it")
        stack.extend(v for k, v in node.items() if k not in ("enum", "const", "default",
                                                               "examples"))


def _never(node: Any, root: Any, items: bool, depth: int) -> str | None:
    """Why no item (an object, in items mode) could satisfy ``node``, or None if it may."""
    if depth > 32:
        return None
    if node is False:
        return "it is `false`"
    if not isinstance(node, Mapping):
        return None
    if "not" in node and (node["not"] is True or node["not"] == {}):
        return '"not": {} matches nothing'
    if "enum" in node and isinstance(node["enum"], list):
        if not node["enum"]:
            return '"enum": [] allows no value'
        if items and not any(isinstance(v, dict) for v in node["enum"]):
            return "each item is an object carrying task_id, but the enum lists no object"
    if items and "const" in node and not isinstance(node["const"], dict):
        return "each item is an object carrying task_id, but const is not an object"
    kinds = node.get("type")
    if items and kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if isinstance(kinds, list) and "object" not in kinds:
            return (f"each item is an object carrying task_id, but the schema allows only type "
                    f"{'/'.join(map(str, kinds))} (use mode='value' for bare values, or an "
                    "object schema with properties)")
    for member in node.get("allOf") or ():
        reason = _never(member, root, items, depth + 1)
        if reason:
            return reason
    for key in ("anyOf", "oneOf"):
        members = node.get(key)
        if isinstance(members, list) and members:
            reasons = [_never(m, root, items, depth + 1) for m in members]
            if all(reasons):
                return f"no branch of {key} can match ({reasons[0]})"
    ref = node.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        if target is not _MISSING:
            return _never(target, root, items, depth + 1)
    return None


def _short(sub: Any) -> str:
    text = repr(sub)
    return text if len(text) <= 80 else text[:80] + "..."


def check_mode(tasks: Sequence[Mapping[str, Any]], identity: Sequence[str], mode: str,
               pack: int, validator: Callable[..., Any] | None, validator_args: str) -> None:
    """``mode="value"`` is one task a call, no identity required; an index form needs an index."""
    if mode == "value" and pack != 1:
        raise InvalidBatch(f"mode='value' sends one prompt per call and judges one bare value, "
                           f"so pack must be 1, got {pack}; use mode='items' to pack tasks")
    if mode == "value" and tuple(identity) != ("task_id",):
        raise InvalidBatch(f"mode='value' returns a bare value that need echo no fields, so "
                           f"identity={list(identity)!r} could not be required; drop identity= "
                           "(a field an object value echoes is compared anyway) or use "
                           "mode='items'")
    if validator is not None and validator_args != "task":
        missing = next((t for t in tasks if type(t.get("index")) is not int), None)
        if missing is not None:
            raise InvalidBatch(f"task {missing['task_id']!r} has no integer 'index', but "
                               f"validator_args={validator_args!r} calls validator(value, "
                               "task['index']); give every task its index or use "
                               "validator_args='task'")


# The pieces GPT-style tokenizers (cl100k, o200k, Llama 3's) cut text into before any merge, a
# little coarser, never finer: no token spans two, so their count is a lower bound on the tokens.
_PIECES = re.compile(r"(?:[^\r\n\w]|_)?[^\W\d_]+(?:'[^\W\d_]{1,2})?|\d{1,3}"
                     r"| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+")
_ENVELOPE = '{"items":[]}'


def output_tokens_floor(text: str) -> int:
    """The fewest tokens ``text`` can be, one a piece (other tokenizers: an estimate)."""
    return sum(1 for _ in _PIECES.finditer(text))


def answer_floor(texts: Sequence[str], mode: str) -> int:
    """The fewest output tokens a return of the smallest answers ``texts`` takes."""
    return output_tokens_floor(texts[0] if mode == "value"
                               else '{"items":[' + ",".join(texts) + "]}")


def sent_schema(schema: ItemSchema, tasks: Sequence[Any], identity: Sequence[str],
                mode: str) -> Any:
    """The JSON Schema a call of ``tasks`` sends: the answer's own, or the items' envelope."""
    return schema.json_schema if mode == "value" else wire_schema(schema, tasks, identity)


def check_fit(provider: Any, ledger: Ledger, name: str, schema: ItemSchema,
              pending: Sequence[Request], largest: Request | None, identity: Sequence[str],
              mode: str) -> list[str]:
    """The checks over the requests about to be sent (``largest``: the one of the most tasks),
    and the provider's notes on sending them."""
    if not pending or largest is None:
        return []
    answerable(provider, schema, pending, identity, mode)
    # the largest request's wire schema, as a provider that checks it (OpenAI's strict mode)
    # sees it: refused (ProviderSetupError), or a note for the result
    check = getattr(provider, "check_schema", None)
    note = check(sent_schema(schema, largest.tasks, identity, mode), mode) if callable(
        check) else None
    cap = declared_output_cap(provider)
    if cap is not None:
        # the fewest output tokens per item any accepted return of this batch took (None: none)
        measured = ledger.store.fewest_output_tokens_per_item(
            name, 0 if mode == "value" else output_tokens_floor(_ENVELOPE))
        _pack_fits(cap, measured, schema, largest, identity, mode)
    return [note] if note else []


def answerable(provider: Any, schema: ItemSchema, pending: Sequence[Request],
               identity: Sequence[str], mode: str) -> None:
    """A provider answering from the schema answers each task now: one failing refuses the run."""
    check = getattr(provider, "check_answerable", None)
    if not callable(check) or getattr(provider, "answer", None) is not None:
        return
    tasks = list({t["task_id"]: t for r in pending for t in r.tasks}.values())
    failed: list[tuple[str, str]] = []
    for n, task in enumerate(tasks):
        # the first is checked against the JSON Schema there, naming a keyword it fails; the
        # rest only as acceptance judges them (the schema below), which is enough and cheaper
        answer = check(sent_schema(schema, [task], identity, mode), mode, task, identity,
                       verify=n == 0)
        if mode != "value":
            declared = schema.declared_fields
            answer = {k: v for k, v in answer.items()
                      if k not in identity or declared is None or k in declared}
        errors = schema.validate(answer, "answer")[1]
        if errors:
            failed.append((task["task_id"], errors[0]))
    if failed:
        raise ProviderSetupError(_unanswered(schema, failed, len(tasks)))


def _unanswered(schema: ItemSchema, failed: Sequence[tuple[str, str]], total: int) -> str:
    (task_id, error), count = failed[0], f"{len(failed)} of {total} task(s)"
    fix = ("Give the answers yourself: SimulatedModel(answer=lambda task: {...}); nothing "
           "was sent")
    if schema.model is not None:  # the answer met the model's JSON Schema: its code said no
        return (f"the simulated model's answers to {count} fail the checks of "
                f"{schema.model.__name__}'s own code (first: task {task_id!r}, {error}). The "
                "simulated model answers from the JSON Schema and cannot read code such as a "
                "pydantic validator, and it gives a task the same answer on every attempt, so "
                f"no repair could help. {fix}")
    return (f"the simulated model's answers to {count} do not pass the schema (first: task "
            f"{task_id!r}, {error}), though each was made from the JSON Schema the call "
            "sends: a part of this schema its generator cannot honour (a $ref to the root is "
            "one). Simplify that part of the schema, or give the answers yourself: "
            "SimulatedModel(answer=lambda task: {...}); nothing was sent")


def _pack_fits(cap: int, measured: float | None, schema: ItemSchema, largest: Request,
               identity: Sequence[str], mode: str) -> None:
    size = len(largest.tasks)
    texts = smallest_answers(schema, largest.tasks, identity, mode)
    need = answer_floor(texts, mode)
    if mode == "value":
        envelope, each = 0, need
    else:  # an item's opening {" joins the comma and closing brace before it: one piece less
        envelope = output_tokens_floor(_ENVELOPE)
        each = max(1, max(output_tokens_floor(t) - 1 for t in texts))
    fits = (cap - envelope) // each
    why = (f"its smallest schema-valid answer (identity echoes included) is at least {need:,} "
           f"output tokens")
    if measured is not None and size * measured + envelope > cap:
        need = max(need, math.ceil(size * measured + envelope))
        fits = min(fits, math.floor((cap - envelope) / measured))
        why = (f"this batch's accepted returns took at least {measured:.1f} output tokens per "
               f"item, so {size} items need about {need:,}")
    elif need <= cap:
        return
    if fits < 1 or size == 1:
        raise InvalidBatch(
            f"a request of even one task cannot fit the provider's max_tokens={cap:,}: {why}. "
            "Raise max_tokens, or shorten what the schema requires; nothing was sent")
    raise InvalidBatch(
        f"pack {size} cannot fit the provider's max_tokens={cap:,}: {why}, so every attempt "
        f"would be cut off. Use pack {min(fits, size - 1)} or less (pack="
        f"{min(fits, size - 1)}, --pack {min(fits, size - 1)}), or raise max_tokens; nothing "
        "was sent")


def _most_tokens(plan: Plan, system_chars: int, longest: Mapping[int, int],
                 provider: Any) -> int | None:
    """At least the tokens any pending request counts, from the longest text of each number of
    tasks (``longest``); None for a value's prompt, whose context, when not text, is shown as
    Python writes it (a space after each separator, unprintable characters escaped: longer than
    its JSON)."""
    if plan.mode != "items":
        return None
    return max((request_tokens_of(  # a packed prompt holds its request's text as it is
        system_chars + items_prompt_chars(count, plan.identity, plan.instructions, chars),
        call_output_cap(provider, plan.most_answer_chars(count, chars)))
        for count, chars in longest.items()), default=0)


def check_rate_fit(pacer: Pacer, plan: Plan, pending: Sequence[Request], provider: Any,
                   longest: Mapping[int, int]) -> None:
    """Refuse a run whose largest request exceeds a minute's token limit (every try a 429),
    naming the pack that fits: packs are never split to fit, or their keys would change.
    ``longest``: the survey's longest pending text of each number of tasks."""
    limit = pacer.tokens_per_minute
    if not limit or not pending:
        return
    system = system_prompt(plan)
    most = _most_tokens(plan, len(system), longest, provider)
    if most is not None and most <= limit:
        return  # none can count more: no prompt is rendered (a million of them, before a run)
    caps = {r.key: call_output_cap(provider, plan.answer_chars(r.tasks)) for r in pending}
    largest, request = max(((request_tokens(system, first_prompt(plan, r), caps[r.key]), r)
                            for r in pending), key=lambda pair: pair[0])
    if largest <= limit:
        return
    pack = max(len(r.tasks) for r in pending)
    task_chars = max(len(json.dumps(t, ensure_ascii=False, separators=(",", ":"))) + 1
                     for r in pending for t in r.tasks)  # its JSON and a comma
    fixed = largest - len(request.tasks_json) / 4 + 1  # everything but the tasks, and a digit
    fits = pack_that_fits(limit, fixed, task_chars / 4)
    advice = (f"pack {fits} task(s) per request (pack={fits})" if 0 < fits < pack else
              "raise the limit or lower max_tokens: not even one task fits")
    raise InvalidBatch(
        f"a request of {len(request.tasks)} task(s) counts {largest:,} tokens against "
        f"a limit of {limit:,} tokens per minute ({pacer.describe()}; prompt characters / 4 "
        f"plus max_tokens={caps[request.key] or 0}), so the provider would refuse it on every try; "
        f"{advice}. Nothing was spent.")
