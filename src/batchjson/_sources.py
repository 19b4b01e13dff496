"""The words a provider describes its answer source in; the keys (``_content/keys.py``) read them.

A provider's ``source_key()`` returns a string, or a sequence of parts joined in order: text as
it is, :class:`Code` (a function or object whose code decides answers, keyed by its content),
:class:`Digest` (setting values, keyed by a short digest of their content) and :class:`Hashed`
(a list of parts, keyed as one digest). A provider says *what* decides its answers; how that
becomes a key is decided in one place, so no provider hashes anything itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Code:
    """Code that decides answers. ``whole``: the object with its configuration (a callable
    object's immutable attributes, a function's defaults and what it reads); else the function
    or class alone. ``owner`` names the provider refused when the code reads what no fingerprint
    can see; ``length`` shortens the digest (None: all of it)."""

    obj: Any
    owner: str | None = None
    length: int | None = 24
    whole: bool = True
    fingerprint: Any = field(default=None, repr=False)  # kept: identity-compared objects live on


@dataclass(frozen=True, eq=False)
class Digest:
    """Setting values by a 16-character digest of their content; ``fallback`` gives the bytes
    hashed instead when the values have no content encoding (nested past its bound)."""

    value: Any
    fallback: Callable[[], bytes] | None = None


@dataclass(frozen=True, eq=False)
class Hashed:
    """A JSON list whose parts may be :class:`Code` or :class:`Hashed`: the SHA-256 of its
    JSON text once they are resolved."""

    items: list[Any]
