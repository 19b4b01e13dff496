"""The bounded replay loop: resolve each request within a fixed allowance, one payer per call.

docs/design.md's module map names what each module here owns. May import the ledger and every
layer below it; never the session or a face."""
