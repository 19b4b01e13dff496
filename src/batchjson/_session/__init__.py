"""The session: the one way into a run, and what a run goes through before the replay loop.

docs/design.md's module map names what each module here owns. May import the replay loop and
every layer below it; never a face (``_cli``, ``_ipython``, ``rlm``, ``testing``), as the
import-linter contract in pyproject.toml keeps."""
