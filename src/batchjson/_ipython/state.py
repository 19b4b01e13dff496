"""What one kernel keeps across ``%reset`` and ``%reload_ext``: its session and injected names, held
on the shell object, so the ledger connection and the validator registry (and every canonical
validator object) outlive both."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import Session, default_session, set_default_session
from ..core import provider_label

ATTRIBUTE = "_batchjson_state"
INJECTED = ("run_batch", "llm_batch_json", "validator", "batch_session")
REOPEN = ("ledger", "strict")
MEMORY = ":memory:"


def notebook_names(session: Session) -> dict[str, Any]:
    """The names a notebook gets (``INJECTED``), the session itself among them: a person is handed
    the session; an RLM host's cells get ``batchjson.rlm``'s tools instead, which carry none."""
    return {"run_batch": session.run_batch, "llm_batch_json": session.llm_batch_json,
            "validator": session.validators.define, "batch_session": session}


def resolve_ledger(setting: str) -> Path | None:
    """``:memory:`` (or empty) keeps the ledger in memory; a relative path is under the cwd."""
    if not setting or setting == MEMORY:
        return None
    if "://" in setting:  # a URL: a postgresql:// database, or refused naming it (masked)
        return setting  # type: ignore[return-value]
    path = Path(setting).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


class KernelState:
    """The kernel's one session, the settings it was opened with, and the names given out."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.session: Session | None = None
        self.settings: dict[str, Any] = {}
        self.names: dict[str, Any] = {}
        self.previous_default: Session | None = None
        self.magics: Any = None

    @classmethod
    def of(cls, shell: Any, *, create: bool = True) -> KernelState | None:
        state = getattr(shell, ATTRIBUTE, None)
        if state is None and create:
            state = cls(shell)
            setattr(shell, ATTRIBUTE, state)
        return state

    # -- session lifecycle ---------------------------------------------------------------------
    def attach(self, settings: dict[str, Any]) -> Session:
        """Open the session on first load; on a later load apply what changed meanwhile."""
        if self.session is None:
            self.previous_default = default_session(create=False)
            self.open(settings)
        else:
            for name, value in settings.items():
                if not same(self.settings.get(name, _MISSING), value):
                    self.apply(name, value, settings)
        assert self.session is not None
        set_default_session(self.session)
        self.inject()
        return self.session

    def open(self, settings: dict[str, Any]) -> None:
        """A new session on the configured ledger; the names handed out follow it."""
        old = self.session
        self.session = Session(ledger=resolve_ledger(settings["ledger"]), **{
            k: v for k, v in settings.items() if k not in ("ledger", "max_calls")})
        self.settings = dict(settings)
        previous_names, self.names = self.names, notebook_names(self.session)
        self.inject(replace=previous_names)
        if old is not None:
            if default_session(create=False) is old:
                set_default_session(self.session)
            old.close()

    def apply(self, name: str, value: Any, settings: dict[str, Any]) -> None:
        """Carry one changed setting to the live session (a new session for ledger/strict)."""
        if self.session is None:
            return
        if name in REOPEN:
            self.open(settings)
            return
        self.settings[name] = value
        if name == "max_rate_wait":  # read by each run as it starts
            self.session.transport.max_rate_wait = value
        elif name != "max_calls":  # max_calls is read by each %%batch_json run
            setattr(self.session, name, value)
            if name == "model":  # the provider is rebuilt with the new model
                self.session.provider = self.settings["provider"]

    # -- names in the user namespace -----------------------------------------------------------
    def inject(self, replace: dict[str, Any] | None = None) -> None:
        """Add missing names; with ``replace``, also swap names still bound to those objects."""
        ns = self.shell.user_ns
        for key, obj in self.names.items():
            current = ns.get(key, _MISSING)
            if current is _MISSING or (replace and current is replace.get(key)):
                ns[key] = obj

    def pre_run_cell(self, info: Any = None) -> None:
        """Re-add names a ``%reset`` (or ``del``) removed; never overwrite the user's own."""
        self.inject()

    def detach(self) -> None:
        """Take back the names still bound to what was given out, and the default session."""
        ns = self.shell.user_ns
        for key, obj in self.names.items():
            if ns.get(key, _MISSING) is obj:
                del ns[key]
        if default_session(create=False) is self.session:
            set_default_session(self.previous_default)

    def ledger_label(self) -> str:
        assert self.session is not None
        path = self.session.ledger.path
        if path is None:  # in memory, or a database (its password masked)
            return self.session.ledger.where
        return str(self.settings.get("ledger") or path)  # as configured: no machine-local prefix

    def provider_label(self) -> str:
        """A name for the provider; never its configuration (API keys stay in the environment)."""
        spec = self.settings.get("provider")
        if spec is None:
            env = os.environ.get("BATCHJSON_PROVIDER", "").strip()
            return f"{env} (from BATCHJSON_PROVIDER)" if env else "not configured"
        return provider_label(spec)


_MISSING = object()


def same(a: Any, b: Any) -> bool:
    """Identity for objects, equality for plain values (never calls a provider's __eq__)."""
    plain = (str, int, float, bool, type(None))
    return a is b or (type(a) is type(b) and isinstance(a, plain) and a == b)
