"""What an OpenAI chat model accepts in a request: the reasoning models refuse parts every other
chat model takes, with a 400 on every call. From OpenAI's documentation and the recorded 400s in
tests/fixtures/recorded/; unlisted models accept everything (docs/providers.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .._errors import ProviderSetupError

SYSTEM_ROLES = ("system", "developer", "user")
# Sampling settings the reasoning models refuse (OpenAI: "not supported with reasoning models").
SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "logprobs",
            "top_logprobs", "logit_bias")


@dataclass(frozen=True)
class Capabilities:
    """How a request to one model must be shaped: ``system_role`` (``"user"``: a user message before
    the prompt), whether it takes a ``response_format``, whether the output ceiling travels as
    ``max_completion_tokens``, and whether ``temperature`` and the other ``SAMPLING`` settings are
    accepted."""

    system_role: str = "system"
    response_format: bool = True
    max_completion_tokens: bool = False
    temperature: bool = True


CHAT = Capabilities()
REASONING = Capabilities("developer", True, True, False)
EARLY_REASONING = Capabilities("user", False, True, False)  # o1-mini, o1-preview

# (pattern matched at the start of the model's name, capabilities); the first match wins.
KNOWN: tuple[tuple[re.Pattern[str], Capabilities], ...] = (
    (re.compile(r"o1-(mini|preview)(-|$)"), EARLY_REASONING),
    (re.compile(r"gpt-5(\.\d+)?-chat(-|$)"), replace(CHAT, max_completion_tokens=True)),
    (re.compile(r"o\d+(-|$)"), REASONING),  # o1, o3, o3-mini, o4-mini, their snapshots
    (re.compile(r"gpt-5(\.\d+)?(-|$)"), REASONING),  # gpt-5, -mini, -nano, gpt-5.1, ...
)


def capabilities_for(model: str, override: Any = None) -> Capabilities:
    """The table's capabilities for ``model`` (a vendor prefix or ``ft:`` looked through), with
    ``override`` (field names, or a :class:`Capabilities`) laid over; a bad override is refused."""
    name = model.rsplit("/", 1)[-1].removeprefix("ft:").lower()
    found = next((caps for pattern, caps in KNOWN if pattern.match(name)), CHAT)
    if override is None:
        return found
    if isinstance(override, Capabilities):
        override = {f.name: getattr(override, f.name) for f in fields(Capabilities)}
    if not isinstance(override, Mapping):
        raise ProviderSetupError(f"OpenAIProvider: capabilities must be a dict such as "
                                 f"{{'system_role': 'developer'}}, got {type(override).__name__}")
    known = [f.name for f in fields(Capabilities)]
    unknown = sorted(str(k) for k in override if k not in known)
    if unknown:
        raise ProviderSetupError(f"OpenAIProvider: capabilities has no {', '.join(unknown)}; "
                                 f"its fields are {', '.join(known)}")
    role = override.get("system_role", found.system_role)
    if role not in SYSTEM_ROLES:
        raise ProviderSetupError(f"OpenAIProvider: capabilities system_role must be one of "
                                 f"{', '.join(SYSTEM_ROLES)}, got {role!r}")
    for key in known[1:]:
        if key in override and not isinstance(override[key], bool):
            raise ProviderSetupError(f"OpenAIProvider: capabilities {key} must be True or "
                                     f"False, got {override[key]!r}")
    return replace(found, **dict(override))


def shaped_extra_body(model: str, caps: Capabilities, extra: dict[str, Any]) -> dict[str, Any]:
    """``extra_body`` as this model takes it: ``max_tokens`` renamed where needed; a sampling
    setting the model refuses is refused now rather than answered with a 400 on every call."""
    if not caps.temperature:
        refused = [k for k in SAMPLING if k in extra]
        if refused:
            raise ProviderSetupError(
                f"OpenAIProvider: {model} refuses {', '.join(map(repr, refused))} (a reasoning "
                f"model samples at its own settings); drop {'it' if len(refused) == 1 else 'them'}"
                " from extra_body, or pass capabilities={'temperature': True} if this "
                "deployment accepts them")
    if caps.max_completion_tokens and "max_tokens" in extra:
        if "max_completion_tokens" in extra:
            raise ProviderSetupError(
                f"OpenAIProvider: extra_body sets both max_tokens and max_completion_tokens, "
                f"and {model} takes only max_completion_tokens (reasoning tokens included); "
                "keep one")
        extra = {("max_completion_tokens" if k == "max_tokens" else k): v
                 for k, v in extra.items()}
    return extra
