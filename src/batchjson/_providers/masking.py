"""What a provider or model string may show of itself: a pasted key must never be echoed.

A user who pastes an API key as ``provider=`` or ``model=`` must not find it in an error, a repr
or the ledger, so anything unrecognised is shown by its first four characters only.
"""

from __future__ import annotations

import re

from .._errors import ProviderSetupError

# Prefixes of the API keys people paste (OpenAI, Anthropic, Groq, Hugging Face, Google, xAI,
# GitHub, Replicate, session tokens) and bearer headers.
_KEY_PREFIX = re.compile(r"^(sk-|sk_|gsk_|hf_|AIza|xai-|ghp_|gho_|r8_|sess-|pk-|bearer\s)",
                         re.IGNORECASE)
# A long token of letters and digits only (no -, ., /, :) with both kinds: a key, not a name.
_BARE_TOKEN = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9]{24,}$")


def looks_like_key(text: str) -> bool:
    """True for strings shaped like an API key rather than a model or provider name."""
    value = text.strip()
    return bool(_KEY_PREFIX.match(value) or _BARE_TOKEN.match(value) or " " in value
                or len(value) > 200)


def masked(text: str) -> str:
    """The first four characters and the length: enough to recognise, never enough to use."""
    return f"{text[:4]!r}... ({len(text)} chars)"


def check_name(value: str | None, what: str, fix: str) -> str | None:
    """Refuse a key-shaped ``what`` (e.g. ``model``) at construction, before it reaches a repr,
    a request or the ledger; the message shows only its first four characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProviderSetupError(f"{what} must be a string, got {type(value).__name__}")
    if looks_like_key(value):
        raise ProviderSetupError(f"{what} {masked(value)} looks like an API key, not a name; "
                                 f"{fix}")
    return value
