"""The session: the one way into a run, and what a run goes through before the replay loop.

docs/design.md's module map names what each module owns. Imports the replay loop and the layers
below, never a face (import-linter keeps this)."""
