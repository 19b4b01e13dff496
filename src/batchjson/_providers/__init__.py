"""Model providers: each turns a Call into raw text and usage; none of them validates.

Public names are re-exported from :mod:`batchjson`. The provider named "simulated" is the test
double :mod:`batchjson.testing.simulated`, imported only when chosen. Imports content,
fingerprints and the flat modules; never acceptance, the ledger or above."""
