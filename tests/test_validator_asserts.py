"""What a user's validator may say: a failed assert rejects like ValueError (pydantic's rule),
and a validator that indexes the model instance a pydantic schema hands it is told why."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel

from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks


def test_a_bare_assert_rejects_with_its_own_line_and_is_repaired(tmp_path):
    source = tmp_path / "rules.py"  # compiled as a user's file is (pytest rewrites asserts here)
    source.write_text('def check(item, task):\n    assert item["verdict"] == "match"\n')
    scope: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), scope)
    check = scope["check"]

    def model(call):  # every answer no_match until a repair
        verdict = "match" if call.kind == "repair" else "no_match"
        return items_reply(call, **{t["task_id"]: {"verdict": verdict} for t in call.tasks})

    session = Session(CallableProvider(model, source="m"), repairs=1, replays=0)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, pack=2, validator=check)
    assert result.status == "resolved" and result.repairs_made == 1
    first = session.ledger.attempts("r")[0]
    assert first.status == "rejected" and {e["type"] for e in first.errors} == {"validation"}
    assert first.errors[0]["message"].endswith(
        """assert item["verdict"] == "match" failed""")
    session.close()


class Verdict(BaseModel):
    verdict: Literal["match", "no_match"]


def test_a_validator_indexing_a_pydantic_item_is_told_to_read_attributes():
    def check(item, task):
        return item["verdict"] == "match"  # a dict's way, but item is a Verdict

    def model(call):
        return json.dumps({"items": [{"task_id": t["task_id"], "verdict": "match"}
                                     for t in call.tasks]})

    session = Session(CallableProvider(model, source="m"))
    result = session.run_batch("r", review_tasks(1), Verdict, validator=check,
                               on_exhausted="return")
    (error,) = [e for e in result.errors if e["type"] == "validator_error"]
    assert "'Verdict' object is not subscriptable" in error["message"]
    assert ("the validator gets a Verdict instance, not a dict: read item.verdict, not "
            "item['verdict']") in error["message"]
    session.close()
