"""The small value checks every face and setting shares: one wording, one place.

Each raises the caller's error type (InvalidBatch for a run's input, ConfigError for a setting),
naming the value, what it must be and what it was, before anything is spent.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from ._errors import BatchJsonError, InvalidBatch


def is_whole(value: Any, minimum: int = 0) -> bool:
    """An int (never a bool) of at least ``minimum``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def whole(name: str, value: Any, minimum: int = 0,
          error: type[BatchJsonError] = InvalidBatch) -> int:
    """``value`` if it is a whole number >= ``minimum``, else ``error`` saying so."""
    if not is_whole(value, minimum):
        raise error(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def is_amount(value: Any, *, positive: bool = False) -> bool:
    """A finite int or float (never a bool) >= 0, or > 0 when ``positive``: a price, a cost,
    a delay or a timeout."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and (value > 0 if positive else value >= 0))


def positive_seconds(name: str, value: Any,
                     error: type[BatchJsonError] = InvalidBatch) -> float:
    """A timeout: a finite number of seconds > 0."""
    if not is_amount(value, positive=True):
        raise error(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def seconds(name: str, value: Any, error: type[BatchJsonError] = InvalidBatch) -> float:
    """A delay: a finite number of seconds >= 0."""
    if not is_amount(value):
        raise error(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def whole_argument(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number >= ``minimum`` (and <= ``maximum``), the CLI's
    and the magics': argparse turns its refusal into a usage error (exit 2), never a
    traceback."""
    bound = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be a whole number {bound}, got {text!r}")
        return value

    parse.__name__ = f"whole number {bound}"
    return parse
