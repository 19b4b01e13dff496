"""batchjson installs and runs beside alexzhang13/rlm, whose google-genai pins tenacity < 9.2.

The test extras install rlms, so this whole suite (the provider tests included) runs on the
tenacity rlm users get; the backoff batchjson builds from tenacity keeps its schedule there.
"""

from __future__ import annotations

from importlib.metadata import requires, version

import pytest
from packaging.requirements import Requirement
from tenacity import RetryCallState

from batchjson import Ledger
from batchjson._content.keys import Keys
from batchjson._content.schema import compile_schema
from batchjson._errors import ProviderError
from batchjson._replay.plan import Plan, Transport
from batchjson._replay.replay import Replayer


def requirement(package: str, name: str) -> Requirement:
    return next(Requirement(r) for r in requires(package) or ()
                if Requirement(r).name == name and Requirement(r).marker is None)


def test_batchjson_admits_the_tenacity_rlm_pins_and_this_suite_runs_on_it():
    pytest.importorskip("rlm", reason="the rlms package is not installed")
    installed = version("tenacity")
    assert requirement("batchjson", "tenacity").specifier.contains(installed)
    assert requirement("google-genai", "tenacity").specifier.contains(installed)


def backoff(initial: float = 0.5, cap: float = 20.0) -> Replayer:
    plan = Plan(batch_id=1, revision_id=1, mode="value", identity=("task_id",),
                schema=compile_schema({"type": "object"}), validator=None, instructions=None,
                keys=Keys({}), repairs=0, replays=0, split=False)
    return Replayer(plan, Ledger(None), object(), None,
                    Transport(backoff_initial=initial, backoff_max=cap), 1)


def waited(replayer: Replayer, error: ProviderError, failures: int) -> float:
    """The wait the replayer's retry policy sets after ``failures`` failed tries."""
    state = RetryCallState(replayer.retrying, None, (), {})
    state.attempt_number = failures
    state.set_exception((type(error), error, None))
    return replayer.retrying.wait(state)


def test_transport_retries_back_off_exponentially_with_jitter_up_to_the_cap():
    replayer = backoff()
    for failures in range(1, 9):
        base = 0.5 * 2 ** (failures - 1)
        waits = [waited(replayer, ProviderError("503"), failures) for _ in range(200)]
        assert all(min(base, 20.0) <= w <= min(base + 0.5, 20.0) for w in waits)
        if base + 0.5 < 20.0:
            assert max(waits) - min(waits) > 0.1  # jittered, so retries do not move in step
    assert waited(replayer, ProviderError("429", retry_after=3.0), 1) == 3.0
    assert waited(replayer, ProviderError("429", retry_after=600.0), 1) == 20.0
