"""The bounded replay loop: resolve each request within a fixed allowance, one payer per call.

Imports the ledger and the layers below, never the session or a face (docs/design.md)."""
