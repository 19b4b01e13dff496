"""An HTTP error response as a ProviderError: the provider's own words, the server's retry advice,
and the errors no request of a run can get past: an account that cannot pay, or ``x-should-retry:
false``. Those stop the whole run (``fatal=True``), never retried; they are recognised by the
providers' own words (docs/providers.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from .._errors import ProviderError
from .._secrets import Secrets, provider_text_masked
from .ratelimits import retry_after, retry_wait

QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_error",
                         "enforced_spend_limit_reached"})
QUOTA_WORDS = ("credit balance", "exceeded your current quota")
WAITABLE = (408, 409, 425, 429)  # statuses that can pass by waiting (and 5xx)
BILLING_PAGES = {"openai": "https://platform.openai.com/settings/organization/billing",
                 "anthropic": "https://console.anthropic.com/settings/billing"}


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """The server's own retry advice (``x-should-retry``), or None when it gives none."""
    value = (headers.get("x-should-retry") or "").strip().lower()
    return {"true": True, "false": False}.get(value)


def run_stop(provider: str, status: int, code: str | None, message: str,
             headers: Mapping[str, str]) -> str | None:
    """Why no request of this run can succeed, with the fix, or None for an error of one
    request."""
    page = BILLING_PAGES.get(provider, "the provider's console")
    if (code in QUOTA_CODES or status == 402
            or any(words in message.lower() for words in QUOTA_WORDS)):
        return (f"the account cannot pay for requests (out of credit, or over its spending "
                f"limit): check its plan and billing at {page}. The run stopped: no further "
                "request was sent and none is retried, since waiting cannot help. Re-run once "
                "billing is fixed; what was accepted is kept")
    if status in WAITABLE and should_retry(headers) is False:
        return (f"the server says not to retry (x-should-retry: false), so this limit will not "
                f"pass by waiting: check the account's limits, plan and billing at {page}. The "
                "run stopped: no further request was sent and none is retried")
    return None


def is_retryable_status(status: int) -> bool:
    """Timeouts, conflicts, rate limits and server trouble can pass; request errors cannot."""
    return status in WAITABLE or status >= 500


def error_message(raw: bytes) -> tuple[str, str | None]:
    """The provider's own message and error code/type from an error body, if it has them,
    key fragments masked before any of it is cut short."""
    message, code, cut = _error_words(raw)
    return provider_text_masked(message)[:cut], (provider_text_masked(code) if code else None)


def _error_words(raw: bytes) -> tuple[str, str | None, int]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return raw[:65536].decode("utf-8", "replace").strip() or "<empty body>", None, 300
    if isinstance(data, Mapping):
        err = data.get("error", data)
        if isinstance(err, Mapping):
            msg = err.get("message") or err.get("detail") or data.get("message")
            details = err.get("details")  # Anthropic names a spend limit in details
            code = ((details.get("error_code") if isinstance(details, Mapping) else None)
                    or err.get("code") or err.get("type"))
            if msg:
                return str(msg), (str(code) if code else None), 500
        elif isinstance(err, str):
            return err, None, 500
        if data.get("detail"):
            return str(data["detail"]), None, 500
    return json.dumps(data, ensure_ascii=False), None, 300


_STATUS_HINTS = {
    401: "the API key was rejected; check {key_env}",
    403: "the key may not use this model or endpoint",
    404: "check the model name and the base URL",
    413: "the request is too large; pack fewer tasks per call",
}


def http_error(provider: str, status: int, headers: Mapping[str, str], raw: bytes,
               secrets: Secrets | None, key_env: str) -> ProviderError:
    """Map an HTTP error response to a ProviderError, keeping the provider's own words."""
    message, code = error_message(raw)
    advice = should_retry(headers)  # the server's word wins, as in the official SDKs
    retryable = is_retryable_status(status) if advice is None else advice
    stop = run_stop(provider, status, code, message, headers)  # out of credit: stop the run
    hint = _STATUS_HINTS.get(status, "")
    text = f"{provider} HTTP {status}: {message}"
    if code:
        text += f" [{code}]"
    if stop or hint:
        text += f" ({stop or hint.format(key_env=key_env)})"
    return ProviderError(secrets.mask(text) if secrets else text, status=status,
                         retryable=retryable and not stop, fatal=stop is not None,
                         retry_after=retry_wait(headers) if status == 429 else
                         retry_after(headers))
