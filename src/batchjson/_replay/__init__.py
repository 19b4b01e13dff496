"""The bounded replay loop: resolve each request within a fixed allowance, one payer per call.

Owns the worker pool (``replay``), one call's steps: reserve, claim and receipt, send, judge,
record (``calls``), what one run of a revision is asked to do (``plan``), call and cost budgets
(``budget``) and group commit: many calls' ledger writes in one transaction (``groupcommit``).

May import the ledger and every layer below it (acceptance, providers, content, fingerprints,
the flat modules); never the session or a face.
"""
