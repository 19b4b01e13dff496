"""Refused before spending, once the provider is known: a schema the simulated model cannot
answer, a pack whose smallest valid answer cannot fit the output ceiling (counted from below, so
a pack is refused only when it cannot fit), a wire schema strict mode cannot take (or a note)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from .._content.answersize import smallest_answers
from .._content.schema import ItemSchema, wire_schema
from .._content.tasks import Request
from .._errors import InvalidBatch, ProviderSetupError
from .._ledger import Ledger
from .._providers.ratelimits import request_tokens
from .._providers.settings import call_output_cap, declared_output_cap
from .._replay.pacing import Pacer, pack_that_fits
from .._replay.plan import Plan, first_prompt, system_prompt

# The pieces GPT-style tokenizers (cl100k, o200k; Llama 3 uses the same rules) cut text into
# before any merge: a letter run with at most one leading mark (and a contraction), digits in
# groups of at most three, a run of punctuation, whitespace. No token spans two pieces, so their
# count is a lower bound on the tokens of the text (pieces are written a little coarser than
# either tokenizer's, never finer).
_PIECES = re.compile(r"(?:[^\r\n\w]|_)?[^\W\d_]+(?:'[^\W\d_]{1,2})?|\d{1,3}"
                     r"| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+")
_ENVELOPE = '{"items":[]}'


def output_tokens_floor(text: str) -> int:
    """The fewest tokens ``text`` can be: one per piece (see ``_PIECES``); for a tokenizer with
    other rules (Anthropic's is not published) an estimate, so the ledger's measure counts too."""
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
              pending: Sequence[Request], identity: Sequence[str], mode: str) -> list[str]:
    """The checks over the requests about to be sent, and the provider's notes on how it will
    send them (an OpenAI provider falling back from strict mode says so)."""
    if not pending:
        return []
    answerable(provider, schema, pending, identity, mode)
    note = schema_note(provider, schema, pending, identity, mode)
    cap = declared_output_cap(provider)
    if cap is not None:
        # the fewest output tokens per item any accepted return of this batch took (None: none)
        measured = ledger.store.fewest_output_tokens_per_item(
            name, 0 if mode == "value" else output_tokens_floor(_ENVELOPE))
        _pack_fits(cap, measured, schema, pending, identity, mode)
    return [note] if note else []


def schema_note(provider: Any, schema: ItemSchema, pending: Sequence[Request],
                identity: Sequence[str], mode: str) -> str | None:
    """The largest pending request's wire schema, as a provider that checks it (OpenAI's strict
    mode) sees it: refused (ProviderSetupError), or a note for the result."""
    check = getattr(provider, "check_schema", None)
    if not callable(check):
        return None
    largest = max(pending, key=lambda r: len(r.tasks))
    return check(sent_schema(schema, largest.tasks, identity, mode), mode)


def answerable(provider: Any, schema: ItemSchema, pending: Sequence[Request],
               identity: Sequence[str], mode: str) -> None:
    """A provider that answers from the schema (the simulated model, the same answer on every
    attempt) answers every pending task here; each must pass the schema as acceptance judges it
    (a pydantic model's validators too), or the run is refused."""
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


def _pack_fits(cap: int, measured: float | None, schema: ItemSchema,
               pending: Sequence[Request], identity: Sequence[str], mode: str) -> None:
    largest = max(pending, key=lambda r: len(r.tasks))
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


def check_rate_fit(pacer: Pacer, plan: Plan, pending: Sequence[Request], provider: Any) -> None:
    """Refuse a run whose largest request is more tokens than the limiter lets through in a
    minute (every try would be a 429), naming the pack that fits: packs are never split to fit
    the day's limits, or their keys would change from run to run."""
    limit = pacer.tokens_per_minute
    if not limit or not pending:
        return
    system = system_prompt(plan)
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
