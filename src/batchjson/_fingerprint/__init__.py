"""Content fingerprints: validators, answer sources and data keyed by content, never identity.

Owns the public ``Fingerprint`` views (``fingerprint``), the one walk over what a callable
reaches (``walker``), what the walk counts (``policy``), the one bytecode scan (``bytecode``),
installed code and library objects (``library``), the files a validator reads (``files``) and
what changed between two fingerprints, in words (``describe``).

May import only the flat modules (``_canon``, ``_errors``, ``_checks``, ``_money``): it is the
lowest package layer.
"""
