"""The command-line face: ``batchjson = "batchjson._cli:main"`` in pyproject.toml.

Owns the subcommands, their arguments and exit codes (``commands``; its docstring is
``batchjson --help``) and ``batchjson demo`` (``demo``). May import the shared text views
(``_textview``), ``testing`` (``batchjson serve``) and every core layer; never the IPython face.
"""

from .commands import main

__all__ = ["main"]
