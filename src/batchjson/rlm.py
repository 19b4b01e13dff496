"""The RLM face: droste's ``llm_batch_json`` contract backed by content-keyed evidence.

A cell that defines its validator inline and is re-executed after an error hands batchjson a new
function object each time; the validator's *content* fingerprint and the request's content key
make the re-execution resume the same request instead of orphaning it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .structured import llm_batch_json

if TYPE_CHECKING:
    from .session import Session


def bind(session: Session) -> Callable[..., dict[str, Any]]:
    """The ``llm_batch_json`` an RLM host injects into its REPL namespace."""
    def bound(prompts: Sequence[str], schema: Any, contexts: Sequence[str] | None = None,
              max_repair_attempts: int = 1, validator: Callable[[Any, int], Any] | None = None,
              *, name: str | None = None) -> dict[str, Any]:
        return llm_batch_json(session, prompts, schema, contexts, max_repair_attempts,
                              validator, name=name)

    bound.__name__ = "llm_batch_json"
    bound.__doc__ = llm_batch_json.__doc__
    return bound


def namespace(session: Session) -> dict[str, Any]:
    """Names an RLM host puts in a cell's globals: the helper, the session and its evidence."""
    return {"llm_batch_json": bind(session), "batch_session": session,
            "run_batch": session.run_batch, "validator": session.validators.define}
