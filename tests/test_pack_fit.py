"""Packs that fit: a request whose answer cannot fit the call's max_tokens is refused before
anything is sent, naming the pack size that fits."""

from __future__ import annotations

import json
import re

import pytest

from batchjson import CallableProvider, InvalidBatch, Reply, Session
from batchjson._providers.anthropic import AnthropicProvider
from batchjson._session.spec import output_tokens_floor
from batchjson.testing import LoopbackServer
from tests.helpers import items_reply

SCHEMA = {"type": "object", "required": ["verdict", "stars"],
          "properties": {"verdict": {"enum": ["match", "no_match"]},
                         "stars": {"type": "integer", "minimum": 1, "maximum": 5}}}


def reviews(n: int) -> list[dict]:
    return [{"task_id": f"review-{i:05d}", "case_id": f"product-{i % 50:03d}",
             "prompt": f"Is review {i} about the product it names?"} for i in range(n)]


def answers(call) -> str:
    return json.dumps({"items": [{"task_id": t["task_id"], "case_id": t["case_id"],
                                  "verdict": "match", "stars": 4} for t in call.tasks]})


class Counting:
    def __init__(self, respond=answers) -> None:
        self.respond, self.calls = respond, 0

    def __call__(self, call):
        self.calls += 1
        return self.respond(call)


def fitting_pack(message: str) -> int:
    return int(re.search(r"Use pack (\d+) or less", message).group(1))


def test_a_pack_past_max_tokens_is_refused_before_any_call_naming_the_pack_that_fits():
    model = Counting()
    session = Session(CallableProvider(model, source="m", max_tokens=4096))
    with pytest.raises(InvalidBatch) as caught:
        session.run_batch("reviews", reviews(2000), SCHEMA, pack=2000,
                          identity="task_id,case_id")
    message = str(caught.value)
    assert "pack 2000 cannot fit the provider's max_tokens=4,096" in message
    assert "identity echoes included" in message and "nothing was sent" in message
    assert model.calls == 0 and session.ledger.batch_names() == []
    fits = fitting_pack(message)
    assert 100 < fits < 2000
    result = session.run_batch("reviews", reviews(2000), SCHEMA, pack=fits,
                               identity="task_id,case_id")
    assert result.status == "resolved" and model.calls == -(-2000 // fits)
    session.close()


def test_the_smallest_answer_counts_every_identity_echo_a_pack_carries():
    """The same pack fits when only task_id is echoed and not when case_id is echoed too."""
    session = Session(CallableProvider(Counting(), source="m", max_tokens=4000))
    pack = 220
    session.run_batch("short", reviews(pack), SCHEMA, pack=pack)  # task_id only: fits
    with pytest.raises(InvalidBatch, match=f"pack {pack} cannot fit"):
        session.run_batch("long", reviews(pack), SCHEMA, pack=pack, identity="task_id,case_id")
    session.close()


def test_against_a_real_http_provider_nothing_reaches_the_server():
    with LoopbackServer() as server:
        provider = AnthropicProvider("claude-haiku-4-5", base_url=server.anthropic_base_url,
                                     api_key="k", max_tokens=4096)
        session = Session(provider)
        with pytest.raises(InvalidBatch, match=r"Use pack \d+ or less"):
            session.run_batch("reviews", reviews(2000), SCHEMA, pack=2000)
        session.close()
        assert server.requests == 0


def test_output_measured_in_the_ledger_refuses_a_pack_the_schema_alone_would_let_through():
    def wordy(call):  # a real model writes more than the least the schema asks
        return Reply(answers(call), input_tokens=50, output_tokens=200 * len(call.tasks) + 3)

    model = Counting(wordy)
    session = Session(CallableProvider(model, source="m", max_tokens=4096))
    session.run_batch("reviews", reviews(10), SCHEMA, pack=2)
    calls = model.calls
    with pytest.raises(InvalidBatch) as caught:
        session.run_batch("reviews", reviews(60), SCHEMA, pack=60)
    message = str(caught.value)
    assert "accepted returns took at least 200.0 output tokens per item" in message
    assert fitting_pack(message) == (4096 - 3) // 200 and model.calls == calls
    session.close()


def test_a_provider_that_sends_no_max_tokens_is_not_held_to_one():
    model = Counting()
    session = Session(CallableProvider(model, source="m"))
    result = session.run_batch("reviews", reviews(600), SCHEMA, pack=600)
    assert result.status == "resolved" and model.calls == 1
    session.close()


def test_even_one_task_too_long_says_to_raise_max_tokens():
    session = Session(CallableProvider(items_reply, source="m", max_tokens=5))
    with pytest.raises(InvalidBatch, match="even one task cannot fit.*Raise max_tokens"):
        session.run_batch("reviews", reviews(3), SCHEMA)
    session.close()


@pytest.mark.parametrize(("text", "pieces"), [
    ('{"items":[]}', 3),  # {" items ":[]}
    ('{"task_id":"t1"}', 7),  # {" task _id ":" t 1 "}
    ('{"items":[{"task_id":"t1"},{"task_id":"t2"}]}', 15),
    ("1234567", 3),  # digits go three at a time
    ("it's done", 2),
])
def test_the_output_estimate_counts_pieces_no_token_spans(text: str, pieces: int):
    assert output_tokens_floor(text) == pieces
