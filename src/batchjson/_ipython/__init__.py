"""IPython/Jupyter face of batchjson: ``%load_ext batchjson`` (needs ``batchjson[ipython]``);
``magics``: the hooks, the magics and the ``BatchJson`` configurable; ``display``: their views.

Imports the shared text views and the core below them; never the command line or the RLM face."""
