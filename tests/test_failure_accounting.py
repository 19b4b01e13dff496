"""A call that failed after the provider billed it is counted where the ledger counts it: the
run's tokens and cost are the sum of its receipts, its own figures read as a reply's are (an
unreadable count or cost is unknown, never a crash or a zero)."""

from __future__ import annotations

import math

import pytest

from batchjson import CallableProvider, ProviderError, Reply, Session
from tests.helpers import LABEL_SCHEMA, items_reply, ledger_rows, review_tasks


def _run(tmp_path, usage, price=None):
    def model(call):
        if call.tasks[0]["task_id"].endswith("127"):  # answered, then the connection failed
            raise ProviderError("upstream 502 after generation", retryable=False, status=502,
                                usage=usage)
        return Reply(text=items_reply(call), input_tokens=100, output_tokens=50, cost=0.002)

    session = Session(CallableProvider(model, source="m", price=price),
                      ledger=tmp_path / "l.sqlite", repairs=0, replays=0)
    result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    spent = session.ledger.spend("r")
    session.close()
    receipts = ledger_rows(tmp_path / "l.sqlite",
                           "SELECT status, input_tokens, output_tokens, cost FROM attempts")
    return result, spent, receipts


@pytest.mark.parametrize("usage", [{"input_tokens": 100, "output_tokens": 50, "cost": 0.002},
                                   {"cost": 0.002}])
def test_a_billed_failure_counts_its_own_cost_in_the_run_as_in_the_ledger(tmp_path, usage):
    """Faults: the failure's tokens or cost left out of the run's totals, or its cost made
    unknown (None) because the run has no price of its own, though the provider said it."""
    result, spent, receipts = _run(tmp_path, usage)
    assert sorted(r[0] for r in receipts) == ["accepted", "provider_error"]
    assert result.tokens == sum((r[1] or 0) + (r[2] or 0) for r in receipts)
    assert result.cost == pytest.approx(0.004) == spent["cost"]


def test_a_failure_billed_in_tokens_at_no_cost_it_says_leaves_the_runs_cost_unknown(tmp_path):
    """As a reply without a cost does, and as its receipt says: unknown. Fault: the run
    pricing it itself, so that its cost and the ledger's account disagree."""
    result, spent, receipts = _run(tmp_path, {"input_tokens": 100, "output_tokens": 50},
                                   price={"input": 10, "output": 30})  # the run's own prices
    assert result.tokens == 300 and result.cost is None
    assert ("provider_error", 100, 50, None) in receipts and spent["unknown_cost_calls"] == 1


@pytest.mark.parametrize("usage", [{"input_tokens": "lots", "output_tokens": math.nan,
                                    "cost": "cheap"}, {"cost": -1.0}, "not a mapping"])
def test_a_failures_unreadable_usage_is_unknown_never_a_crash(tmp_path, usage):
    """A glue provider's error with usage no reader can take: the run ends as it would without
    it, the failure kept with no tokens. Fault: the run crashing on the figures, or the ledger
    storing them as given."""
    result, _, receipts = _run(tmp_path, usage)
    assert result.tokens == 150  # the answer's alone
    assert ("provider_error", None, None, None) in receipts
