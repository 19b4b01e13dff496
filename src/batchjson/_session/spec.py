"""The one public description of a run, and the one place that checks a run's inputs.

Every face builds a ``RunSpec``, so every face refuses the same inputs in the same words, before the
ledger or the provider is touched: a refusal never costs a call or records anything."""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import PlainValidator, SkipValidation

from .._checks import Count, CountOrNone, Flag, Positive, Seconds, options
from .._content.schema import ItemSchema, compile_schema
from .._content.spool import is_task_file
from .._content.tasks import Identity, normalize_identity, normalize_tasks
from .._errors import ConfigError, InvalidBatch
from .._replay.budget import Budget
from .._secrets import check_name
from . import preflight

Mode = Literal["items", "value"]
ValidatorArgs = Literal["task", "index", "droste"]
OnExhausted = Literal["raise", "return"]
TransportName = Literal["live", "batch"]


@options(InvalidBatch)
class RunSpec:
    """What to resolve and under which rules (docs/api.md). A bad option is an
    :class:`~batchjson.InvalidBatch` when the spec is made.

    - ``mode="items"``: ``pack`` tasks a call, each return ``{"items": [...]}`` judged for coverage
      and identity; ``mode="value"``: one task per call, a bare JSON value (droste's shape).
    - ``validator_args="task"`` calls ``validator(value, task)``, ``"index"`` calls
      ``validator(value, task["index"])``; ``"droste"`` also reads verdicts as droste does.
    - ``refuse_short_budget``: refuse before spending when the budget cannot cover one call per
      pending request. ``None`` for ``repairs``/``replays`` takes the session's setting.
    - ``transport="batch"``: provider batch jobs; the run returns ``status == "pending"`` unless
      ``wait=True``, and a re-run collects (docs/providers.md)."""

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
    # or a face's bar: progress(total, name)
    progress: SkipValidation[bool | Callable[[int, str], Any]] = False
    mode: Mode = "items"
    validator_args: ValidatorArgs = "task"
    refuse_short_budget: Flag = True
    transport: TransportName = "live"
    wait: Flag = False

    def __post_init__(self) -> None:
        """What its types cannot say, each checked alone: cheap, and before any face does
        anything with them."""
        check_text("batch name", self.name, "run_batch('labels', ...)", required=True)
        check_text("instructions", self.instructions, "instructions='Answer in English.'",
                   free=True)
        if not isinstance(self.progress, bool) and not callable(self.progress):
            raise InvalidBatch(f"progress must be True, False or a callable progress(total, "
                               f"name) returning a bar, got {self.progress!r}")
        if self.transport == "batch" and self.validator_args != "task":
            raise InvalidBatch(
                "transport='batch' is refused for droste's llm_batch_json contract (the droste "
                "and rlm bindings): it returns values now and has no pending result; use "
                "transport='live' there, or run_batch / %%batch_json for batch jobs")
        if self.validator_name is not None:
            check_text("validator_name", self.validator_name, "validator_name='label_check'")
        preflight.check_validator(self.validator, self.validator_args)
        if isinstance(self.identity, Iterator):  # read once here, so kept as read
            object.__setattr__(self, "identity", tuple(self.identity))
        normalize_identity(self.identity)  # its shape; the tasks are checked against it later

    def checked(self) -> CheckedRun:
        """The run's content, checked and in the ledger's (JSON) form: tasks, schema, and what the
        mode, identity and validator need of them. Raises InvalidBatch naming the first problem and
        the fix; reads nothing but the spec."""
        identity = normalize_identity(self.identity)
        hasher = hashlib.sha256() if is_task_file(self.tasks) else None
        tasks, texts = normalize_tasks(self.tasks, identity, hasher, pack=self.pack)
        schema = compile_schema(self.schema)
        preflight.check_all(tasks=tasks, identity=identity, schema=schema, mode=self.mode,
                            validator=self.validator, validator_args=self.validator_args,
                            pack=self.pack)
        return CheckedRun(self, tasks, texts, schema, identity,
                          hasher.hexdigest() if hasher else None)


@dataclass(frozen=True)
class CheckedRun:
    """A :class:`RunSpec` whose content passed every check, in the forms the run uses."""

    spec: RunSpec
    tasks: list[dict[str, Any]]
    texts: list[str]  # each request's tasks as canonical JSON (pack at a time), which keys,
    # ledger rows and prompts reuse
    schema: ItemSchema
    identity: Identity
    file_digest: str | None = None  # the SHA-256 of a tasks file's bytes, as they were read


def check_text(label: str, value: Any, example: str, *, required: bool = False,
               free: bool = False) -> None:
    """A name or text a ledger stores and a terminal shows: a str of valid Unicode, and, unless
    it is ``free`` text for the model (where newlines belong), with no control characters
    (``'\\x00'`` would be cut short or act on the terminal)."""
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value.strip()):
        kind = "a non-empty string" if required else "a string"
        raise InvalidBatch(f"{label} must be {kind}, e.g. {example}; got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidBatch(f"{label} holds an unpaired surrogate at position {exc.start}, which "
                           "is not valid Unicode and cannot be stored; fix the text") from None
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
    """A :class:`~batchjson.Session`'s own settings, refused (``ConfigError``; a bad budget
    ``InvalidBatch``) before anything is created, spent or recorded."""

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
