"""The official ``openai`` SDK as a client of the loopback server: whatever it cannot parse, or
parses into something the real API never sends, is a dialect of ours."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Literal

import openai
import pytest
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, Field

from batchjson.testing import HttpFaults, LoopbackServer
from batchjson.testing._ratelimits import Limits
from batchjson.testing.simulated import SimulatedModel
from tests.protocol import GO_DURATION, OPENAI_LIMIT_HEADERS, OPENAI_REQUEST_ID, Sleeps

QUESTION = [{"role": "user", "content": "What's the weather like in SF?"}]


class Units(StrEnum):
    c = "c"
    f = "f"


class Location(BaseModel):
    city: str
    temperature: float
    units: Literal["c", "f"]


class Forecast(BaseModel):
    """Nested models, an enum, a list, an optional and bounds: what users hand ``parse``."""

    location: Location
    days: list[int] = Field(min_length=1, max_length=5)
    unit: Units
    note: str | None
    confidence: float = Field(ge=0, le=1)


# what the SDK itself sends for the model (parse() sends the same): the server refuses a
# strict schema the real API refuses, so a raw model_json_schema() would be a 400
FORECAST_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "Forecast", "strict": True, "schema": to_strict_json_schema(Forecast)}}


class GetWeather(BaseModel):
    city: str
    country: str
    units: Literal["c", "f"]


def client(srv: LoopbackServer, retries: int = 0, key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=retries)


def test_a_completion_carries_every_field_the_spec_requires_and_the_api_sends() -> None:
    with LoopbackServer() as srv:
        raw = client(srv).chat.completions.with_raw_response.create(model="gpt-4o",
                                                                   messages=QUESTION)
    body = json.loads(raw.text)
    completion = raw.parse()
    assert isinstance(completion, openai.types.chat.ChatCompletion)
    choice = body["choices"][0]
    # CreateChatCompletionResponse and its choice and message: required by the OpenAPI document
    assert {"id", "object", "created", "model", "choices"} <= set(body)
    assert {"index", "message", "finish_reason", "logprobs"} <= set(choice)
    assert {"role", "content", "refusal"} <= set(choice["message"])
    assert choice["logprobs"] is None and choice["message"]["refusal"] is None
    assert choice["message"]["annotations"] == [] and choice["finish_reason"] == "stop"
    assert body["object"] == "chat.completion" and body["service_tier"] == "default"
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 29
    assert body["system_fingerprint"].startswith("fp_")
    usage = completion.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details.reasoning_tokens == 0
    assert OPENAI_REQUEST_ID.fullmatch(raw.headers["x-request-id"])
    assert completion._request_id == raw.headers["x-request-id"]
    assert raw.headers["openai-version"] == "2020-10-01"
    assert all(name in raw.headers for name in OPENAI_LIMIT_HEADERS)
    assert GO_DURATION.fullmatch(raw.headers["x-ratelimit-reset-requests"])


def test_request_ids_differ_and_the_request_bucket_drains() -> None:
    with LoopbackServer() as srv:
        srv.limits = Limits(requests=60)  # one request a second refills: two quick ones show it
        sdk = client(srv)
        first, second = (sdk.chat.completions.with_raw_response.create(model="m",
                                                                       messages=QUESTION)
                         for _ in range(2))
    assert first.headers["x-request-id"] != second.headers["x-request-id"]
    left = [int(r.headers["x-ratelimit-remaining-requests"]) for r in (first, second)]
    assert left[1] < left[0] < int(first.headers["x-ratelimit-limit-requests"])


@pytest.mark.parametrize("model", [Location, Forecast])
def test_parse_gets_a_pydantic_instance_from_the_schema_conforming_answer(model) -> None:
    with LoopbackServer() as srv:
        completion = client(srv).chat.completions.parse(model="gpt-4o", messages=QUESTION,
                                                        response_format=model)
        sent = srv.last_body["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, model)
    assert parsed == model.model_validate_json(completion.choices[0].message.content)


def test_the_same_question_gets_the_same_answer_from_a_seeded_model() -> None:
    answers = []
    for _ in range(2):
        with LoopbackServer(SimulatedModel(seed=7)) as srv:
            answers.append(client(srv).chat.completions.parse(
                model="m", messages=QUESTION, response_format=Forecast).choices[0].message.parsed)
    assert answers[0] == answers[1]


def test_a_forced_function_is_called_with_arguments_that_parse() -> None:
    tool = openai.pydantic_function_tool(GetWeather)
    with LoopbackServer() as srv:
        completion = client(srv).chat.completions.parse(
            model="gpt-4o", messages=QUESTION, tools=[tool],
            tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 24
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)


def test_a_refusal_reaches_the_sdk_as_a_refusal() -> None:
    with LoopbackServer(faults=HttpFaults(script={1: "refusal"})) as srv:
        completion = client(srv).chat.completions.parse(model="gpt-4o", messages=QUESTION,
                                                        response_format=Location)
    message = completion.choices[0].message
    assert message.content is None and message.parsed is None
    assert message.refusal and completion.choices[0].finish_reason == "stop"


def test_a_truncated_answer_stops_for_length_with_its_text_cut() -> None:
    with LoopbackServer(faults=HttpFaults(script={1: "length", 2: "length"})) as srv:
        sdk = client(srv)
        with pytest.raises(openai.LengthFinishReasonError):
            sdk.chat.completions.parse(model="gpt-4o", messages=QUESTION,
                                       response_format=Forecast)
        cut = sdk.chat.completions.create(model="gpt-4o", messages=QUESTION,
                                          response_format=FORECAST_FORMAT)
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(cut.choices[0].message.content)


def test_max_tokens_cuts_the_answer_and_counts_exactly_the_limit() -> None:
    with LoopbackServer() as srv:
        sdk = client(srv)
        for limit in ("max_tokens", "max_completion_tokens"):
            completion = sdk.chat.completions.create(model="gpt-4o", messages=QUESTION,
                                                     response_format=FORECAST_FORMAT,
                                                     **{limit: 2})
            assert completion.choices[0].finish_reason == "length"
            assert completion.usage.completion_tokens == 2
            assert len(completion.choices[0].message.content) == 8


def test_a_tool_call_can_come_where_text_was_asked() -> None:
    with LoopbackServer(faults=HttpFaults(script={1: "tool_call"})) as srv:
        completion = client(srv).chat.completions.create(
            model="gpt-4o", messages=QUESTION, response_format={
                "type": "json_schema", "json_schema": {"name": "Location", "strict": True,
                                                       "schema": to_strict_json_schema(Location)}})
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "Location"
    Location.model_validate_json(call.function.arguments)


@pytest.mark.parametrize(("fault", "field"), [("cached", "cached_tokens"),
                                              ("cache_write", "cache_write_tokens")])
def test_cache_usage_is_part_of_the_prompt_tokens(fault, field) -> None:
    with LoopbackServer(faults=HttpFaults(script={1: fault})) as srv:
        raw = client(srv).chat.completions.with_raw_response.create(model="gpt-4o",
                                                                   messages=QUESTION * 20)
    usage = json.loads(raw.text)["usage"]
    part = usage["prompt_tokens_details"][field]
    assert 0 < part < usage["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_reasoning_tokens_are_counted_inside_completion_tokens() -> None:
    with LoopbackServer(faults=HttpFaults(script={2: "reasoning"})) as srv:
        sdk = client(srv)
        plain, reasoned = (sdk.chat.completions.create(model="o3-mini", messages=QUESTION)
                           for _ in range(2))
    reasoning = reasoned.usage.completion_tokens_details.reasoning_tokens
    assert reasoning > 0
    assert reasoned.usage.completion_tokens == plain.usage.completion_tokens + reasoning
    assert reasoned.choices[0].message.content == plain.choices[0].message.content


@pytest.mark.parametrize(("fault", "error", "status", "kind", "code"), [
    ("400", openai.BadRequestError, 400, "invalid_request_error", None),
    ("401", openai.AuthenticationError, 401, "invalid_request_error", "invalid_api_key"),
    ("404", openai.NotFoundError, 404, "invalid_request_error", "model_not_found"),
    ("429", openai.RateLimitError, 429, "requests", "rate_limit_exceeded"),
    ("429_tokens", openai.RateLimitError, 429, "tokens", "rate_limit_exceeded"),
    ("insufficient_quota", openai.RateLimitError, 429, "insufficient_quota",
     "insufficient_quota"),
    ("500", openai.InternalServerError, 500, "server_error", None),
    ("503", openai.InternalServerError, 503, "server_error", None),
])
def test_each_error_maps_to_the_sdks_exception_with_the_real_type_and_code(
        fault, error, status, kind, code) -> None:
    with LoopbackServer(faults=HttpFaults(script={1: fault})) as srv:
        with pytest.raises(error) as caught:
            client(srv).chat.completions.create(model="gpt-4o-mini", messages=QUESTION)
    exc = caught.value
    assert exc.status_code == status and set(exc.body) == {"message", "type", "param", "code"}
    assert (exc.type, exc.code) == (kind, code)
    assert OPENAI_REQUEST_ID.fullmatch(exc.request_id)
    if fault.startswith("429"):
        assert "gpt-4o-mini" in exc.message and "Please try again in 1s" in exc.message
        bucket = "tokens" if fault == "429_tokens" else "requests"
        assert exc.response.headers[f"x-ratelimit-remaining-{bucket}"] == "0"
        assert exc.response.headers[f"x-ratelimit-reset-{bucket}"] == "1s"


def test_the_sdk_waits_the_servers_retry_after_and_then_succeeds(monkeypatch) -> None:
    sleeps = Sleeps()
    monkeypatch.setattr("time.sleep", sleeps)
    faults = HttpFaults(script={1: "429", 2: "503"}, retry_after=0.25)
    with LoopbackServer(faults=faults) as srv:
        completion = client(srv, retries=2).chat.completions.create(model="m",
                                                                    messages=QUESTION)
        assert srv.requests == 3 and dict(srv.responses) == {429: 1, 503: 1, 200: 1}
    assert completion.choices[0].finish_reason == "stop"
    assert sleeps == [0.25, 0.25]  # retry-after-ms, not the SDK's own backoff


def test_the_sdk_does_not_retry_insufficient_quota(monkeypatch) -> None:
    sleeps = Sleeps()
    monkeypatch.setattr("time.sleep", sleeps)
    with LoopbackServer(faults=HttpFaults(script={1: "insufficient_quota"})) as srv:
        with pytest.raises(openai.RateLimitError) as caught:
            client(srv, retries=3).chat.completions.create(model="m", messages=QUESTION)
        assert srv.requests == 1
    assert sleeps == [] and caught.value.response.headers["x-should-retry"] == "false"
    assert "retry-after" not in caught.value.response.headers


def test_a_wrong_key_is_an_authentication_error_that_masks_the_key() -> None:
    with LoopbackServer(api_key="sk-right-key-0000") as srv:
        with pytest.raises(openai.AuthenticationError) as caught:
            client(srv, key="sk-wrong-key-1234").chat.completions.create(model="m",
                                                                         messages=QUESTION)
    assert caught.value.code == "invalid_api_key" and "sk-wrong-key-1234" not in str(caught.value)
