"""IPython/Jupyter face of batchjson: ``%load_ext batchjson`` (needs ``batchjson[ipython]``).

Imports the shared text views and the core below them; never the command line or the RLM face."""

from .magics import BatchJson, load_ipython_extension, unload_ipython_extension

__all__ = ["BatchJson", "load_ipython_extension", "unload_ipython_extension"]
