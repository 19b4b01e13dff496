"""Model providers: each turns a Call into raw text and usage; none of them validates.

Private: the public names are re-exported from :mod:`batchjson` (the HTTP providers lazily).
The simulated model draws its answers from the values a schema allows (``_content``).

May import content, fingerprints and the flat modules; never acceptance, the ledger or above.
"""
