"""The commit boundary: a return is accepted whole, or not at all.

Owns judging a return (``judge``: JSON, coverage, identity, schema, the caller's validator),
running the caller's validator so it can only say yes, no or that it is broken
(``validators``) and a provider's reply made well-typed (``replies``).

May import providers, content, fingerprints and the flat modules; never the ledger (which
imports this package to re-judge), the replay loop, the session or a face.
"""
