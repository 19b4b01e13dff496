"""The seed's regression: success is committed only after every item's identity is checked."""

from __future__ import annotations

import json

import pytest

from batchjson import BatchUnresolved, CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

IDENTITY = ("task_id", "case_id", "candidate_id")


def swapped_first_attempt(call):
    """First attempt: candidate 127's case_id says 079; later attempts are correct."""
    if call.attempt == 0:
        victim = call.tasks[0]["task_id"]
        return items_reply(call, **{victim: {"case_id": "gold-pair-079"}})
    return items_reply(call)


def test_swapped_case_id_writes_failure_receipt_then_success_only_when_correct(tmp_path):
    session = Session(CallableProvider(swapped_first_attempt), ledger=tmp_path / "l.sqlite",
                      repairs=0, replays=0)
    tasks = review_tasks(20)

    with pytest.raises(BatchUnresolved) as raised:
        session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=20)

    receipts = session.ledger.attempts("review")
    assert [r.status for r in receipts] == ["rejected"]
    failure = receipts[0]
    assert failure.errors == [{
        "type": "identity", "task_id": tasks[0]["task_id"],
        "message": "case_id is 'gold-pair-079' but the request has 'gold-pair-078' "
                   f"(task {tasks[0]['task_id']!r})",
        "field": "case_id", "expected": "gold-pair-078", "got": "gold-pair-079"}]
    kept = json.loads(failure.raw)
    assert kept["items"][0]["case_id"] == "gold-pair-079"  # raw return kept whole, not "fixed"
    assert len(kept["items"]) == 20
    assert session.ledger.checkpoint("review") == {}  # the other 19 are not admitted either
    assert raised.value.result.values == {}
    assert "gold-pair-079" in str(raised.value)

    result = session.run_batch("review", tasks, LABEL_SCHEMA, identity=IDENTITY, pack=20)
    assert result.status == "resolved"
    assert [r.status for r in session.ledger.attempts("review")] == ["rejected", "accepted"]
    checkpoint = session.ledger.checkpoint("review")
    assert len(checkpoint) == 20
    assert all(item["verdict"] in ("match", "no_match") for item in checkpoint.values())


def test_identity_is_never_fixed_by_repair_of_order(tmp_path):
    """Items may arrive in any order: join by task_id, not position."""
    def reversed_items(call):
        payload = json.loads(items_reply(call))
        payload["items"].reverse()
        return json.dumps(payload)

    session = Session(CallableProvider(reversed_items))
    result = session.run_batch("review", review_tasks(6), LABEL_SCHEMA, identity=IDENTITY,
                               pack=6)
    assert result.status == "resolved" and result.calls == 1


@pytest.mark.parametrize("field", ["candidate_id", "task_id"])
def test_other_identity_faults_reject_the_whole_return(field):
    def corrupt(call):
        victim = call.tasks[1]["task_id"]
        return items_reply(call, **{victim: {field: call.tasks[2][field]}})

    session = Session(CallableProvider(corrupt), repairs=0, replays=0)
    result = session.run_batch("review", review_tasks(4), LABEL_SCHEMA, identity=IDENTITY,
                               pack=4, on_exhausted="return")
    assert result.status == "unresolved" and result.values == {}
    (receipt,) = session.ledger.attempts("review")
    assert receipt.status == "rejected"
    assert receipt.errors[0]["type"] == ("coverage" if field == "task_id" else "identity")
