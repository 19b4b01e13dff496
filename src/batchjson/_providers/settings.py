"""An HTTP provider's settings, checked when it is made: one no call could use is refused."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .._checks import is_whole
from .._errors import ProviderSetupError
from .._secrets import masked

# Request fields that make the server bill several answers of which batchjson reads one.
BILL_MULTIPLIERS = ("n", "best_of")
# Request fields that cap a call's output: the ceiling a cost budget reserves.
OUTPUT_CAPS = ("max_completion_tokens", "max_tokens")


# The output ceiling when the user sets none (docs/providers.md, "Output ceiling"): the answer's
# most characters, three a token, plus a margin; a reasoning model reserves 25,000 more (OpenAI).
ANSWER_CHARS_PER_TOKEN = 3
ANSWER_MARGIN_TOKENS = 64
UNBOUNDED_ANSWER_TOKENS = 4096
REASONING_TOKENS = 25_000


def sized_output_cap(answer_chars: int | None, *, reasoning: bool = False) -> int:
    """The output ceiling for an answer of at most ``answer_chars`` characters (None: unbounded)."""
    tokens = UNBOUNDED_ANSWER_TOKENS if answer_chars is None else min(
        UNBOUNDED_ANSWER_TOKENS, -(-answer_chars // ANSWER_CHARS_PER_TOKEN) + ANSWER_MARGIN_TOKENS)
    return tokens + (REASONING_TOKENS if reasoning else 0)


def call_output_cap(provider: Any, answer_chars: int | None) -> int | None:
    """The output ceiling ``provider`` sends with a call: the one it sizes, else it declares."""
    inner = getattr(provider, "inner", provider)
    sized = getattr(inner, "sized_output", None)
    return sized(answer_chars) if callable(sized) else declared_output_cap(inner)


def declared_output_cap(provider: Any) -> int | None:
    """``max_tokens``, or an output cap in ``extra_body``, or None when it sends none."""
    cap = getattr(provider, "max_tokens", None)
    if is_whole(cap, 1):
        return cap
    extra = getattr(provider, "extra_body", None)
    extra = extra if isinstance(extra, Mapping) else {}
    return next((extra[k] for k in OUTPUT_CAPS if is_whole(extra.get(k), 1)), None)


def checked_extra_body(kind: str, extra_body: Any, owned_keys: frozenset[str]) -> dict[str, Any]:
    """``extra_body`` as a dict of request fields, refused now when no call could use it."""
    if extra_body is None:
        return {}
    if not isinstance(extra_body, Mapping) or not all(isinstance(k, str) for k in extra_body):
        raise ProviderSetupError(f"{kind}: extra_body must be a dict of request fields with "
                                 f"string names, e.g. {{'temperature': 0}}; got "
                                 f"{type(extra_body).__name__}")
    body = dict(extra_body)
    owned = sorted(set(body) & owned_keys)
    if owned:
        raise ProviderSetupError(f"{kind}: extra_body may not set {', '.join(map(repr, owned))}; "
                                 "batchjson builds those fields from the call and the "
                                 "provider's own settings (model=, response_format= or mode=)")
    for name in BILL_MULTIPLIERS:
        if name in body and body[name] != 1:
            raise ProviderSetupError(
                f"{kind}: extra_body {name}={body[name]!r} asks for several answers per call, "
                "and the server bills every one while batchjson reads only the first; drop "
                f"{name!r} (repairs and replays already ask again when an answer fails)")
    for name in OUTPUT_CAPS:
        if name in body and not is_whole(body[name], 1):
            raise ProviderSetupError(
                f"{kind}: extra_body {name!r} must be a whole number of tokens >= 1 (the most "
                f"output one call may bill), got {body[name]!r}; e.g. extra_body={{{name!r}: "
                "1024}")
    return body


def checked_key(kind: str, api_key: Any, env: str) -> str | None:
    """The API key from ``api_key=`` or the environment, refused now if no header could carry it."""
    key = api_key if api_key is not None else os.environ.get(env)
    where = "api_key=" if api_key is not None else f"the {env} environment variable"
    if key is None or key == "":
        return key
    if not isinstance(key, str):
        raise ProviderSetupError(f"{kind}: {where} must be a string, got {type(key).__name__}")
    if key.strip() != key:
        raise ProviderSetupError(
            f"{kind}: the API key from {where} ({masked(key.strip())}) has whitespace around "
            "it (a key read from a file keeps its newline), which no HTTP header can carry; "
            "strip it, e.g. api_key=Path('key.txt').read_text().strip()")
    if not key.isascii() or not key.isprintable() or " " in key:
        raise ProviderSetupError(
            f"{kind}: the API key from {where} ({masked(key)}) holds spaces, control or "
            "non-ASCII characters, which no API key has and no HTTP header can carry; copy the "
            "key again from the provider's console")
    return key
