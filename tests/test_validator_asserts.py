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


UNDER_O = '''
import json, sqlite3, sys
from batchjson import CallableProvider, InvalidBatch, Session
from batchjson.rlm import bind

def check_with_assert(item, task):
    assert item["verdict"] == "match", "only matches"

def check_with_raise(item, task):
    if item["verdict"] != "match":
        raise ValueError("only matches")

class Checker:
    def __call__(self, item, task):
        def inner():
            assert item["verdict"] == "match"
        inner()

def model(call):
    return json.dumps({"items": [{"task_id": t["task_id"], "verdict": "no_match"}
                                 for t in call.tasks]})

ledger = sys.argv[1]
session = Session(CallableProvider(model, source="m"), ledger=ledger)
tasks = [{"task_id": "t0", "prompt": "p"}]
schema = {"type": "object", "properties": {"verdict": {"type": "string"}}}
refusals = []
for check in (check_with_assert, Checker()):
    try:
        session.run_batch("b", tasks, schema, validator=check)
    except InvalidBatch as exc:
        refusals.append(str(exc))
namespace = {}
bind(namespace, CallableProvider(model, source="m"), ledger=ledger + ".rlm")
try:
    namespace["llm_batch_json"](["p"], {"type": "object"},
                                validator=lambda value, index: None)  # no assert: runs
    namespace["llm_batch_json"](["p"], {"type": "object"}, validator=check_with_assert)
except InvalidBatch as exc:
    refusals.append(str(exc))
plain = session.run_batch("c", tasks, schema, validator=check_with_raise, repairs=0,
                          replays=0, on_exhausted="return")
session.close()
db = sqlite3.connect(ledger)
print(json.dumps({"refusals": refusals, "plain": plain.status,
                  "calls": db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0],
                  "validators": [r[0] for r in db.execute("SELECT name FROM validators")]}))
'''


def test_under_python_O_a_validator_that_checks_with_assert_is_refused_before_any_call(
        tmp_path):
    """-O removes every assert, so such a validator would accept every item silently."""
    import subprocess
    import sys

    script = tmp_path / "run_under_o.py"
    script.write_text(UNDER_O)
    done = subprocess.run([sys.executable, "-O", str(script), str(tmp_path / "l.sqlite")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["refusals"]) == 3, report
    for refusal in report["refusals"]:
        assert "checks with assert, and this Python runs with -O" in refusal
        assert "Raise ValueError instead" in refusal
    # only the validator without asserts ran (its one call), and none was registered before
    assert report["plain"] == "unresolved" and report["calls"] == 1
    assert report["validators"] == ["check_with_raise"]
