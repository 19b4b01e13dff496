"""The small value checks every face and setting shares, in one wording: each raises the caller's
error type naming the value, what it must be and what it was. Option objects declare theirs as
types pydantic checks (:func:`options`); a value checked per call is checked by hand."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic import Field

from ._errors import BatchJsonError, InvalidBatch

Flag = Annotated[bool, Field(description="True or False")]
Count = Annotated[int, Field(ge=0, description="a whole number >= 0")]
CountOrNone = Annotated[int | None, Field(ge=0, description="a whole number >= 0")]
Positive = Annotated[int, Field(ge=1, description="a whole number >= 1")]
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False,
                                 description="a finite number of seconds > 0")]
_STRICT = pydantic.ConfigDict(strict=True, arbitrary_types_allowed=True)
OptionClass = TypeVar("OptionClass", bound=type)


def options(refused: type[BatchJsonError],
            prefix: str = "") -> Callable[[OptionClass], OptionClass]:
    """A frozen dataclass whose fields pydantic checks strictly when it is made (an int is no
    bool): a bad value is ``refused`` naming the option (after ``prefix``), what it must be (its
    type's ``description``, or a ``Literal``'s values) and what it was."""
    def build(cls: OptionClass) -> OptionClass:
        made: Any = pydantic.dataclasses.dataclass(frozen=True, config=_STRICT)(cls)
        checked = made.__init__

        @functools.wraps(checked)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                checked(self, *args, **kwargs)
            except pydantic.ValidationError as exc:
                raise _refusal(made, exc, refused, prefix) from None

        made.__init__ = __init__
        return made
    return build


def _refusal(cls: Any, exc: pydantic.ValidationError, refused: type[BatchJsonError],
             prefix: str) -> Exception:
    error = exc.errors()[0]
    context = error.get("ctx") or {}
    if isinstance(context.get("error"), Exception):  # raised by a check of its own
        return context["error"]
    name = error["loc"][0]
    if isinstance(name, int):  # given by position
        name = dataclasses.fields(cls)[name].name
    said = (cls.__pydantic_fields__[name].description or context.get("expected")
            or error["msg"])
    return refused(f"{prefix}{name} must be {said}, got {error['input']!r}")


def is_whole(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def whole(name: str, value: Any, minimum: int = 0,
          error: type[BatchJsonError] = InvalidBatch) -> int:
    if not is_whole(value, minimum):
        raise error(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def is_amount(value: Any, *, positive: bool = False) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and (value > 0 if positive else value >= 0))


def seconds(name: str, value: Any, error: type[BatchJsonError] = InvalidBatch, *,
            positive: bool = False) -> float:
    if not is_amount(value, positive=positive):
        bound = "> 0" if positive else ">= 0"
        raise error(f"{name} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


def whole_argument(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for a whole number from ``minimum`` (to ``maximum``)."""
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


def surrogate_at(text: str) -> int | None:
    """Where ``text`` holds an unpaired surrogate (no valid Unicode: it cannot be stored or sent
    as UTF-8), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def batch_name(name: Any) -> Any:
    """A batch name as given to a ledger's reads: one no batch can have (an unpaired surrogate
    is no text a ledger stores) is refused, naming it, before any statement is sent."""
    if isinstance(name, str) and (at := surrogate_at(name)) is not None:
        raise InvalidBatch(f"batch name {name!r} holds an unpaired surrogate at position {at}, "
                           "which no batch's name can hold; fix the text")
    return name
