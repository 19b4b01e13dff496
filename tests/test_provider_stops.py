"""What the real providers say about a return, or about the whole account, decides what is paid.

Against the loopback server, which answers as the real APIs do (tests/fixtures/recorded/), each
test names the fault that would break its promise.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from batchjson import CallableProvider, ProviderError, Reply, Session, SimulatedModel
from batchjson import _cli as cli_module
from batchjson._acceptance.judge import judge
from batchjson._content.schema import compile_schema
from batchjson._providers._http import http_error
from batchjson._providers.anthropic import AnthropicProvider
from batchjson._providers.openai import OpenAIProvider
from batchjson._providers.reply import received
from batchjson.rlm import bind
from batchjson.testing import HttpFaults, LoopbackServer
from batchjson.testing._bodies import REFUSAL_TEXT
from tests.helpers import IDENTITY, LABEL_SCHEMA, TASKS, answer, items_call, review_tasks
from tests.protocol import recorded
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


# -- a return cut off at the output ceiling --------------------------------------------------
def test_a_truncated_return_that_parses_is_not_committed_nor_asked_again(kind, tmp_path):
    """Fault: the answer is whole JSON, even a whole tool input, but the provider says it was
    cut off at max_tokens (OpenAI finish_reason length, Anthropic stop_reason max_tokens inside
    the forced tool call). Read as text alone it passes every check; committed, a partial answer
    would stand as a success. Repaired or replayed, it is cut off again at the same limit."""
    faults = HttpFaults(script={n: "length_parses" for n in range(1, 20)})
    path = tmp_path / "l.sqlite"
    with LoopbackServer(SimulatedModel(answer=answer), faults=faults, api_key=KEY) as server:
        session = Session(provider_for(kind, server), ledger=path, repairs=2, replays=2)
        result = session.run_batch("r", review_tasks(4), LABEL_SCHEMA, pack=4,
                                   on_exhausted="return")
        assert server.requests == 1  # no repair, no replay into the same limit
        (receipt,) = session.ledger.attempts("r")
        assert receipt.status == "rejected" and receipt.errors[0]["type"] == "truncated"
        assert ("finish_reason: length" if kind == "openai" else "stop_reason: max_tokens") in (
            receipt.errors[0]["message"])
        assert json.loads(receipt.raw)["items"]  # the raw text kept: it parses
        assert result.values == {} and session.ledger.checkpoint("r") == {}
        (failure,) = result.failures
        assert failure["errors"][0]["type"] == "truncated"
        assert "the answer needs more" in failure["errors"][0]["message"]
        assert "raise max_tokens" in failure["errors"][0]["message"]
        assert "split=True" in result.failure_report()
        session.close()

        again = Session(provider_for(kind, server), ledger=path, repairs=2, replays=2)
        rerun = again.run_batch("r", review_tasks(4), LABEL_SCHEMA, pack=4,
                                on_exhausted="return")
        assert server.requests == 1  # a re-run under the same ceiling pays nothing again
        assert rerun.calls == 0 and "earlier return" in rerun.failure_report()
        again.close()


def test_a_truncated_pack_is_split_when_the_run_allows_never_repaired_at_the_same_limit(kind):
    """Fault: the first return of a pack of 4 is cut off. With split=True its halves are asked
    (each fits); a repair of the whole pack under the same ceiling would be paid for
    nothing."""
    faults = HttpFaults(script={1: "length"})
    with LoopbackServer(SimulatedModel(answer=answer), faults=faults, api_key=KEY) as server:
        session = Session(provider_for(kind, server), repairs=2, replays=2)
        result = session.run_batch("r", review_tasks(4), LABEL_SCHEMA, pack=4, split=True)
        sent = server.requests
    assert result.status == "resolved" and len(result.values) == 4
    receipts = session.ledger.attempts("r")
    assert sent == 3 and [r.kind for r in receipts] == ["initial", "split", "split"]
    assert receipts[0].errors[0]["type"] == "truncated" and receipts[0].raw  # raw kept
    assert result.repairs_made == 0


def _served(provider, name: str, **edits):
    """``provider``'s Reply to a recorded response body (tests/fixtures/recorded/), through
    the one boundary, with ``edits`` laid over the body's first choice or the message."""
    body = recorded(name)["body"]
    if "choices" in body:
        body["choices"][0].update(edits)
    else:
        body.update(edits)
    text = json.dumps(body)

    async def post(_body):
        return json.loads(text), text

    provider._post = post
    return received(asyncio.run(provider.complete(items_call())))


def _verdict(reply, schema=None, mode="items"):
    tasks = list(TASKS) if mode == "items" else [{"task_id": "t1", "prompt": "p"}]
    return asyncio.run(judge(reply, tasks, mode=mode, identity=IDENTITY, schema=compile_schema(
        schema or {"type": "object", "properties": {"answer": {"type": "string"}}}),
        validator=None))


WEATHER = {"type": "object", "properties": {"location": {"type": "string"},
                                            "units": {"enum": ["c", "f"]}},
           "required": ["location", "units"]}


def test_a_recorded_tool_call_cut_off_at_max_tokens_is_rejected_though_its_input_parses():
    """anthropic-sdk-python's recorded tool_use message (an_tool_use.json), with the stop
    reason Anthropic documents for a tool call cut off at max_tokens: its input still parses
    and matches the schema, so only the stop reason tells it apart from an answer."""
    provider = AnthropicProvider("claude-haiku-4-5", base_url="http://127.0.0.1:9", api_key=KEY)
    whole = _served(provider, "anthropic/an_tool_use.json")
    assert whole.stop is None and _verdict(whole, WEATHER, "value").accepted  # the control
    cut = _served(provider, "anthropic/an_tool_use.json", stop_reason="max_tokens")
    assert cut.stop == "truncated" and cut.text == whole.text
    verdict = _verdict(cut, WEATHER, "value")
    assert not verdict.accepted and verdict.errors[0]["type"] == "truncated"


@pytest.mark.parametrize(("name", "stop"), [("openai/oa_chat_finish_length.json", "truncated"),
                                            ("openai/oa_chat_refusal.json", "refused"),
                                            ("openai/oa_chat_tool_calls.json", "tool_call")])
def test_recorded_openai_stops_are_rejected_under_their_own_name_with_raw_kept(name, stop):
    """openai-python's recorded completions: cut off (finish_reason length), a refusal
    (message.refusal, content null) and a tool call where text was asked."""
    provider = OpenAIProvider("gpt-4o", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    reply = _served(provider, name)
    message = recorded(name)["body"]["choices"][0]["message"]
    assert reply.stop == stop
    expected = {"truncated": message["content"], "refused": message["refusal"],
                "tool_call": (message.get("tool_calls") or [{}])[0].get("function", {}).get(
                    "arguments")}[stop]
    assert reply.text == expected  # a refusal's text is its raw text
    verdict = _verdict(reply)
    assert not verdict.accepted and verdict.errors[0]["type"] == stop


def test_an_openai_tool_call_whose_arguments_are_a_whole_answer_is_not_committed():
    """Fault: the tool_call fault answers with the whole items object as a function's arguments
    where a text answer was asked; the shape is wrong, so it is rejected (and repaired)."""
    faults = HttpFaults(script={1: "tool_call"})
    with LoopbackServer(SimulatedModel(answer=answer), faults=faults, api_key=KEY) as server:
        session = Session(provider_for("openai", server), repairs=1, replays=0)
        result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, pack=2)
    first = session.ledger.attempts("r")[0]
    assert first.errors[0]["type"] == "tool_call" and json.loads(first.raw)["items"]
    assert result.status == "resolved" and result.repairs_made == 1


# -- a refusal ---------------------------------------------------------------------------------
def test_a_refusal_is_not_asked_again_and_is_named_refused_wherever_the_run_is_read(
        kind, tmp_path, capsys):
    """Fault: the model refuses (OpenAI message.refusal, Anthropic stop_reason refusal). With
    repairs=2, replays=2 a refusal used to be re-asked and paid four more times; it ends its
    request unresolved with reason refused, in the result, the CLI's status and the RLM
    finalization check."""
    path = tmp_path / "l.sqlite"
    faults = HttpFaults(script={1: "refusal"})
    with LoopbackServer(SimulatedModel(answer=answer), faults=faults, api_key=KEY) as server:
        session = Session(provider_for(kind, server), ledger=path, repairs=2, replays=2)
        result = session.run_batch("r", review_tasks(3), LABEL_SCHEMA, pack=3,
                                   on_exhausted="return")
        assert server.requests == 1
        (receipt,) = session.ledger.attempts("r")
        assert receipt.errors[0]["type"] == "refused" and receipt.raw == REFUSAL_TEXT
        assert "refused: the model refused to answer" in result.failure_report()
        namespace: dict = {}
        bind(namespace, session=session)
        (owed,) = namespace["finalization_check"]()
        assert owed["reason"] == "refused"
        session.close()
        assert cli_module.main(["status", "--ledger", str(path)]) == 0
        assert "refused: 1 owed request(s) the model refused" in capsys.readouterr().out

        told = Session(provider_for(kind, server), ledger=path, repairs=2, replays=1)
        again = told.run_batch("r", review_tasks(3), LABEL_SCHEMA, pack=3, reask_refusals=True)
        assert again.status == "resolved" and server.requests == 2  # asked again once, as told
        told.close()


def test_a_truncated_return_is_never_accepted_by_re_judging_it_under_new_rules(tmp_path):
    """Fault: a re-run with a changed validator re-judges earlier returns for free before asking
    again; judged by its text alone, the cut-off return would now be committed."""
    path = tmp_path / "l.sqlite"
    faults = HttpFaults(script={n: "length_parses" for n in range(1, 20)})
    with LoopbackServer(SimulatedModel(answer=answer), faults=faults, api_key=KEY) as server:
        first = Session(provider_for("anthropic", server), ledger=path)
        first.run_batch("r", review_tasks(2), LABEL_SCHEMA, pack=2, on_exhausted="return")
        first.close()

        def lenient(item, task):
            return True

        later = Session(provider_for("anthropic", server), ledger=path)
        result = later.run_batch("r", review_tasks(2), LABEL_SCHEMA, pack=2, validator=lenient,
                                 on_exhausted="return")
        assert result.values == {} and later.ledger.checkpoint("r") == {}
        assert result.rechecked == 0
        later.close()


def test_a_return_that_used_every_output_token_is_taken_as_cut_off_and_not_paid_again(tmp_path):
    """Review F18: a provider of your own (CallableProvider(max_tokens=...)) that says nothing
    of how its answer ended but reports every output token of the ceiling used was cut off;
    its pack was repaired and replayed, and paid again on every re-run, each cut off again."""
    calls = []

    def cut(call):
        calls.append(call.kind)
        return Reply(text='{"items": [{"task_id": "', input_tokens=90, output_tokens=80)

    path = tmp_path / "l.sqlite"
    for _ in range(2):
        session = Session(CallableProvider(cut, source="cut-80", max_tokens=80), ledger=path,
                          repairs=2, replays=2)
        result = session.run_batch("r", review_tasks(2), LABEL_SCHEMA, pack=2,
                                   on_exhausted="return")
        (receipt,) = session.ledger.attempts("r")
        session.close()
        assert calls == ["initial"]  # one call, then neither repaired nor asked on a re-run
        (failure,) = result.failures
        assert "needs more than max_tokens=80 output tokens" in failure["errors"][0]["message"]
    assert receipt.errors[0]["type"] == "truncated"
    assert "all 80 output tokens of max_tokens=80 used" in receipt.errors[0]["message"]


@pytest.mark.parametrize(("status", "headers", "body", "fatal", "retryable"), [
    (429, {"x-should-retry": "false"}, {"error": {"message": "Rate limit reached",
                                                  "code": "rate_limit_exceeded"}}, True, False),
    (429, {"x-should-retry": "true"}, {"error": {"message": "Rate limit reached",
                                                 "code": "rate_limit_exceeded"}}, False, True),
    (400, {}, {"type": "error", "error": {"type": "invalid_request_error", "message":
               "Your credit balance is too low to access the Anthropic API."}}, True, False),
    (500, {"x-should-retry": "false"}, {"error": {"message": "boom"}}, False, False),
])
def test_errors_no_request_can_get_past_stop_the_run_and_others_do_not(status, headers, body,
                                                                        fatal, retryable):
    """The server's own retry advice (x-should-retry, which both official SDKs obey) and the
    providers' out-of-credit words decide: a limit that will not pass by waiting stops the run;
    a one-request failure does not."""
    error = http_error("openai", status, headers, json.dumps(body).encode(), None,
                       "OPENAI_API_KEY")
    assert (error.fatal, error.retryable) == (fatal, retryable)
    assert ("stopped" in str(error)) == fatal
