"""Content fingerprints: validators, answer sources and data keyed by content, never identity
(docs/design.md's module map). The lowest package layer: it imports only the flat modules."""
