"""Model providers: each turns a Call into raw text and usage; none of them validates.

Public names are re-exported from :mod:`batchjson`. Imports content, fingerprints and the flat
modules; never acceptance, the ledger or above."""
