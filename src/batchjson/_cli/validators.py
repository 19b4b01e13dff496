"""``--validator [NAME=]module:function``: a validator the user gives import and merge, so the
receipts of a batch that ran with one are rechecked by it (a validator is code no file carries)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any


def validator_argument(text: str) -> tuple[str, Callable[..., Any]]:
    """``--validator [NAME=]module:function``: the function (its module found from the current
    directory too), under NAME, else its own name."""
    name, _, where = text.rpartition("=")
    module, _, attr = where.partition(":")
    if not module or not attr:
        raise argparse.ArgumentTypeError(f"expected [NAME=]module:function, got {text!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as exc:  # the user's module: whatever it raises is why it cannot load
        raise argparse.ArgumentTypeError(f"cannot load validator {where!r}: "
                                         f"{type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise argparse.ArgumentTypeError(f"{where!r} is not a function")
    return name or getattr(fn, "__name__", attr), fn


def validator_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--validator", type=validator_argument, action="append", default=[],
                        metavar="[NAME=]MODULE:FUNCTION",
                        help="the validator a batch ran with, rerun on its receipts "
                        "(repeatable; NAME defaults to the function's name)")
