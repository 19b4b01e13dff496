"""The real HTTP providers against the loopback server: bodies, usage, cost and error mapping.

Everything goes over 127.0.0.1; nothing here can reach the internet.
"""

from __future__ import annotations

import asyncio
import email.utils
import gc
import json
import socket
import threading
import time
import traceback
import warnings
from typing import Any

import pytest

from batchjson._acceptance.judge import unwrap
from batchjson._content.keys import source_text
from batchjson._content.schema import compile_schema, wire_schema
from batchjson._errors import ConfigError, ProviderError, ProviderNotConfigured, ProviderSetupError
from batchjson._providers._http import http_error, is_retryable_status
from batchjson._providers.anthropic import AnthropicProvider
from batchjson._providers.base import Call, Reply, estimate_tokens
from batchjson._providers.openai import OpenAIProvider
from batchjson._providers.pricing import cost_of
from batchjson._providers.ratelimits import retry_after
from batchjson._providers.select import make_provider
from batchjson._providers.strict import strict_form
from batchjson.testing import HttpFaults, LoopbackServer
from batchjson.testing.simulated import SimulatedModel
from tests.helpers import IDENTITY, KEY, TASKS, anthropic, items_call, openai, upper

ENV = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
       "BATCHJSON_MODEL", "BATCHJSON_PROVIDER")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def value_call(schema: dict) -> Call:
    task = {"task_id": "v", "prompt": "How many?"}
    return Call(tasks=(task,), prompt="How many?", system="", schema=schema, attempt=0,
                kind="answer", request_key="vk", mode="value")


def complete(provider: Any, call: Call) -> Any:
    """One call in a fresh event loop, closing the provider's session in that loop."""
    async def go() -> Any:
        try:
            return await provider.complete(call)
        finally:
            await provider.aclose()
    return asyncio.run(go())


def failure(provider: Any, call: Call) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        complete(provider, call)
    return info.value


EXPECTED = {"items": [{"task_id": "t1", "case_id": "c1", "answer": "ALPHA"},
                      {"task_id": "t2", "case_id": "c2", "answer": "BETA"}]}


# -- happy paths ---------------------------------------------------------------------------------

def test_openai_text_tokens_and_cost() -> None:
    call = items_call()
    with LoopbackServer(SimulatedModel(upper), api_key=KEY) as srv:
        reply = complete(openai(srv), call)
    assert json.loads(reply.text) == EXPECTED
    assert reply.input_tokens == estimate_tokens(call.system + call.prompt)
    assert reply.output_tokens == estimate_tokens(reply.text)
    assert reply.cached_tokens == 0
    assert reply.model == "gpt-4o-mini"
    expected = (reply.input_tokens * 0.15 + reply.output_tokens * 0.60) / 1e6
    assert reply.cost == pytest.approx(expected)
    assert reply.extra["finish_reason"] == "stop"


def test_openai_json_schema_body_carries_wire_schema_strict() -> None:
    call = items_call()
    with LoopbackServer(SimulatedModel(upper)) as srv:
        complete(openai(srv), call)
        body = srv.last_body
    assert body["model"] == "gpt-4o-mini"
    assert body["messages"] == [{"role": "system", "content": "Be exact."},
                                {"role": "user", "content": call.prompt}]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "batchjson_items", "schema": strict_form(call.schema).schema, "strict": True}}
    pinned = body["response_format"]["json_schema"]["schema"]["properties"]["items"]
    assert pinned["minItems"] == pinned["maxItems"] == 2
    assert pinned["items"]["properties"]["task_id"] == {"enum": ["t1", "t2"]}


def test_strict_schema_tightens_objects_without_loosening_anything() -> None:
    loose = {"type": "object", "properties": {"answer": {"type": "string"},
                                              "note": {"type": ["string", "null"]}},
             "required": ["answer"]}
    wire = wire_schema(compile_schema(loose), TASKS, IDENTITY)
    strict = strict_form(wire).schema
    item = strict["properties"]["items"]["items"]
    assert item["additionalProperties"] is False
    assert sorted(item["required"]) == ["answer", "case_id", "note", "task_id"]
    assert item["properties"]["note"] == {"type": ["string", "null"]}  # nullable already
    assert "additionalProperties" not in wire["properties"]["items"]["items"]  # no mutation


def test_openai_json_object_and_text_formats_and_no_system() -> None:
    with LoopbackServer(SimulatedModel(upper)) as srv:
        complete(openai(srv, response_format="json_object"), items_call(system=""))
        assert srv.last_body["response_format"] == {"type": "json_object"}
        assert [m["role"] for m in srv.last_body["messages"]] == ["user"]
        reply = complete(openai(srv, response_format="text"), items_call())
        assert "response_format" not in srv.last_body
    assert json.loads(reply.text) == EXPECTED


def test_openai_value_mode_keeps_the_wrapper_it_asked_for_and_says_so() -> None:
    with LoopbackServer(SimulatedModel(lambda task: 42)) as srv:
        reply = complete(openai(srv), value_call({"type": "integer"}))
        spec = srv.last_body["response_format"]["json_schema"]
    assert reply.text == '{"value": 42}'  # what the model sent, byte for byte
    assert reply.envelope == "value"
    assert unwrap(reply) == "42"  # acceptance opens the wrapper
    assert spec["name"] == "batchjson_value"
    assert spec["schema"]["properties"] == {"value": {"type": "integer"}}


@pytest.mark.parametrize(("text", "expected"), [
    ('{"value": 42}', "42"),
    ('```json\n{"value": [1, "é"]}\n```', '[1, "é"]'),  # a fence, as acceptance allows it
    ('{"value": 1, "value": 2}', None),  # duplicate keys: acceptance must see and refuse them
    ('{"value": 3, "extra": "dropped?"}', None),  # more than the wrapper: not tidied away
    ('{"value": NaN}', None),
    ("not json", None),
    ("[" * 5000 + "]" * 5000, None),  # too deep to parse: judged (and rejected), no crash
])
def test_acceptance_unwraps_a_value_envelope_only_when_it_is_exactly_the_wrapper(text, expected):
    for envelope in ("value", "tool_input/value"):
        assert unwrap(Reply(text, envelope=envelope)) == (text if expected is None else expected)
    for envelope in (None, "tool_input"):
        assert unwrap(Reply(text, envelope=envelope)) == text
    assert unwrap(Reply(None, envelope="value")) is None  # type: ignore[arg-type]


def test_value_mode_object_schema_travels_unwrapped() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with LoopbackServer(SimulatedModel(lambda task: {"n": 3})) as srv:
        reply = complete(openai(srv), value_call(schema))
        spec = srv.last_body["response_format"]["json_schema"]
        areply = complete(anthropic(srv), value_call(schema))
        tool = srv.last_body["tools"][0]
    assert json.loads(reply.text) == json.loads(areply.text) == {"n": 3}
    assert (reply.envelope, areply.envelope) == (None, "tool_input")
    assert spec["name"] == tool["name"] == "batchjson_answer"
    assert tool["input_schema"] == schema


def test_anthropic_tool_mode() -> None:
    call = items_call()
    with LoopbackServer(SimulatedModel(upper), api_key=KEY) as srv:
        reply = complete(anthropic(srv), call)
        body = srv.last_body
    assert json.loads(reply.text) == EXPECTED
    assert body["tools"][0]["input_schema"] == call.schema
    assert body["tool_choice"] == {"type": "tool", "name": body["tools"][0]["name"]}
    assert body["system"] == "Be exact." and body["max_tokens"] == 4096
    assert reply.input_tokens == estimate_tokens(call.system + call.prompt)
    assert reply.cost == pytest.approx(
        (reply.input_tokens * 1.0 + reply.output_tokens * 5.0) / 1e6)
    assert reply.extra["stop_reason"] == "tool_use"


def test_anthropic_text_mode_and_value_wrapping() -> None:
    with LoopbackServer(SimulatedModel(upper)) as srv:
        reply = complete(anthropic(srv, mode="text"), items_call())
        assert "tools" not in srv.last_body
        assert json.loads(reply.text) == EXPECTED
    with LoopbackServer(SimulatedModel(lambda task: "seven")) as srv:
        reply = complete(anthropic(srv), value_call({"type": "string"}))
        schema = srv.last_body["tools"][0]["input_schema"]
    # the tool input's exact span of Anthropic's compact body
    assert reply.text == '{"value":"seven"}' and reply.envelope == "tool_input/value"
    assert unwrap(reply) == '"seven"'
    assert schema["required"] == ["value"] and schema["type"] == "object"


def test_unknown_model_has_no_cost_but_keeps_tokens() -> None:
    with LoopbackServer(SimulatedModel(upper)) as srv:
        reply = complete(openai(srv, model="my-local-llama"), items_call())
        areply = complete(anthropic(srv, model="claude-unknown-9"), items_call())
    for r in (reply, areply):
        assert r.cost is None
        assert r.input_tokens and r.output_tokens


def test_custom_base_url_may_be_keyless() -> None:
    with LoopbackServer(SimulatedModel(upper)) as srv:
        reply = complete(openai(srv, api_key=""), items_call())
    assert json.loads(reply.text) == EXPECTED


def test_one_provider_survives_loops_and_threads() -> None:
    """A session belongs to one loop: the same provider works from a fresh loop and a thread."""
    with LoopbackServer(SimulatedModel(upper)) as srv:
        provider = openai(srv)
        first = complete(provider, items_call())
        out: list[Any] = []
        worker = threading.Thread(target=lambda: out.append(complete(provider, items_call())))
        worker.start()
        worker.join(10)
        # A loop closed without aclose() leaves its session behind; the next loop drops it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # that loop's socket leaks
            second = asyncio.run(provider.complete(items_call()))
            assert len(provider._sessions._sessions) == 1
            third = complete(provider, items_call())
            gc.collect()
    assert first.text == second.text == third.text == out[0].text
    assert len(provider._sessions._sessions) == 0


# -- errors --------------------------------------------------------------------------------------

def test_429_is_retryable_with_retry_after_seconds() -> None:
    faults = HttpFaults(script={1: "429"}, retry_after=7)
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        exc = failure(openai(srv), items_call())
        assert srv.responses[429] == 1
    assert (exc.status, exc.retryable, exc.retry_after) == (429, True, 7.0)


def test_429_retry_after_http_date() -> None:
    when = email.utils.formatdate(time.time() + 15, usegmt=True)
    faults = HttpFaults(script={1: "429"}, retry_after=when)
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        exc = failure(anthropic(srv), items_call())
    assert exc.retryable and 10 <= exc.retry_after <= 16  # under the 20 s honoured


@pytest.mark.parametrize("fault", ["500", "503", "529"])
def test_server_errors_are_retryable(fault: str) -> None:
    faults = HttpFaults(script={1: fault, 2: fault}, retry_after=2)
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        exc = failure(openai(srv), items_call())
        aexc = failure(anthropic(srv), items_call()) if fault == "529" else None
    assert exc.status == int(fault) and exc.retryable
    assert exc.retry_after == (None if fault == "500" else 2.0)
    if aexc is not None:
        assert aexc.status == 529 and aexc.retryable and "Overloaded" in str(aexc)


def test_401_is_final_clear_and_never_shows_the_key() -> None:
    with LoopbackServer(SimulatedModel(upper), api_key="sk-the-right-one") as srv:
        provider = openai(srv)
        exc = failure(provider, items_call())
        aprovider = anthropic(srv)
        aexc = failure(aprovider, items_call())
    assert (exc.status, exc.retryable) == (401, False)
    assert "Incorrect API key" in str(exc) and "OPENAI_API_KEY" in str(exc)
    assert (aexc.status, aexc.retryable) == (401, False) and "ANTHROPIC_API_KEY" in str(aexc)
    for shown in (str(exc), repr(exc), repr(provider), str(aexc), repr(aexc), repr(aprovider),
                  repr(vars(provider)), repr(vars(aprovider)), *traceback.format_exception(exc)):
        assert KEY not in shown
        assert KEY[-4:] not in shown  # not even the masked tail the server echoes


def test_quota_429_is_not_retryable() -> None:
    raw = json.dumps({"error": {"message": "You exceeded your current quota",
                                "code": "insufficient_quota"}}).encode()
    exc = http_error("openai", 429, {}, raw, None, "OPENAI_API_KEY")  # type: ignore[arg-type]
    assert exc.status == 429 and not exc.retryable


@pytest.mark.parametrize("fault", ["truncate", "cut_json"])
def test_truncated_body_is_retryable(fault: str) -> None:
    faults = HttpFaults(script={1: fault, 2: fault})
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        exc = failure(openai(srv), items_call())
        aexc = failure(anthropic(srv), items_call()) if fault == "cut_json" else None
    assert exc.retryable
    assert aexc is None or aexc.retryable


def test_a_web_page_instead_of_the_api_is_final_and_names_the_base_url() -> None:
    import http.server

    class Page(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b"<html><body>Welcome to nginx!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        exc = failure(OpenAIProvider("m", base_url=base), items_call())
    finally:
        server.shutdown()
    assert not exc.retryable
    assert "text/html, not a JSON API response" in str(exc) and "check the base URL" in str(exc)


class _Canned:
    """A stdlib HTTP server answering every POST with one fixed body (bytes as given)."""

    def __init__(self, body: bytes) -> None:
        import http.server

        canned = body

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(canned)))
                self.end_headers()
                self.wfile.write(canned)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> _Canned:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# The model's own spelling: odd spacing, key order, an exponent, escapes, a duplicate key.
TOOL_INPUT = ('{ "items" :[ {"answer":"ALPHA","case_id" : "c1", "task_id":"t1", "n": 1.0e0},'
              '{"task_id":"t2","case_id":"c2","answer":"B\\u00c9TA", "n": 2, "n": 3}] }')


def test_anthropic_tool_input_is_kept_as_the_exact_text_the_body_carried() -> None:
    body = ('{"id":"msg_1","type":"message","content":[{"type":"text","text":"Here."},'
            '{"type":"tool_use","id":"toolu_1","name":"batchjson_items","input":'
            + TOOL_INPUT + '}],"model":"claude-haiku-4-5","stop_reason":"tool_use",'
            '"usage":{"input_tokens":10,"output_tokens":5}}')
    for encoded in (body.encode(), b"\xef\xbb\xbf" + body.encode()):  # with a BOM too
        with _Canned(encoded) as srv:
            reply = complete(AnthropicProvider("claude-haiku-4-5", base_url=srv.url),
                             items_call())
        assert reply.text == TOOL_INPUT  # not re-serialised: spacing, 1.0e0, escapes, dupes
        assert reply.envelope == "tool_input" and "raw_reserialised" not in reply.extra
        assert reply.input_tokens == 10


def test_a_body_that_is_not_utf8_is_refused_never_read_as_an_answer() -> None:
    """As a batch output line that is not UTF-8 is (tests/test_batch_jobs.py): a UTF-16 body
    and a stray byte inside the answer are both refused, never reserialised or replaced."""
    body = ('{"content":[{"type":"tool_use","name":"batchjson_items","input":{"items" : []}}],'
            '"usage":{"input_tokens":1,"output_tokens":1}}')
    for raw in (body.encode("utf-16"), body.replace("items", "it\udcffems", 1).encode(
            "utf-8", "surrogateescape")):
        with _Canned(raw) as srv, pytest.raises(ProviderError, match="not valid UTF-8") as got:
            complete(AnthropicProvider("m", base_url=srv.url), items_call())
        assert got.value.retryable and "refused" in str(got.value)


def test_openai_content_is_kept_as_the_model_sent_it() -> None:
    content = '```json\n' + TOOL_INPUT + '\n```'
    body = json.dumps({"id": "c1", "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": content}}]})
    with _Canned(body.encode()) as srv:
        reply = complete(OpenAIProvider("m", base_url=srv.url), items_call())
    assert reply.text == content and reply.envelope is None


def test_client_timeout_is_retryable_and_prompt() -> None:
    faults = HttpFaults(script={1: "timeout"}, hold=30)
    with LoopbackServer(SimulatedModel(upper), faults=faults) as srv:
        exc = failure(openai(srv, timeout=0.3), items_call())
        held = srv.responses[504]  # the server never got to answer the held request
    # the client's own timeout, not the server's late 504: the call returned while held
    assert exc.retryable and exc.status is None and held == 0
    assert "0.3s" in str(exc)


def test_a_port_where_nothing_listens_is_unreachable_and_names_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: every connect is refused
        provider = OpenAIProvider("gpt-4o-mini", base_url=f"http://127.0.0.1:{port}/v1",
                                  api_key=KEY, timeout=2)
        exc = failure(provider, items_call())
        aexc = failure(AnthropicProvider("m", base_url=f"http://127.0.0.1:{port}",
                                         api_key=KEY, timeout=2), items_call())
    for error in (exc, aexc):
        assert error.unreachable and error.retryable
        assert "is the server running?" in str(error) and "connection refused" in str(error)
        assert KEY not in str(error)
        assert error.__context__ is None and error.__cause__ is None  # no aiohttp error rides
    assert f"http://127.0.0.1:{port}/v1/chat/completions" in str(exc)
    assert f"http://127.0.0.1:{port}/v1/messages" in str(aexc)


def test_a_host_that_does_not_resolve_is_unreachable_without_echoing_the_password(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(host: Any, *args: Any, **kwargs: Any) -> Any:  # no resolver is ever asked
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    provider = OpenAIProvider("m", base_url="http://user:hunter2@no-such-host.invalid/v1",
                              timeout=5)
    exc = failure(provider, items_call())
    assert exc.unreachable and "does not resolve" in str(exc)
    assert "http://no-such-host.invalid/v1/chat/completions" in str(exc)
    assert "hunter2" not in str(exc) and "hunter2" not in repr(provider)
    assert "hunter2" not in source_text(provider)


def test_a_server_error_is_not_unreachable() -> None:
    with LoopbackServer(SimulatedModel(upper), faults=HttpFaults(script={1: "503"})) as srv:
        assert not failure(openai(srv), items_call()).unreachable


def test_simulated_transport_fault_becomes_503() -> None:
    from batchjson.testing.simulated import FaultPlan

    model = SimulatedModel(upper, faults=FaultPlan(script={0: "provider_error"}))
    with LoopbackServer(model) as srv:
        exc = failure(openai(srv), items_call())
        reply = complete(openai(srv), items_call())  # attempt 1 is clean
    assert exc.status == 503 and exc.retryable
    assert json.loads(reply.text) == EXPECTED


@pytest.mark.parametrize(("headers", "expected"), [
    ({"Retry-After": "3"}, 3.0), ({"Retry-After": "1.5"}, 1.5), ({"retry-after-ms": "250"}, 0.25),
    ({"Retry-After": "garbage"}, None), ({}, None),
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0)])
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after(headers) == expected


# -- configuration -------------------------------------------------------------------------------

def test_missing_key_for_official_endpoints_fails_at_construction() -> None:
    with pytest.raises(ProviderSetupError, match="OPENAI_API_KEY"):
        OpenAIProvider("gpt-4o-mini")
    with pytest.raises(ProviderSetupError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider("claude-haiku-4-5")
    with pytest.raises(ProviderSetupError, match="BATCHJSON_MODEL"):
        OpenAIProvider(api_key=KEY)


def test_env_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("BATCHJSON_MODEL", "gpt-4.1-mini")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
    provider = OpenAIProvider()
    assert provider.model == "gpt-4.1-mini"
    assert provider.url == "http://127.0.0.1:9/v1/chat/completions"
    assert KEY not in repr(provider) and "<set>" in repr(provider)


def test_a_bad_base_url_fails_at_construction_naming_where_it_came_from(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("localhost:11434/v1", "htp://127.0.0.1:9/v1", "http//127.0.0.1/v1", "http://"):
        with pytest.raises(ProviderSetupError, match=r"base_url .* is not an http\(s\) URL"):
            OpenAIProvider("m", base_url=bad, api_key=KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "127.0.0.1:9")
    with pytest.raises(ProviderSetupError, match="ANTHROPIC_BASE_URL '127.0.0.1:9'"):
        AnthropicProvider("m", api_key=KEY)


def test_a_pasted_full_endpoint_is_trimmed_to_its_base() -> None:
    pasted = OpenAIProvider("m", base_url="http://127.0.0.1:9/v1/chat/completions/")
    assert pasted.url == "http://127.0.0.1:9/v1/chat/completions"
    for base in ("http://127.0.0.1:9/v1/messages", "http://127.0.0.1:9/v1", "http://127.0.0.1:9"):
        assert AnthropicProvider("m", base_url=base).url == "http://127.0.0.1:9/v1/messages"


def test_which_statuses_are_retried() -> None:
    assert [s for s in (400, 401, 403, 404, 413, 422) if is_retryable_status(s)] == []
    assert all(is_retryable_status(s) for s in (408, 409, 425, 429, 500, 502, 503, 504, 529))


def test_extra_body_adds_fields_but_may_not_replace_what_batchjson_builds() -> None:
    with LoopbackServer(SimulatedModel(upper)) as srv:
        complete(openai(srv, extra_body={"temperature": 0, "seed": 1}), items_call())
        assert srv.last_body["temperature"] == 0 and srv.last_body["seed"] == 1
        assert srv.last_body["response_format"]["type"] == "json_schema"
    with pytest.raises(ProviderSetupError, match="extra_body may not set 'response_format'"):
        OpenAIProvider("m", base_url="http://127.0.0.1:9/v1",
                       extra_body={"response_format": {"type": "text"}})
    with pytest.raises(ProviderSetupError,
                       match="extra_body may not set 'max_tokens', 'tools'"):
        AnthropicProvider("m", base_url="http://127.0.0.1:9", extra_body={
            "tools": [], "max_tokens": 5, "temperature": 0})


@pytest.mark.parametrize(("prices", "message"), [
    ({"m": (None, 1.0)}, "price for model 'm': input must be a number >= 0"),
    ({"m": {"input": 1, "output": -2}}, "price for model 'm': output must be a number >= 0"),
    ({"m": {"input": "abc", "output": 1}}, "input must be a number >= 0 .* got 'abc'"),
    ({"m": {"input": 1, "output": 1, "max_input_tokens": "200k"}}, "max_input_tokens must be"),
    ({"m": {"input": 1}}, "needs 'input' and 'output'"),
    ([("m", 1.0, 2.0)], "prices must map model names to prices"),
])
def test_a_bad_price_fails_at_construction_naming_the_model(prices, message) -> None:
    with pytest.raises(ConfigError, match=message):
        OpenAIProvider("m", base_url="http://127.0.0.1:9/v1", prices=prices)


def test_make_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderNotConfigured, match="three ways"):
        make_provider(None)
    with pytest.raises(ProviderNotConfigured, match=r"Unknown provider 'bogus' from provider"):
        make_provider("bogus")
    with pytest.raises(ProviderNotConfigured, match=r"model name: pass provider='openai', "
                       r"model='gpt-4o-mini'\. Configure a provider one of three ways"):
        make_provider("gpt-4o-mini")
    with monkeypatch.context() as env:
        env.setenv("BATCHJSON_PROVIDER", "claude-haiku-4-5")
        with pytest.raises(ProviderNotConfigured, match="from BATCHJSON_PROVIDER .* "
                           "provider='anthropic'"):
            make_provider(None)
    with pytest.raises(ProviderSetupError, match="CallableProvider"):
        make_provider(object())
    with pytest.raises(ProviderSetupError, match="CallableProvider"):
        make_provider(lambda call: "{}")
    with pytest.raises(ProviderSetupError, match="OPENAI_API_KEY"):
        make_provider("openai", model="gpt-4o-mini")
    assert isinstance(make_provider("simulated"), SimulatedModel)
    monkeypatch.setenv("BATCHJSON_PROVIDER", "simulated")
    assert isinstance(make_provider(None), SimulatedModel)
    custom = SimulatedModel()
    assert make_provider(custom) is custom
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert isinstance(make_provider("Anthropic", model="claude-haiku-4-5"), AnthropicProvider)


def test_prices_override_per_provider() -> None:
    with LoopbackServer(SimulatedModel(upper)) as srv:
        reply = complete(openai(srv, model="my-local-llama",
                                prices={"my-local-llama": {"input": 1.0, "output": 2.0}}),
                         items_call())
    assert reply.cost == pytest.approx(cost_of("my-local-llama", reply.input_tokens,
                                               reply.output_tokens,
                                               overrides={"my-local-llama": (1.0, 2.0)}))
    assert reply.cost == pytest.approx((reply.input_tokens + 2 * reply.output_tokens) / 1e6)
