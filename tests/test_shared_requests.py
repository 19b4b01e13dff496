"""A request shared by revisions or batches (same content key) is owed, and paid, once: the
evidence of a ledger of either store (a SQLite file, a database on a PostgreSQL server)."""

from __future__ import annotations

from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


def test_strict_evidence_counts_a_request_shared_by_two_revisions_once(ledger_at):
    fixed = []  # the model's state, not its source: fixing it keeps the answer source
    session = Session(CallableProvider(lambda call: items_reply(call) if fixed else "not json"),
                      strict=True, repairs=0, replays=0, ledger=ledger_at())
    tasks = review_tasks(5)
    session.run_batch("r", tasks[:4], LABEL_SCHEMA, on_exhausted="return")
    session.run_batch("r", tasks, LABEL_SCHEMA, on_exhausted="return")  # one task appended
    owed = session.evidence.minimum_exact_retry_calls
    fixed.append(True)
    result = session.run_batch("r", tasks, LABEL_SCHEMA)
    assert result.calls == 5
    assert owed == 5  # the calls that actually clear both revisions
    assert session.evidence.minimum_exact_retry_calls == 0


def test_evidence_counts_a_request_shared_by_two_batches_once(ledger_at):
    fixed = []
    session = Session(CallableProvider(lambda call: items_reply(call) if fixed else "not json"),
                      repairs=0, replays=0, ledger=ledger_at())
    tasks = review_tasks(2)
    session.run_batch("a", tasks, LABEL_SCHEMA, on_exhausted="return")
    session.run_batch("b", tasks, LABEL_SCHEMA, on_exhausted="return")  # same content
    assert session.evidence.minimum_exact_retry_calls == 2
    assert session.evidence.unresolved_items == 2
    assert session.evidence.summary()["unresolved_requests"] == 4  # two per batch
    fixed.append(True)
    assert session.run_batch("a", tasks, LABEL_SCHEMA).calls == 2  # the calls that clear both
    assert session.evidence.minimum_exact_retry_calls == 0
    assert session.run_batch("b", tasks, LABEL_SCHEMA).calls == 0
