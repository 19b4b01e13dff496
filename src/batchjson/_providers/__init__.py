"""Model providers: each turns a Call into raw text and usage; none of them validates.

Private: the public names are re-exported from :mod:`batchjson` (the HTTP providers lazily).
The provider named "simulated" is the test double :mod:`batchjson.testing.simulated`, imported
only when that name is chosen.

May import content, fingerprints and the flat modules; never acceptance, the ledger or above.
"""
