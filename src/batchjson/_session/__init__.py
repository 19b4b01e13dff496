"""The session: the one way into a run, and what a run goes through before the replay loop.

Owns ``Session`` and the default session (``session``), a run as a pipeline of named steps
(``run``), the one public description of a run and the session's settings (``spec``), a run's
content checks (``preflight``), what the chosen provider cannot do with a run (``fit``), the
define-once validator registry (``registry``), droste's ``llm_batch_json`` contract over a
session (``structured``), what a run hands back (``result``: ``BatchResult``), the one way
stored answers are judged again (``rejudge``); above the ledger, what prices its records (the
accounts, ``accounts``; ``Evidence``, ``evidence``; pack-size advice, ``advice``) and what judges
what the ledger is brought: import (``recovery``, ``receipt_files``), merge (``merge``), and the
public ``Ledger`` that offers them (``ledger``).

May import the replay loop and every layer below it (ledger, acceptance, providers, content,
fingerprints, the flat modules); never a face (``_cli``, ``_ipython``, ``rlm``, ``testing``).
The layers are kept by the import-linter contract in pyproject.toml.
"""
