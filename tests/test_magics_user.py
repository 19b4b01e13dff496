"""A new user's first notebook, in a real InteractiveShell: a batch name never replaces their
data, --help works on every magic, typos get the right spelling, asserts reject, forgetting."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("IPython")

from tests.test_magics import BODY, calls_recorded, loaded, ok, run, usage_error  # noqa: E402

__all__ = ["loaded"]  # the fixture, shared with test_magics

REVIEWS = """
reviews = [{"task_id": f"r{i}", "product_id": f"p{i % 3}", "prompt": f"review {i}"}
           for i in range(6)]
schema = {"type": "object", "properties": {"verdict": {"type": "string"}},
          "required": ["verdict"]}
"""


# -- a name never overwrites data ------------------------------------------------------------
@pytest.mark.parametrize("header", ["%%batch_json reviews --tasks reviews",
                                    "%%batch_json labels --tasks reviews --out reviews"])
def test_a_result_variable_holding_user_data_is_refused_and_left_untouched(
        loaded: Any, capsys: Any, header: str) -> None:
    ip = loaded
    ok(ip, REVIEWS)
    data = ip.user_ns["reviews"]
    line = usage_error(ip, header + "\nran = True\n", capsys)
    assert "`reviews` holds a list of 6 item(s)" in line and "Nothing was run" in line
    assert ("choose another --out VAR" in line if "--out" in header else
            "give the batch another name (%%batch_json reviews_results)" in line)
    assert ip.user_ns["reviews"] is data and len(data) == 6 and "ran" not in ip.user_ns
    assert calls_recorded(ip) == 0


def test_a_result_variable_the_body_fills_with_data_is_refused_before_any_call(
        loaded: Any, capsys: Any) -> None:
    ip = loaded
    line = usage_error(ip, "%%batch_json labels\n" + BODY + "labels = ['mine']\n", capsys)
    assert "`labels` holds a list of 1 item(s)" in line
    assert ip.user_ns["labels"] == ["mine"] and calls_recorded(ip) == 0


@pytest.mark.parametrize("header", ["%%batch_json sorted", "%%batch_json labels --out len",
                                    "%%batch_json print", "%%batch_json list",
                                    "%%batch_json filter", "%%batch_json id",
                                    "%%batch_json labels --out type", "%%batch_json display"])
def test_a_result_variable_that_would_shadow_a_builtin_is_refused_before_any_call(
        loaded: Any, capsys: Any, header: str) -> None:
    """The body's next run would call the result (``sorted(records)`` on a BatchResult)."""
    ip = loaded
    var = header.split()[-1]
    line = usage_error(ip, header + "\nran = True\n" + BODY, capsys)
    assert line.startswith(f"UsageError: `{var}` is a Python builtin, which the result of batch ")
    assert ("choose another --out VAR" in line if "--out" in header else
            f"give the batch another name (%%batch_json {var}_results)" in line)
    assert line.endswith(f"Nothing was run and `{var}` is unchanged")
    assert var not in ip.user_ns and "ran" not in ip.user_ns and calls_recorded(ip) == 0
    ok(ip, f"%%batch_json {var}_results\n" + BODY)  # the advised name works


def test_a_batch_named_like_a_builtin_can_be_rerun_because_it_was_never_bound(
        loaded: Any, capsys: Any) -> None:
    ip = loaded
    cell = ("%%batch_json sorted_results\nrecords = ['b', 'a']\n"
            "tasks = [{'task_id': r, 'prompt': r} for r in sorted(records)]\n"
            "schema = {'type': 'object'}\n")
    usage_error(ip, cell.replace("sorted_results", "sorted"), capsys)
    for _ in range(2):
        ok(ip, cell)
    assert ok(ip, "sorted([2, 1])") == [1, 2]


def test_an_earlier_result_may_be_replaced(loaded: Any) -> None:
    ip = loaded
    ok(ip, "%%batch_json labels\n" + BODY)
    ok(ip, "%%batch_json labels\n" + BODY.replace("range(4)", "range(5)"))
    assert ok(ip, "labels.total_tasks") == 5


# -- --help on every magic -------------------------------------------------------------------
@pytest.mark.parametrize(("line", "usage"), [
    ("%%batch_json --help\nran = True\n", "usage: %%batch_json [--tasks EXPR]"),
    ("%%batch_json labels -h\nran = True\n", "usage: %%batch_json [--tasks EXPR]"),
    ("%batch_status --help", "usage: %batch_status [name]"),
    ("%validators --help", "usage: %validators"),
    ("%batch_receipts --help", "usage: %batch_receipts [--failed]"),
    ("%batch_forget --help", "usage: %batch_forget name"),
])
def test_help_on_every_magic_prints_its_usage_and_runs_nothing(
        loaded: Any, capsys: Any, line: str, usage: str) -> None:
    capsys.readouterr()
    result = run(loaded, line)
    assert result.success and result.result is None
    out = capsys.readouterr().out
    assert out.startswith(usage) and "--help" not in out.split("\n")[0][len(usage):]
    assert "ran" not in loaded.user_ns and calls_recorded(loaded) == 0


# -- typos -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("line", "expected"), [
    ("%%batch_json labels --identiy task_id\n" + BODY,
     "UsageError: unknown option --identiy (did you mean --identity?)"),
    ("%%batch_json labels --packs 5\n" + BODY,
     "UsageError: unknown option --packs (did you mean --pack?)"),
    ("%%batch_json labels --replys 3\n" + BODY,
     "UsageError: unknown option --replys (did you mean --replays?)"),
    ("%batch_receipts labels --faild", "UsageError: unknown option --faild (did you mean "
     "--failed?)"),
])
def test_a_mistyped_option_names_the_real_one(loaded: Any, capsys: Any, line: str,
                                              expected: str) -> None:
    assert usage_error(loaded, line, capsys) == expected
    assert calls_recorded(loaded) == 0


@pytest.mark.parametrize("written", ["task_id, product_id", "task_id ,product_id"])
def test_identity_fields_split_by_a_space_get_the_corrected_spelling(
        loaded: Any, capsys: Any, written: str) -> None:
    ip = loaded
    ok(ip, REVIEWS)
    line = usage_error(ip, f"%%batch_json labels --tasks reviews --identity {written}\n",
                       capsys)
    assert line.endswith("write --identity task_id,product_id"), line
    assert "a space ends the option" in line and calls_recorded(ip) == 0


def test_identity_given_with_an_equals_sign_and_a_space_gets_the_corrected_spelling(
        loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, REVIEWS)
    line = usage_error(ip, "%%batch_json labels --tasks reviews --identity=task_id, product_id\n",
                       capsys)
    assert line.endswith("write --identity task_id,product_id"), line
    assert "EXPR" not in line and calls_recorded(ip) == 0


def test_a_value_given_to_a_flag_says_the_flag_takes_none(loaded: Any, capsys: Any) -> None:
    line = usage_error(loaded, "%%batch_json labels --split yes\nran = True\n" + BODY, capsys)
    assert line == ("UsageError: --split is a flag and takes no value, so 'yes' was not read; "
                    "write --split alone to turn it on, or leave it out")
    assert "ran" not in loaded.user_ns and calls_recorded(loaded) == 0


def test_an_unclosed_quote_in_a_line_magic_is_told_to_close_it_not_to_use_a_cell_body(
        loaded: Any, capsys: Any) -> None:
    line = usage_error(loaded, "%batch_forget 'unclosed", capsys)
    assert line.endswith("(a quote is opened and never closed); close the quote"), line
    line = usage_error(loaded, "%%batch_json labels --instructions 'abc\n" + BODY, capsys)
    assert line.endswith("close the quote, or build the value in the cell body and pass its "
                         "name"), line


def test_h_as_the_value_of_an_option_is_that_value_not_a_request_for_help(
        loaded: Any, capsys: Any) -> None:
    """``-h`` asks for help only where it is an option: after --instructions it is the EXPR
    ``-h`` (minus the variable h), evaluated like any other."""
    ip = loaded
    ok(ip, "h = -1")
    capsys.readouterr()
    line = usage_error(ip, "%%batch_json labels --instructions -h\n" + BODY, capsys)
    assert line == ("UsageError: instructions must be a string, e.g. instructions='Answer in "
                    "English.'; got 1")  # -h was read as the EXPR, and -(-1) is no string
    ok(ip, '%%batch_json labels --instructions "-h"\n' + BODY)  # the string itself
    assert "usage:" not in capsys.readouterr().out
    assert ok(ip, "labels.resolved")


# -- asserts reject, and are repaired --------------------------------------------------------
def test_an_assert_in_a_validator_rejects_the_return_and_the_repair_is_accepted(
        loaded: Any) -> None:
    ip = loaded
    ok(ip, """
import json
from batchjson import CallableProvider
prompts = []
def stars(call):
    prompts.append(call.prompt)
    score = 4 if call.kind == "repair" else 0  # the first answer breaks the rule
    return json.dumps({"items": [{"task_id": t["task_id"], "stars": score}
                                 for t in call.tasks]})
model = CallableProvider(stars, source="stars-v1")
""")
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, """%%batch_json rated --pack 2 --validator check
tasks = [{"task_id": f"t{i}", "prompt": f"rate {i}"} for i in range(2)]
schema = {"type": "object", "properties": {"stars": {"type": "integer"}},
          "required": ["stars"]}
def check(item, task):
    assert item["stars"] >= 1, "stars must be 1 to 5"
""")
    assert ok(ip, "rated.status") == "resolved" and ok(ip, "rated.repairs_made") == 1
    receipts = ok(ip, "batch_session.ledger.attempts('rated')")
    assert [(r.kind, r.status) for r in receipts] == [("initial", "rejected"),
                                                      ("repair", "accepted")]
    assert {e["type"] for e in receipts[0].errors} == {"validation"}
    assert "stars must be 1 to 5" in receipts[0].errors[0]["message"]
    assert "stars must be 1 to 5" in ok(ip, "prompts[1]")  # the repair was told the rule


# -- only the validator is a validator --------------------------------------------------------
def test_helper_functions_of_the_body_are_not_recorded_as_validators(loaded: Any) -> None:
    """Functions that only build the tasks never reach the ledger's validators or
    %validators; the function passed as --validator does, under its variable name."""
    ip = loaded
    body = BODY.replace("tasks = [", "def make(i):\n    return {'task_id': f't{i}', "
                        "'prompt': 'p'}\nmk = lambda i: make(i)\ntasks = [mk(i) for i in "
                        "range(3)]\nunused = [")
    for header in ("%%batch_json labels", "%%batch_json labels --validator check"):
        ok(ip, header + "\n" + body)
    session = ip.user_ns["batch_session"]
    assert [v.name for v in session.validators] == ["check"]
    assert [r["name"] for r in session.ledger.validator_usage()] == ["check"]
    assert [row[0] for row in ok(ip, "%validators").rows] == ["check"]


# -- forgetting ------------------------------------------------------------------------------
def test_forget_stops_a_failing_batch_owing_and_a_rerun_owes_again(
        loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(malformed_json=1.0)")
    cell = "%%batch_json labels --pack 2 --repairs 0 --replays 0\n" + BODY
    assert run(ip, cell).error_in_exec is not None  # unresolved
    assert ok(ip, "%batch_status")["minimum_exact_retry_calls"] == 2
    calls = calls_recorded(ip)
    capsys.readouterr()
    ok(ip, "%batch_forget labels")
    said = capsys.readouterr().out
    assert said.startswith("batchjson: forgot batch 'labels': revision(s) 1 no longer owe 2 "
                           "request(s) (4 item(s)); recorded as forgotten by ")
    status = ok(ip, "%batch_status")
    assert status["minimum_exact_retry_calls"] == 0 and calls_recorded(ip) == calls
    assert "forgotten" in repr(status) and "via %batch_forget" in repr(status)
    assert run(ip, cell).error_in_exec is not None  # the same cell again: owed again
    assert ok(ip, "%batch_status")["minimum_exact_retry_calls"] == 2
    assert "no batch named 'nope'" in usage_error(ip, "%batch_forget nope", capsys)


# -- smaller things --------------------------------------------------------------------------
def test_config_shows_the_provider_as_what_it_is(loaded: Any, capsys: Any) -> None:
    capsys.readouterr()
    ok(loaded, "%config BatchJson")
    out = capsys.readouterr().out
    assert "Current: SimulatedModel(model='simulated-1', answer=<lambda>, seed=0)" in out
    assert "object at 0x" not in out


def test_validators_defined_in_a_kernel_that_is_gone_say_so(loaded: Any) -> None:
    ip = loaded
    ledger = ip.user_ns["batch_session"].ledger
    ledger.store.number_validator("old_check", "f" * 64, "2629222579.py:3")  # ipykernel's cell file
    ledger.store.number_validator("older_check", "e" * 64, "<ipython-input-8-40d3b0035d30>:2")
    ledger.store.number_validator("helper", "d" * 64, "rules.py:10")  # a module: shown as it is
    rows = {r[0]: r[3] for r in ok(ip, "%validators").rows}
    assert rows == {"old_check": "an earlier kernel, line 3",
                    "older_check": "an earlier kernel, line 2", "helper": "rules.py:10"}


def test_a_pack_past_max_tokens_is_one_usage_error_naming_the_pack_that_fits(
        loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model = CallableProvider(lambda call: '', source='m', max_tokens=4096)")
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, REVIEWS.replace("range(6)", "range(2000)"))
    line = usage_error(ip, "%%batch_json labels --tasks reviews --pack 2000\n", capsys)
    assert "pack 2000 cannot fit the provider's max_tokens=4,096" in line
    assert "--pack " in line and calls_recorded(ip) == 0


def test_a_validator_indexing_a_pydantic_item_fails_the_cell_saying_read_attributes(
        loaded: Any) -> None:
    ip = loaded
    ok(ip, "model.answer = lambda task: {'verdict': 'match'}")
    result = run(ip, """%%batch_json labels --validator check
from typing import Literal
from pydantic import BaseModel
class Verdict(BaseModel):
    verdict: Literal["match", "no_match"]
schema = Verdict
tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(2)]
def check(item, task):
    if item["verdict"] != "match":
        raise ValueError("no")
""")
    shown = "\n".join(result.error_in_exec._render_traceback_())
    assert "The validator itself failed" in shown
    assert "read item.verdict, not item['verdict']" in shown
