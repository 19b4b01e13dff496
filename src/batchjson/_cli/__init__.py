"""The command-line face: ``batchjson = "batchjson._cli:main"`` in pyproject.toml.

Owns the subcommands, their arguments and exit codes (``commands``; its docstring is
``batchjson --help``), ``batchjson demo`` (``demo``) and the validators a user gives import and
merge (``validators``). May import the shared text views
(``_textview``), ``testing`` (``batchjson serve``) and every core layer; never the IPython face.
"""

from .commands import main

__all__ = ["main"]
