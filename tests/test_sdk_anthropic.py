"""The official ``anthropic`` SDK as a client of the loopback server: whatever it cannot parse, or
parses into something the real API never sends, is a dialect of ours."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import pytest
from pydantic import BaseModel, Field

from batchjson.testing import HttpFaults, LoopbackServer
from tests.protocol import ANTHROPIC_LIMIT_HEADERS, ANTHROPIC_REQUEST_ID, RFC3339, Sleeps

QUESTION = [{"role": "user", "content": "What's the weather in SF in Celsius?"}]
BASE58_ID = r"[1-9A-HJ-NP-Za-km-z]{22}"


class GetWeather(BaseModel):
    location: str
    units: Literal["c", "f"]


class Order(BaseModel):
    items: list[GetWeather] = Field(min_length=2, max_length=6)
    total: float


class Line(BaseModel):
    product: str
    quantity: int


class Receipt(BaseModel):
    """Only keywords every SDK version sends as schema: the SDK moves those Anthropic does not
    enforce (enum before 1.x, minItems/maxItems) into descriptions, which the server cannot
    read."""

    lines: list[Line]
    total: float
    paid: bool


WEATHER_TOOL = {"name": "get_weather", "description": "Look up the weather",
                "input_schema": GetWeather.model_json_schema()}
FORCED = {"type": "tool", "name": "get_weather"}
ORDER_TOOL = {"name": "record", "input_schema": Order.model_json_schema()}


def client(srv: LoopbackServer, retries: int = 0) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.anthropic_base_url, api_key="sk-ant-test",
                               max_retries=retries)


def ask(srv: LoopbackServer, retries: int = 0, **extra):
    body = {"model": "claude-haiku-4-5", "max_tokens": 1024, "messages": QUESTION, **extra}
    return client(srv, retries).messages.with_raw_response.create(**body)


def test_a_forced_tool_is_called_with_input_that_validates() -> None:
    import re

    with LoopbackServer() as srv:
        raw = ask(srv, tools=[WEATHER_TOOL], tool_choice=FORCED)
    message = raw.parse()
    assert isinstance(message, anthropic.types.Message)
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    assert re.fullmatch("msg_01" + BASE58_ID, message.id) and message.type == "message"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert re.fullmatch("toolu_01" + BASE58_ID, block.id)
    GetWeather.model_validate(block.input)
    usage = json.loads(raw.http_response.text)["usage"]
    assert set(usage) >= {"input_tokens", "output_tokens", "cache_creation_input_tokens",
                          "cache_read_input_tokens", "cache_creation", "service_tier"}
    assert ANTHROPIC_REQUEST_ID.fullmatch(raw.headers["request-id"])
    assert message._request_id == raw.headers["request-id"]
    assert all(name in raw.headers for name in ANTHROPIC_LIMIT_HEADERS)
    assert RFC3339.fullmatch(raw.headers["anthropic-ratelimit-requests-reset"])


def test_a_text_answer_and_a_structured_output_answer() -> None:
    with LoopbackServer() as srv:
        text = ask(srv).parse()
        parsed = client(srv).messages.parse(model="claude-sonnet-4-5", max_tokens=1024,
                                            messages=QUESTION, output_format=Receipt)
        sent = srv.last_body["output_config"]["format"]
    assert text.stop_reason == "end_turn" and text.content[0].type == "text"
    assert sent["type"] == "json_schema"
    assert parsed.stop_reason == "end_turn" and isinstance(parsed.parsed_output, Receipt)


def test_max_tokens_can_stop_inside_a_tool_call_whose_input_still_parses() -> None:
    faults = HttpFaults(script={1: "length", 2: "length_parses"})
    with LoopbackServer(faults=faults) as srv:
        cut, whole = (ask(srv, tools=[ORDER_TOOL], tool_choice={"type": "tool",
                                                                "name": "record"}).parse()
                      for _ in range(2))
    for message in (cut, whole):
        assert message.stop_reason == "max_tokens"
        (block,) = message.content
        assert block.type == "tool_use" and isinstance(block.input, dict)
    with pytest.raises(ValueError):  # cut half way: the partial input is missing parts
        Order.model_validate(cut.content[0].input)
    Order.model_validate(whole.content[0].input)  # the defect issue 22 names: it validates


def test_the_requests_max_tokens_cuts_a_text_answer() -> None:
    with LoopbackServer() as srv:
        message = ask(srv, max_tokens=3, extra_body={"output_config": {"format": {
            "type": "json_schema", "schema": Order.model_json_schema()}}}).parse()
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    assert len(message.content[0].text) == 12


def test_a_refusal_and_text_where_a_tool_was_forced() -> None:
    with LoopbackServer(faults=HttpFaults(script={1: "refusal", 2: "text_reply"})) as srv:
        refused, text = (ask(srv, tools=[WEATHER_TOOL], tool_choice=FORCED).parse()
                         for _ in range(2))
    assert refused.stop_reason == "refusal" and refused.content[0].type == "text"
    assert text.stop_reason == "end_turn" and text.content[0].type == "text"
    GetWeather.model_validate_json(text.content[0].text)


@pytest.mark.parametrize(("fault", "field"), [("cached", "cache_read_input_tokens"),
                                              ("cache_write", "cache_creation_input_tokens")])
def test_cache_tokens_are_reported_apart_from_input_tokens(fault, field) -> None:
    with LoopbackServer(faults=HttpFaults(script={2: fault})) as srv:
        plain, cached = (ask(srv, messages=QUESTION * 20).parse() for _ in range(2))
    assert plain.usage.input_tokens > 0 and getattr(plain.usage, field) == 0
    part = getattr(cached.usage, field)
    assert part > 0 and cached.usage.input_tokens + part == plain.usage.input_tokens


@pytest.mark.parametrize(("fault", "error", "status", "kind"), [
    ("400", anthropic.BadRequestError, 400, "invalid_request_error"),
    ("401", anthropic.AuthenticationError, 401, "authentication_error"),
    ("404", anthropic.NotFoundError, 404, "not_found_error"),
    ("429", anthropic.RateLimitError, 429, "rate_limit_error"),
    ("insufficient_quota", anthropic.BadRequestError, 400, "invalid_request_error"),
    ("500", anthropic.InternalServerError, 500, "api_error"),
    ("529", anthropic.APIStatusError, 529, "overloaded_error"),  # OverloadedError in 1.x
])
def test_each_error_maps_to_the_sdks_exception_with_the_real_type(fault, error, status,
                                                                  kind) -> None:
    with LoopbackServer(faults=HttpFaults(script={1: fault})) as srv:
        with pytest.raises(error) as caught:
            ask(srv)
    exc = caught.value
    assert exc.status_code == status and exc.body["type"] == "error"
    assert exc.body["error"]["type"] == kind
    assert exc.body["request_id"] == exc.request_id == exc.response.headers["request-id"]
    retry = "true" if status in (429, 500, 529) else "false"
    assert exc.response.headers["x-should-retry"] == retry
    if fault == "429":
        assert exc.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert exc.response.headers["retry-after"] == "1"
    if fault == "insufficient_quota":
        assert "credit balance is too low" in exc.message


def test_the_sdk_waits_the_servers_retry_after_on_529_and_then_succeeds(monkeypatch) -> None:
    sleeps = Sleeps()
    monkeypatch.setattr("time.sleep", sleeps)
    with LoopbackServer(faults=HttpFaults(script={1: "529"}, retry_after=0.5)) as srv:
        message = ask(srv, retries=2).parse()
        assert srv.requests == 2
    assert message.stop_reason == "end_turn" and sleeps == [0.5]


def test_the_sdk_does_not_retry_an_empty_credit_balance(monkeypatch) -> None:
    sleeps = Sleeps()
    monkeypatch.setattr("time.sleep", sleeps)
    with LoopbackServer(faults=HttpFaults(script={1: "insufficient_quota"})) as srv:
        with pytest.raises(anthropic.BadRequestError):
            ask(srv, retries=3)
        assert srv.requests == 1
    assert sleeps == []


def test_the_servers_own_request_checks_answer_as_the_api_does() -> None:
    with LoopbackServer() as srv:
        sdk = client(srv)
        with pytest.raises(anthropic.BadRequestError) as caught:
            sdk.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=QUESTION,
                                stream=True)
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "streaming is not supported" in caught.value.message
