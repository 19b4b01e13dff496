"""The store: every statement batchjson runs on a ledger, grouped by what it serves, each concept
building on those it needs: a run's (``store_runs``), a call's (``store_calls``), a job's
(``store_jobs``), a person's (``store_admin``: import, export, merge, forget); the accounts' here.
What a call is and what is known of its cost is said once (``IS_CALL``, ``UNKNOWN``), so every
account counts alike. ``sqlite.SQLiteStore`` and ``postgres.PostgresStore`` connect it."""

from __future__ import annotations

from .store_admin import AdminStore
from .store_base import Row, StoreBase

# A receipt is a call unless it was cancelled before sending; a recheck sends nothing.
IS_CALL = "(a.kind != 'recheck' AND NOT (a.status = 'cancelled' AND a.sent_at IS NULL))"
# A line of an unfinished provider batch job: pending, its cost still to come, not unknown.
PENDING = "(a.status = 'in_flight' AND a.id IN (SELECT attempt_id FROM job_lines))"
# A call with no recorded cost (killed, interrupted, an error without usage, an unpriced model)
# is never free: it cost at least its floor, priced when it was sent.
UNKNOWN = f"({IS_CALL} AND a.cost IS NULL AND NOT {PENDING})"


_COUNTS = {  # what each counter of a batch counts
    "calls": IS_CALL,
    "rechecks": "a.kind = 'recheck'",
    "unsent": "a.kind != 'recheck' AND a.status = 'cancelled' AND a.sent_at IS NULL",
    **{f"{status}{suffix}": f"{IS_CALL} AND a.status = '{status}'"
       for status, suffix in (("accepted", "_returns"), ("partial", "_returns"),
                              ("rejected", "_returns"), ("provider_error", "s"),
                              ("abandoned", ""), ("cancelled", ""))},
    "in_flight": f"{IS_CALL} AND a.status = 'in_flight' AND NOT {PENDING}",
    "pending": PENDING,
    "imported": f"{IS_CALL} AND a.kind = 'import'",
    "unknown_cost_calls": UNKNOWN,
    "unfloored": f"{UNKNOWN} AND a.cost_floor IS NULL",
}

CALLS_SQL = (
    "SELECT b.name AS batch, "
    + "".join(f"SUM(CASE WHEN {condition} THEN 1 ELSE 0 END) AS {name}, "
              for name, condition in _COUNTS.items())
    + "COALESCE(SUM(a.input_tokens), 0) AS input_tokens, "
    "COALESCE(SUM(a.output_tokens), 0) AS output_tokens, "
    "COALESCE(SUM(a.cached_tokens), 0) AS cached_tokens, "
    f"SUM(CASE WHEN {IS_CALL} THEN a.cost END) AS cost, "  # NULL: no call has a known cost
    f"COALESCE(SUM(CASE WHEN {UNKNOWN} THEN a.cost_floor END), 0.0) "
    "AS unknown_cost_lower_bound "
    "FROM attempts a JOIN batches b ON b.id = a.batch_id{where} GROUP BY b.id, b.name "
    "ORDER BY b.id")

# Unknown-cost calls with no recorded floor (imported), and pending ones: their prompt tokens as
# reported, else as estimated when sent, else a quarter of their tasks' text (which every prompt
# carries), per batch, model and whether pending, to be priced at the model's input rate.
UNFLOORED_SQL = (
    "SELECT batch, model, pending, COUNT(*) AS calls, "
    "SUM(tokens - CASE WHEN cached < tokens THEN cached ELSE tokens END) AS uncached, "
    "SUM(CASE WHEN cached < tokens THEN cached ELSE tokens END) AS cached FROM ("
    f"SELECT b.name AS batch, a.model, CASE WHEN {PENDING} THEN 1 ELSE 0 END AS pending, "
    "COALESCE(a.input_tokens, a.estimated_input_tokens, COALESCE(LENGTH(q.tasks), 0) / 4) "
    "AS tokens, COALESCE(a.cached_tokens, 0) AS cached FROM attempts a "
    "JOIN batches b ON b.id = a.batch_id LEFT JOIN requests q "
    "ON q.revision_id = a.revision_id AND q.key = a.request_key "
    f"WHERE ({UNKNOWN} AND a.cost_floor IS NULL OR {PENDING}){{where}}) AS u "
    "GROUP BY batch, model, pending")

TASKS_SQL = (
    "SELECT b.name AS batch, q.task_ids FROM batches b LEFT JOIN requests q "
    "ON q.revision_id = b.current_revision AND q.split = 0")

USABLE_SQL = (
    "SELECT b.name AS batch, COUNT(DISTINCT c.task_id) AS usable FROM batches b "
    "JOIN requests q ON q.revision_id = b.current_revision JOIN checkpoint c "
    "ON c.request_key = q.key WHERE q.split = 0{where} GROUP BY b.id, b.name")


class AccountStore(StoreBase):
    """Rows for the accounts, for pack-size advice and for what a pack may hold."""

    def call_rows(self, name: str | None = None) -> tuple[list[Row], list[Row]]:
        """``CALLS_SQL`` per batch; ``UNFLOORED_SQL`` too only when some calls need pricing."""
        where, args = (" AND b.name = ?", (name,)) if name is not None else ("", ())
        calls = self._read(CALLS_SQL.format(where=where), args)
        if not any(row["unfloored"] or row["pending"] for row in calls):
            return calls, []
        return calls, self._read(UNFLOORED_SQL.format(where=where), args)

    def task_rows(self, name: str | None = None) -> tuple[list[Row], list[Row]]:
        """Per batch (``name`` or all), its current revision's (batch, task_ids) of each leaf
        (None: it has none), and (batch, usable): how many tasks are accepted."""
        where, args = (" AND b.name = ?", (name,)) if name is not None else ("", ())
        return (self._read(TASKS_SQL + (" WHERE b.name = ?" if name is not None else "")
                           + " ORDER BY b.id", args),
                self._read(USABLE_SQL.format(where=where), args))

    def fit_rows(self, name: str) -> list[Row]:
        """Batch ``name``'s receipts but imports, with their request's length: what advice fits."""
        return self._read(
            "SELECT a.kind, a.status, a.errors, a.task_ids, a.input_tokens, a.output_tokens, "
            "a.cached_tokens, a.cost, a.model, LENGTH(q.tasks) AS chars FROM attempts a "
            "JOIN batches b ON b.id = a.batch_id LEFT JOIN requests q ON q.revision_id = "
            "a.revision_id AND q.key = a.request_key WHERE b.name = ? AND a.kind != 'import' "
            "ORDER BY a.id", (name,))

    def fewest_output_tokens_per_item(self, name: str, envelope: int) -> float | None:
        """The fewest output tokens per item (``envelope`` off) of ``name``'s accepted returns."""
        count = self.dialect.json_length.format("a.task_ids")
        rows = self._read(
            f"SELECT MIN((a.output_tokens - ?) * 1.0 / {count}) FROM attempts a "
            "JOIN batches b ON b.id = a.batch_id WHERE b.name = ? AND a.status = 'accepted' "
            f"AND a.kind != 'recheck' AND a.output_tokens > ? AND {count} > 0",
            (envelope, name, envelope))
        return rows[0][0] if rows and rows[0][0] is not None else None


class Store(AdminStore, AccountStore):
    """Every read and write of the ledger; a subclass connects it to one database."""
