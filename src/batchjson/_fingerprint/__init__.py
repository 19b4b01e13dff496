"""Content fingerprints: validators, answer sources and data keyed by content, never identity.

docs/design.md's module map names what each module here owns. May import only the flat modules:
it is the lowest package layer."""
