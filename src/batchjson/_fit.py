"""Refused before spending: what the chosen provider cannot do with this run.

Two checks need the provider, so they run once it is known and before anything is recorded:

- the simulated model must be able to answer the schema: its generator makes one answer and
  checks it, and a keyword it cannot satisfy is named (``ProviderSetupError``);
- a pack must fit the call's output ceiling (the provider's ``max_tokens``). A request whose
  smallest schema-valid answer (identity echoes included) is longer than the ceiling, or longer
  than what this batch's accepted returns measured per item say, would be cut off on every
  attempt, and each repair and replay paid for nothing (``InvalidBatch``, naming the pack size
  that fits).

Output tokens are counted from below (:func:`output_tokens_floor`), so a pack is refused only
when it cannot fit, never because an estimate ran high.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import InvalidBatch, ProviderSetupError
from ._ledger import Ledger
from ._providers.base import declared_output_cap
from ._schema import ItemSchema, wire_schema
from ._schemagen import Generator, Unanswerable
from ._tasks import Request

# The pieces GPT-style tokenizers (cl100k, o200k; Llama 3 uses the same rules) cut text into
# before any merge: a letter run with at most one leading mark (and a contraction), digits in
# groups of at most three, a run of punctuation, whitespace. No token spans two pieces, so their
# count is a lower bound on the tokens of the text (pieces are written a little coarser than
# either tokenizer's, never finer).
_PIECES = re.compile(r"(?:[^\r\n\w]|_)?[^\W\d_]+(?:'[^\W\d_]{1,2})?|\d{1,3}"
                     r"| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+")
_ENVELOPE = '{"items":[]}'


def output_tokens_floor(text: str) -> int:
    """The fewest tokens ``text`` can be: one per piece (see ``_PIECES``). The true count is
    this or more (long words and numbers take several tokens); for a tokenizer that splits
    text by other rules (Anthropic's is not published) it is an estimate, which is why the
    output measured in the ledger is checked too."""
    return sum(1 for _ in _PIECES.finditer(text))


def check_fit(provider: Any, ledger: Ledger, name: str, schema: ItemSchema,
              pending: Sequence[Request], identity: Sequence[str], mode: str) -> None:
    """Both checks, over the requests about to be sent. Nothing to fit when the provider sends
    no output ceiling (``declared_output_cap``)."""
    if not pending:
        return
    answerable(provider, schema, pending[0].tasks[0], identity, mode)
    cap = declared_output_cap(provider)
    if cap is not None:
        measured = measured_per_item(ledger, name, 0 if mode == "value" else
                                     output_tokens_floor(_ENVELOPE))
        _pack_fits(cap, measured, schema, pending, identity, mode)


def measured_per_item(ledger: Ledger, name: str, envelope: int) -> float | None:
    """The fewest output tokens per item any accepted return of batch ``name`` took (its
    envelope taken off), or None when none has been measured."""
    return ledger.store.fewest_output_tokens_per_item(name, envelope)


def answerable(provider: Any, schema: ItemSchema, task: Mapping[str, Any],
               identity: Sequence[str], mode: str) -> None:
    """A provider that makes its answers from the schema (the simulated model) answers one
    task here; that answer must pass the schema as acceptance will judge it (a pydantic
    model's own validators included)."""
    check = getattr(provider, "check_answerable", None)
    if not callable(check) or getattr(provider, "answer", None) is not None:
        return
    wire = schema.json_schema if mode == "value" else wire_schema(schema, [task], identity)
    answer = check(wire, mode, task, identity)
    if mode != "value":
        declared = schema.declared_fields
        answer = {k: v for k, v in answer.items()
                  if k not in identity or declared is None or k in declared}
    errors = schema.validate(answer, "answer")[1]
    if errors:
        raise ProviderSetupError(
            f"the simulated model's answer does not pass the schema's own checks ({errors[0]}): "
            "its generator meets the JSON Schema, not code such as a pydantic validator. Give "
            "the answers yourself: SimulatedModel(answer=lambda task: {...})")


def _pack_fits(cap: int, measured: float | None, schema: ItemSchema,
               pending: Sequence[Request], identity: Sequence[str], mode: str) -> None:
    largest = max(pending, key=lambda r: len(r.tasks))
    size = len(largest.tasks)
    texts = smallest_answers(schema, largest.tasks, identity, mode)
    if mode == "value":
        need, envelope, each = output_tokens_floor(texts[0]), 0, output_tokens_floor(texts[0])
    else:  # an item's opening {" joins the comma and closing brace before it: one piece less
        need = output_tokens_floor('{"items":[' + ",".join(texts) + "]}")
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


def smallest_answers(schema: ItemSchema, tasks: Sequence[Mapping[str, Any]],
                     identity: Sequence[str], mode: str) -> list[str]:
    """The smallest answer each task can get, as compact JSON text: what the schema requires
    at its least (made once: the echoes are the only part that differs by task), with the
    task's identity values. A schema the generator cannot meet counts the echoes alone."""
    fixed = {} if mode == "value" else {k: tasks[0][k] for k in identity}
    try:
        least = Generator(schema.json_schema, minimal=True).value(fixed=fixed or None,
                                                                 verify=False)
    except Unanswerable:
        least = dict(fixed)
    if mode == "value" or not isinstance(least, dict):
        return [_compact(least)] * len(tasks)
    rest = {k: v for k, v in least.items() if k not in fixed}
    return [_compact({**{k: t[k] for k in identity}, **rest}) for t in tasks]


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
