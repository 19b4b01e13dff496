"""What the real providers say about a return, or about the whole account, decides what is paid.

Against the loopback server, which answers as the real APIs do (tests/fixtures/recorded/), each
test names the fault that would break its promise.
"""

from __future__ import annotations

import pytest

from batchjson import ProviderError, Session, SimulatedModel
from batchjson.testing import HttpFaults, LoopbackServer
from tests.helpers import LABEL_SCHEMA, answer, review_tasks
from tests.test_providers_e2e import KEY, provider_for


@pytest.fixture(params=["openai", "anthropic"])
def kind(request):
    return request.param


@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_account_out_of_credit_stops_the_run_with_one_error(kind, concurrency):
    """Fault: insufficient_quota (429 with x-should-retry: false; Anthropic's 400) answered to
    every request. Retrying it, or sending each request in turn, pays nothing but floods the
    API and buries the one fix under a screen of identical errors."""
    faults = HttpFaults(script={n: "insufficient_quota" for n in range(1, 50)})
    with LoopbackServer(SimulatedModel(answer=answer), faults=faults, api_key=KEY) as server:
        session = Session(provider_for(kind, server), repairs=2, replays=2,
                          transport_retries=5, concurrency=concurrency)
        session.transport.backoff_initial = 0.01
        with pytest.raises(ProviderError) as caught:
            session.run_batch("r", review_tasks(12), LABEL_SCHEMA, pack=1)
        sent = server.requests
    assert sent <= concurrency  # only the calls already in flight when the first answer came
    assert "billing" in str(caught.value) and "stopped" in str(caught.value)
    assert not caught.value.retryable
