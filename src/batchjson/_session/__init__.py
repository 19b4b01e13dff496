"""The session: the one way into a run, and what a run goes through before the replay loop."""
