"""The one masking rule: what batchjson may show of a secret. Known secret values (an API key, a
URL's userinfo or credential parameter) are replaced wherever batchjson writes or says them
(:class:`Secrets`), never in the model's answer text; shape rules (docs/providers.md) recognise a
pasted key only as a whole value naming a provider or a model (task data and digests may look
the same), and key fragments anywhere in a provider's error text."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode, urlsplit, urlunsplit

from ._errors import ProviderSetupError

REDACTED = "<redacted>"
MIN_MASKED = 4  # shorter secret values are masked only inside the URL that carries them

# The whole value of a pasted key: a vendor's prefix (OpenAI, Anthropic, Groq, Hugging Face,
# Google, xAI, GitHub, Replicate, Perplexity, NVIDIA, GitLab...), perhaps as a bearer header, then
# 16 or more key characters; 32 or more hex digits (Azure, gateways); a UUID. Nothing else.
_PREFIX = r"(?:sk-|sk_|gsk_|hf_|AIza|xai-|ghp_|gho_|r8_|sess-|pk-|pplx-|nvapi-|glpat-)"
_VENDOR_KEY = _PREFIX + r"[\w-]{16,}"
_KEY_SHAPE = re.compile(
    rf"^(?:bearer\s+)?(?:{_VENDOR_KEY}"
    r"|[0-9a-f]{32,}|[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})$", re.IGNORECASE | re.ASCII)
_MASK_MARK = r"(?:[*\u2022\u2026]|\.{3})"  # what a provider's echo hides a key's middle with
_FRAGMENT = (rf"(?<![\w-]){_PREFIX}"
             rf"(?:[\w-]*{_MASK_MARK}+(?:[\w-]|{_MASK_MARK})*|[\w-]{{16,}})")
_KEY_FRAGMENT = re.compile(_FRAGMENT, re.ASCII)
# In a provider's error text only: a key glued to a word (``api_key_sk-proj-...``, a digit among
# its 16+ characters, so ``risk-assessment-framework`` stays) and bare 32+ hex digits (Azure's).
_PROVIDER_FRAGMENT = re.compile(rf"{_FRAGMENT}|(?<=[\w-]){_PREFIX}(?=[\w-]*\d)[\w-]{{16,}}"
                                r"|(?<![\w-])[0-9a-fA-F]{32,}(?![\w-])", re.ASCII)


def looks_like_key(text: str) -> bool:
    """True for a whole value shaped like an API key rather than a model or provider name."""
    return bool(_KEY_SHAPE.match(text.strip()))


def masked(text: str) -> str:
    """The first four characters and the length: enough to recognise, never enough to use."""
    return f"{text[:4]!r}... ({len(text)} chars)"


def key_digest(value: str | None) -> str:
    """Who holds a key, without the key (16 hex digits of a SHA-256 over it; "" for none): what
    a ledger keeps to tell accounts apart."""
    if not value:
        return ""
    return hashlib.sha256(b"batchjson account\0" + value.encode("utf-8", "surrogatepass")
                          ).hexdigest()[:16]


def keys_masked(text: str) -> str:
    """``text`` with each vendor-prefixed key masked, whole or echoed (``sk-VKMIs***...wjh3``)."""
    return _KEY_FRAGMENT.sub(REDACTED, text)


def provider_text_masked(text: str) -> str:
    """A provider's own (error) text as batchjson may show it: :func:`keys_masked`, and keys
    glued to a word or written as bare hex. Never the model's answer text."""
    return _PROVIDER_FRAGMENT.sub(REDACTED, text)


def shown_value(text: str) -> str:
    """A name the user typed, for a message: as written (typos show), masked if key-shaped."""
    return masked(text) if looks_like_key(text) else repr(text)


_MASKED = re.compile(r"^(['\"]).{0,4}\1\.\.\. \(\d+ chars\)$|^<redacted>$")


def shown_name(value: Any) -> Any:
    """A provider or model name as batchjson may show it: masked if the whole value is shaped
    like a key (a server echoing a key as its ``model``); masking twice changes nothing."""
    if isinstance(value, str) and looks_like_key(value) and not _MASKED.match(value):
        return masked(value)
    return value


def check_name(value: str | None, what: str, fix: str) -> str | None:
    """Refuse a key-shaped ``what`` (``model``) before a repr, a request or the ledger has it."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProviderSetupError(f"{what} must be a string, got {type(value).__name__}")
    if looks_like_key(value):
        raise ProviderSetupError(f"{what} {masked(value)} looks like an API key, not a name; "
                                 f"{fix}")
    return value


# -- known secret values: query parameters that carry credentials (Azure's api-key and SAS sig,
# Google's key, OAuth's access_token...), matched by name, case and -/_ aside -------------------
_CREDENTIAL_WORDS = ("key", "token", "secret", "passw", "pwd", "credential", "signature", "auth")
_CREDENTIAL_NAMES = frozenset({"sig", "code", "session", "sessionid", "jwt", "bearer"})


def is_credential_param(name: str) -> bool:
    lowered = name.strip().lower().replace("-", "_")
    return lowered in _CREDENTIAL_NAMES or any(w in lowered for w in _CREDENTIAL_WORDS)


def url_secrets(url: str, *, user: bool = True) -> tuple[list[str], list[str]]:
    """The secret values a URL carries, as written and decoded: its userinfo (the password
    only, with ``user=False``) and its credential query parameters' values; and its userinfo as a
    server echoing ``Authorization`` shows it: base64 of ``user:password`` (Latin-1 as aiohttp
    sends it, and UTF-8), padded and not, as written and decoded."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [], []
    found, basic = [], []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at:
        name, _, password = userinfo.partition(":")
        found += [name, password] if user else [password]
        for pair in dict.fromkeys((f"{name}:{password}", f"{unquote(name)}:{unquote(password)}")):
            for encoding in ("latin-1", "utf-8"):
                try:
                    encoded = base64.b64encode(pair.encode(encoding)).decode("ascii")
                except UnicodeEncodeError:
                    continue
                basic += [encoded, encoded.rstrip("=")]
    found += [value for name, value in parse_qsl(parts.query, keep_blank_values=True)
              if is_credential_param(name)]
    found += [raw.partition("=")[2] for raw in parts.query.split("&")
              if is_credential_param(unquote(raw.partition("=")[0]))]
    return [v for v in dict.fromkeys(found + [unquote(v) for v in found]) if v], basic


def public_query(query: str) -> str:
    """A URL query without its credential parameters (what may decide answers, and be shown)."""
    return urlencode([(name, value) for name, value in parse_qsl(query, keep_blank_values=True)
                      if not is_credential_param(name)])


def public_url(url: str, *, user: bool = True) -> str:
    """A URL as it may be shown: its userinfo and credential parameters replaced; with
    ``user=False`` (a database URL) only the password, so a suggested command still works."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not even a URL's parts can be told apart: show nothing of it
        return masked(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    name, colon, password = userinfo.partition(":")
    shown = REDACTED if user else name + (f":{REDACTED}" if password else colon)
    netloc = f"{shown}@{host}" if at else parts.netloc
    query = "&".join(raw if not is_credential_param(unquote(raw.partition("=")[0]))
                     else f"{raw.partition('=')[0]}={REDACTED}" for raw in parts.query.split("&")
                     ) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class Secrets:
    """The secret values one configuration holds; :meth:`mask` replaces each as written, encoded
    or echoed, after each of ``urls`` by its :func:`public_url` (the only place a value shorter
    than :data:`MIN_MASKED` is masked)."""

    __slots__ = ("_urls", "_values", "_echo")

    def __init__(self, values: Iterable[str | None] = (), urls: Iterable[str] = (), *,
                 url_users: bool = True) -> None:
        urls = [u for u in urls if u]
        carried = [url_secrets(u, user=url_users) for u in urls]
        forms: set[str] = set()
        for value in [*values, *(v for found, _ in carried for v in found)]:
            if value and len(value) >= MIN_MASKED:
                forms.update((value, quote(value, safe=""), quote_plus(value)))
        tails = {v[-4:] for v in forms if len(v) >= 12}
        forms.update(f for _, basic in carried for f in basic if len(f) >= MIN_MASKED)
        shown = {u: public_url(u, user=url_users) for u in sorted(set(urls), key=len, reverse=True)}
        self._urls = {u: public for u, public in shown.items() if public != u}
        self._values = sorted(forms, key=len, reverse=True)  # a longer form is replaced first
        self._echo = (re.compile(r"[\w-]*[*\u2022]{3,}[\w-]*?(?:"
                                 + "|".join(map(re.escape, sorted(tails))) + ")")
                      if tails else None)

    def mask(self, text: str) -> str:
        for url, public in self._urls.items():
            text = text.replace(url, public)
        for value in self._values:
            text = text.replace(value, REDACTED)
        return self._echo.sub(REDACTED, text) if self._echo is not None else text

    def __bool__(self) -> bool:
        return bool(self._values or self._urls)

    def __repr__(self) -> str:
        return f"Secrets(<{len(self._values)} forms>)"


class Secret:
    """Holds an API key so that no repr, log line or traceback can print it."""

    __slots__ = ("_value",)

    def __init__(self, value: str | None) -> None:
        self._value = value or None

    def get(self) -> str | None:
        return self._value

    def __bool__(self) -> bool:
        return self._value is not None

    def __repr__(self) -> str:
        return "Secret(<set>)" if self._value else "Secret(<unset>)"

    __str__ = __repr__
