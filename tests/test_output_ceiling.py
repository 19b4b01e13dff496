"""Each call asks for the output its answer can take (``max_completion_tokens`` / ``max_tokens``),
so a provider's limiter counts what the answer needs, and the pacer counts the same: sized from
the schema's largest answer and the pack, the user's own ceiling winning, a generous bound for an
unbounded answer and a reasoning model. The sized ceiling is no part of any key."""

from __future__ import annotations

from batchjson import AnthropicProvider, OpenAIProvider, Session
from batchjson._content.keys import answer_source
from batchjson._providers.settings import (
    REASONING_TOKENS,
    UNBOUNDED_ANSWER_TOKENS,
    call_output_cap,
    sized_output_cap,
)
from batchjson.testing import LoopbackServer
from batchjson.testing._ratelimits import UNASKED_OUTPUT_TOKENS
from tests.helpers import anthropic, items_call, openai

LABELS = {"type": "object", "properties": {"label": {"enum": ["positive", "negative", "mixed"]}},
          "required": ["label"]}
FREE_TEXT = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
KEY = "sk-test-0123456789abcdef0123"


def asked(srv: LoopbackServer) -> dict:
    body = srv.last_body or {}
    return {k: body[k] for k in ("max_tokens", "max_completion_tokens") if k in body}


def tasks(n: int) -> list[dict]:
    return [{"task_id": f"t{i}", "prompt": f"Review {i}: fine."} for i in range(n)]


def test_a_call_asks_for_the_tokens_its_largest_answer_can_take() -> None:
    with LoopbackServer() as srv:
        session = Session(openai(srv), ledger=":memory:")
        assert session.run_batch("one", tasks(1), LABELS).status == "resolved"
        one = asked(srv)["max_tokens"]  # a compatible server: the name every one knows
        assert session.run_batch("eight", tasks(8), LABELS, pack=8).status == "resolved"
        eight = asked(srv)["max_tokens"]
    # {"items":[{"task_id":"t0","label":"positive"}]}: 47 characters at most (48 counted)
    assert one == sized_output_cap(48) < UNASKED_OUTPUT_TOKENS
    assert one < eight < 8 * one  # the envelope and the margin are counted once


def test_the_users_own_ceiling_wins() -> None:
    with LoopbackServer() as srv:
        Session(openai(srv, extra_body={"max_completion_tokens": 300}),
                ledger=":memory:").run_batch("own", tasks(1), LABELS)
        assert asked(srv) == {"max_completion_tokens": 300}
        Session(anthropic(srv, max_tokens=700), ledger=":memory:").run_batch("a", tasks(1), LABELS)
        assert asked(srv) == {"max_tokens": 700}
        Session(anthropic(srv), ledger=":memory:").run_batch("sized", tasks(1), LABELS)
        assert asked(srv) == {"max_tokens": sized_output_cap(48)}


def test_an_unbounded_answer_and_a_reasoning_model_get_the_documented_generous_bound() -> None:
    call = items_call(FREE_TEXT)
    official = OpenAIProvider("gpt-4o-mini", base_url="https://api.openai.com/v1", api_key=KEY)
    reasoning = OpenAIProvider("o4-mini", base_url="https://api.openai.com/v1", api_key=KEY)
    assert official.request_body(call)[0]["max_completion_tokens"] == UNBOUNDED_ANSWER_TOKENS
    assert reasoning.request_body(call)[0]["max_completion_tokens"] == (
        UNBOUNDED_ANSWER_TOKENS + REASONING_TOKENS)
    # a bounded answer on a reasoning model still leaves room for its reasoning
    assert reasoning.sized_output(60) == sized_output_cap(60) + REASONING_TOKENS
    # a compatible server's context may be smaller than the bound: nothing is asked
    local = OpenAIProvider("llama", base_url="http://127.0.0.1:9/v1", api_key="")
    assert "max_tokens" not in local.request_body(call)[0]
    assert call_output_cap(local, None) is None
    claude = AnthropicProvider("claude-haiku-4-5", api_key=KEY)
    assert claude.request_body(call)[0]["max_tokens"] == UNBOUNDED_ANSWER_TOKENS
    thinking = AnthropicProvider("claude-sonnet-4-5", api_key=KEY,
                                 extra_body={"thinking": {"type": "enabled",
                                                          "budget_tokens": 2048}})
    assert thinking.sized_output(48) == UNBOUNDED_ANSWER_TOKENS  # the budget must fit under it


def test_a_sized_ceiling_moves_no_key() -> None:
    """Answer sources as the batchjson before sized ceilings composed them: every stored
    answer is still found by its key."""
    providers = {
        "batchjson.OpenAIProvider:e004a730f5a3056cff9dbbd0250569805802670461b70fbc28414aa5cd6aaafe":
            OpenAIProvider("gpt-4o-mini", base_url="https://api.openai.com/v1",
                           api_key="sk-test-0123456789abcdef0123"),
        "batchjson.OpenAIProvider:907defdc8e5e9a01123cf982481452d0de8067e8f89d1a54ab7963ac47964f50":
            OpenAIProvider("o3-mini", base_url="http://127.0.0.1:9/v1", api_key=""),
        "batchjson.AnthropicProvider:8a265037b60a2aaacd1da28a4a28ed2d679f52300c8d8aefc4ee35161dab"
        "38e9": AnthropicProvider("claude-haiku-4-5", api_key="sk-ant-test-0123456789abcdef0123"),
    }
    for source, provider in providers.items():
        assert answer_source(provider) == source


def test_a_rerun_after_sizing_reuses_every_stored_answer() -> None:
    with LoopbackServer() as srv:
        session = Session(openai(srv), ledger=":memory:")
        session.run_batch("again", tasks(4), LABELS)
        calls = srv.requests
        again = session.run_batch("again", tasks(4), LABELS)
    assert again.status == "resolved" and srv.requests == calls
