"""Model providers: each turns a Call into raw text and usage; none of them validates.

Private: the public names are re-exported from :mod:`batchjson` (the HTTP providers lazily).
Beside the providers: schema-valid values made from a seed (``schemagen``, reading a schema's
parts through ``schemaparts``, strings through ``patterngen``), the simulated model's answers,
the loopback server's and the smallest answer a pack can get.

May import content, fingerprints and the flat modules; never acceptance, the ledger or above.
"""
