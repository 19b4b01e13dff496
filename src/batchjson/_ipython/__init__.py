"""IPython/Jupyter face of batchjson: ``%load_ext batchjson``.

Importing this package needs IPython and traitlets (``pip install batchjson[ipython]``).

A face: may import the shared text views (``_textview``) and every core layer below them;
never the command line (``_cli``) or the RLM face.
"""

from .magics import BatchJson, load_ipython_extension, unload_ipython_extension

__all__ = ["BatchJson", "load_ipython_extension", "unload_ipython_extension"]
