"""The command-line face (``batchjson = "batchjson._cli:main"``): ``commands`` (subcommands,
arguments, exit codes, ``batchjson demo``; its docstring is ``batchjson --help``). Imports the
shared text views, ``testing`` (``batchjson serve``) and the core; never the IPython face."""

from .commands import main

__all__ = ["main"]
