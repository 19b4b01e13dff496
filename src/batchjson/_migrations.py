"""Ledger schema versions. Each migration runs once, in order, inside a transaction."""

from __future__ import annotations

import sqlite3

from ._errors import LedgerError

MIGRATIONS: list[str] = [
    # 1: batches, revisions, requests, attempts (receipts), checkpoint, validators
    """
    CREATE TABLE batches (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, current_revision INTEGER,
        created_at TEXT NOT NULL);
    CREATE TABLE revisions (
        id INTEGER PRIMARY KEY, batch_id INTEGER NOT NULL REFERENCES batches(id),
        number INTEGER NOT NULL, fingerprint TEXT NOT NULL, components TEXT NOT NULL,
        validator_name TEXT, validator_version INTEGER, validator_fingerprint TEXT,
        status TEXT NOT NULL CHECK (status IN ('open', 'superseded')),
        superseded_by INTEGER REFERENCES revisions(id), supersede_reason TEXT,
        created_at TEXT NOT NULL,
        UNIQUE (batch_id, number), UNIQUE (batch_id, fingerprint));
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY, revision_id INTEGER NOT NULL REFERENCES revisions(id),
        key TEXT NOT NULL, position INTEGER NOT NULL, parent_key TEXT,
        task_ids TEXT NOT NULL, tasks TEXT NOT NULL, split INTEGER NOT NULL DEFAULT 0,
        UNIQUE (revision_id, key));
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY, batch_id INTEGER NOT NULL REFERENCES batches(id),
        revision_id INTEGER NOT NULL REFERENCES revisions(id), request_key TEXT NOT NULL,
        task_ids TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('initial', 'repair', 'replay', 'split')),
        status TEXT NOT NULL CHECK (status IN
            ('in_flight', 'accepted', 'rejected', 'provider_error', 'cancelled')),
        errors TEXT, raw TEXT, input_tokens INTEGER, output_tokens INTEGER,
        cached_tokens INTEGER, cost REAL, provider TEXT, model TEXT,
        started_at TEXT NOT NULL, finished_at TEXT);
    CREATE INDEX attempts_by_key ON attempts (request_key, status);
    CREATE TABLE checkpoint (
        batch_id INTEGER NOT NULL REFERENCES batches(id), request_key TEXT NOT NULL,
        task_id TEXT NOT NULL, attempt_id INTEGER NOT NULL REFERENCES attempts(id),
        item TEXT NOT NULL, committed_at TEXT NOT NULL,
        PRIMARY KEY (request_key, task_id, batch_id));
    CREATE TABLE validators (
        name TEXT NOT NULL, version INTEGER NOT NULL, fingerprint TEXT NOT NULL,
        where_defined TEXT, defined_at TEXT NOT NULL, by_identity TEXT,
        PRIMARY KEY (name, fingerprint), UNIQUE (name, version));
    """,
    # 2: claims (one payer per request), honest call accounts, rechecks and imports, merge ids.
    # SQLite cannot widen a CHECK in place, so attempts is rebuilt (foreign keys are off while
    # migrations run, and checked before they commit).
    """
    CREATE TABLE attempts_v2 (
        id INTEGER PRIMARY KEY, batch_id INTEGER NOT NULL REFERENCES batches(id),
        revision_id INTEGER NOT NULL REFERENCES revisions(id), request_key TEXT NOT NULL,
        task_ids TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN
            ('initial', 'repair', 'replay', 'split', 'recheck', 'import')),
        status TEXT NOT NULL CHECK (status IN
            ('in_flight', 'accepted', 'rejected', 'provider_error', 'cancelled', 'abandoned')),
        errors TEXT, raw TEXT, input_tokens INTEGER, output_tokens INTEGER,
        cached_tokens INTEGER, cost REAL, provider TEXT, model TEXT,
        started_at TEXT NOT NULL, finished_at TEXT,
        uid TEXT NOT NULL UNIQUE, sent_at TEXT, owner TEXT, source TEXT,
        estimated_input_tokens INTEGER);
    INSERT INTO attempts_v2 (id, batch_id, revision_id, request_key, task_ids, kind, status,
        errors, raw, input_tokens, output_tokens, cached_tokens, cost, provider, model,
        started_at, finished_at, uid, sent_at)
        SELECT id, batch_id, revision_id, request_key, task_ids, kind, status, errors, raw,
        input_tokens, output_tokens, cached_tokens, cost, provider, model, started_at,
        finished_at, lower(hex(randomblob(16))), started_at FROM attempts;
    DROP TABLE attempts;
    ALTER TABLE attempts_v2 RENAME TO attempts;
    CREATE INDEX attempts_by_key ON attempts (request_key, status);
    CREATE INDEX attempts_by_batch ON attempts (batch_id, id);
    CREATE TABLE claims (
        request_key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL,
        pid INTEGER NOT NULL, session TEXT NOT NULL, attempt_id INTEGER,
        lease_expires_at REAL NOT NULL, claimed_at TEXT NOT NULL);
    CREATE TABLE imports (
        digest TEXT PRIMARY KEY, attempt_id INTEGER REFERENCES attempts(id),
        source TEXT, line INTEGER, outcome TEXT NOT NULL, imported_at TEXT NOT NULL);
    """,
    # 3: re-judging. `seen` maps each request key to the key of what the model saw (prompt,
    # system text, wire schema, answer source), so a revision that changed only how returns are
    # judged finds earlier raw returns; `rechecks` says which attempt a recheck receipt re-judged.
    """
    CREATE TABLE seen (request_key TEXT PRIMARY KEY, seen_key TEXT NOT NULL);
    CREATE INDEX seen_by_seen_key ON seen (seen_key);
    CREATE TABLE rechecks (
        attempt_id INTEGER PRIMARY KEY REFERENCES attempts(id),
        from_attempt INTEGER NOT NULL REFERENCES attempts(id));
    """,
    # 4: the least a sent call costs (estimated input tokens at the model's input price), so a
    # killed call is accounted as "at least this much", never as zero.
    # Claims are written and deleted with every call: WITHOUT ROWID keeps each one to a single
    # b-tree (one page written instead of two).
    """
    ALTER TABLE attempts ADD COLUMN cost_floor REAL;
    CREATE TABLE claims_v3 (
        request_key TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL,
        pid INTEGER NOT NULL, session TEXT NOT NULL, attempt_id INTEGER,
        lease_expires_at REAL NOT NULL, claimed_at TEXT NOT NULL) WITHOUT ROWID;
    INSERT INTO claims_v3 SELECT request_key, owner, host, pid, session, attempt_id,
        lease_expires_at, claimed_at FROM claims;
    DROP TABLE claims;
    ALTER TABLE claims_v3 RENAME TO claims;
    """,
    # 5: the calls still in flight, by owner: every run looks for runners that died, and
    # without this a notebook cell scanned the whole history of attempts to find them.
    """
    CREATE INDEX attempts_in_flight ON attempts (owner) WHERE status = 'in_flight';
    """,
    # 6: fewer pages written per call. A receipt's completion changes its status; with status
    # in attempts_by_key that rewrote a random page of the index (a WAL frame) for every call,
    # and a request has only a few attempts to look through by key. A checkpoint row lived in
    # two b-trees (the table and its primary-key index); WITHOUT ROWID keeps it to one.
    """
    DROP INDEX attempts_by_key;
    CREATE INDEX attempts_by_key ON attempts (request_key);
    CREATE TABLE checkpoint_v6 (
        batch_id INTEGER NOT NULL REFERENCES batches(id), request_key TEXT NOT NULL,
        task_id TEXT NOT NULL, attempt_id INTEGER NOT NULL REFERENCES attempts(id),
        item TEXT NOT NULL, committed_at TEXT NOT NULL,
        PRIMARY KEY (request_key, task_id, batch_id)) WITHOUT ROWID;
    INSERT INTO checkpoint_v6 SELECT batch_id, request_key, task_id, attempt_id, item,
        committed_at FROM checkpoint;
    DROP TABLE checkpoint;
    ALTER TABLE checkpoint_v6 RENAME TO checkpoint;
    """,
    # 7: forgetting a batch. A person may decide an abandoned batch is owed no more: `forgets`
    # records who, when and how, and what it stopped owing; each revision it covers points at
    # it (`forget_id`) and stops counting until a later run of the same content reopens it.
    """
    CREATE TABLE forgets (
        id INTEGER PRIMARY KEY, batch_id INTEGER NOT NULL REFERENCES batches(id),
        forgotten_at TEXT NOT NULL, forgotten_by TEXT NOT NULL, via TEXT NOT NULL,
        revisions TEXT NOT NULL, requests INTEGER NOT NULL, items INTEGER NOT NULL);
    ALTER TABLE revisions ADD COLUMN forget_id INTEGER REFERENCES forgets(id);
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection) -> int:
    """Bring the ledger to SCHEMA_VERSION; refuse a ledger written by a newer batchjson."""
    current = db.execute("PRAGMA user_version").fetchone()[0]
    if current > SCHEMA_VERSION:
        raise LedgerError(
            f"schema version {current} is newer than this batchjson knows ({SCHEMA_VERSION}); "
            "upgrade batchjson to read it (nothing was changed)")
    if current == SCHEMA_VERSION:
        return SCHEMA_VERSION
    foreign_keys = db.execute("PRAGMA foreign_keys").fetchone()[0]
    db.execute("PRAGMA foreign_keys=OFF")  # a no-op inside a transaction: set it before
    try:
        for version in range(current + 1, SCHEMA_VERSION + 1):
            db.execute("BEGIN IMMEDIATE")
            try:
                # Another process may have migrated while we waited for the write lock: read
                # the version again under it, so two runners creating one ledger never both
                # run a migration.
                if db.execute("PRAGMA user_version").fetchone()[0] >= version:
                    db.execute("COMMIT")
                    continue
                for statement in MIGRATIONS[version - 1].split(";"):
                    if statement.strip():
                        db.execute(statement)
                broken = db.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise LedgerError(f"migration {version} would break {len(broken)} "
                                      "references; nothing was changed")
                db.execute(f"PRAGMA user_version = {version}")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
    finally:
        db.execute(f"PRAGMA foreign_keys={'ON' if foreign_keys else 'OFF'}")
    return SCHEMA_VERSION
