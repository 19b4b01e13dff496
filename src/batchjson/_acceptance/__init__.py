"""The commit boundary: a return is accepted whole, or not at all.

docs/design.md's module map names what each module here owns. May import providers, content,
fingerprints and the flat modules; never the ledger, the replay loop, the session or a face."""
