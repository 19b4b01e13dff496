"""Runs a plan through a transport (live calls or batch jobs), settled by one policy; imports the
ledger and the layers below, never the session or a face (docs/design.md)."""
