"""The core's surface for faces (a notebook extension, an RLM binding, a command line) beyond the
names in ``batchjson``: the faces shipped here use only these two (docs/api.md, "For faces")."""

from ._checks import whole_argument
from ._content.keys import answer_source, source_text
from ._content.schema import compile_schema
from ._content.tasks import parse_identity, render_value_prompt
from ._ledger.records import ledger_path
from ._ledger.sqlite import file_problem
from ._money import cost_value, money, usd
from ._plaintext import Grid, clip, html_table, printable, table
from ._providers.base import estimate_tokens
from ._providers.select import PROVIDER_NAMES, provider_label
from ._secrets import looks_like_key, masked, public_url, shown_value
from ._session.advice import advise
from ._session.batches import (
    cancel_job,
    collect_ended,
    list_jobs,
    pending_jobs,
    status_summary,
)
from ._session.ledger import read_lines
from ._session.plots import advice_chart, batch_chart
from ._session.registry import ValidatorVersion
from ._session.result import tracebacks
from ._session.spec import check_validator
from ._session.structured import (
    check_call,
    check_droste_schema,
    default_batch_name,
    llm_batch_json,
)
from ._sources import Code, Hashed

__all__ = [
    # runs: a validator's checks and version, a schema compiled once, an identity option
    "check_validator", "ValidatorVersion", "compile_schema", "parse_identity",
    "tracebacks",  # a validator_error's own frames, as its receipt keeps them
    # droste's llm_batch_json contract over a session
    "llm_batch_json", "check_call", "check_droste_schema", "default_batch_name",
    "render_value_prompt",
    # the ledger: advice, receipts read, what is wrong with a ledger file
    "advise", "read_lines", "file_problem", "ledger_path",
    # charts (PNG) of the advice and of a batch's spend over time
    "advice_chart", "batch_chart",
    # providers, and what a face may show of them
    "PROVIDER_NAMES", "provider_label", "estimate_tokens", "looks_like_key", "masked",
    "public_url", "shown_value",
    # answer sources: a face's own provider describes its source, the core keys it
    "answer_source", "source_text", "Code", "Hashed",
    # provider batch jobs: those still open, collecting those that ended, cancelling one;
    # what %batch_status shows (ended jobs collected first)
    "list_jobs", "collect_ended", "cancel_job", "status_summary",
    "pending_jobs",  # the unfinished ones with their provider's progress, asked briefly
    # one wording for numbers and dollars
    "whole_argument", "money", "cost_value", "usd",
    # what a terminal may be shown, aligned columns, and one table model for text and HTML (a
    # result shows its answers so too)
    "printable", "table", "Grid", "html_table", "clip",
]
