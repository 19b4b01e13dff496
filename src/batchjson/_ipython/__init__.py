"""IPython/Jupyter face of batchjson: ``%load_ext batchjson``.

Importing this package needs IPython and traitlets (``pip install batchjson[ipython]``).
"""

from .magics import BatchJson, load_ipython_extension, unload_ipython_extension

__all__ = ["BatchJson", "load_ipython_extension", "unload_ipython_extension"]
