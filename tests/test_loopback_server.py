"""The loopback server itself: both protocols, call reconstruction, faults, counters, CLI.

Throughput is measured in benchmarks/bench_throughput.py, never asserted here.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from batchjson._content.tasks import TASKS_BEGIN, TASKS_END, render_items_prompt
from batchjson._errors import ConfigError
from batchjson.testing import HttpFaults, LoopbackServer
from batchjson.testing.simulated import FaultPlan, SimulatedModel

TASKS = [{"task_id": "a", "case_id": "x", "prompt": "one"},
         {"task_id": "b", "case_id": "y", "prompt": "two"}]
PROMPT = render_items_prompt(TASKS, ("task_id", "case_id"), None)
SRC = Path(__file__).resolve().parents[1] / "src"


def answer(task: dict[str, Any]) -> dict[str, Any]:
    return {"n": len(task["prompt"])}


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], Any]:
    async def go() -> tuple[int, dict[str, str], Any]:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body, headers=headers or {}) as resp:
                return resp.status, dict(resp.headers), await resp.json(content_type=None)
    return asyncio.run(go())


def chat(srv: LoopbackServer, prompt: str = PROMPT, path: str = "/v1/chat/completions",
         **extra: Any) -> tuple[int, dict[str, str], Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], **extra}
    return post(f"http://127.0.0.1:{srv.port}{path}", body)


ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


def test_openai_shape_and_both_paths() -> None:
    with LoopbackServer(SimulatedModel(answer)) as srv:
        for path in ("/v1/chat/completions", "/chat/completions"):
            status, _, data = chat(srv, path=path)
            assert status == 200
            items = json.loads(data["choices"][0]["message"]["content"])["items"]
            assert items == [{"task_id": "a", "case_id": "x", "n": 3},
                             {"task_id": "b", "case_id": "y", "n": 3}]
            assert data["usage"]["prompt_tokens"] > 0
            assert data["choices"][0]["finish_reason"] == "stop"
        assert srv.requests == 2 and srv.responses[200] == 2


def test_anthropic_tool_and_text_shapes() -> None:
    schema = {"type": "object", "properties": {"items": {"type": "array"}}}
    body = {"model": "c", "max_tokens": 100, "messages": [{"role": "user", "content": PROMPT}],
            "tools": [{"name": "t", "input_schema": schema}],
            "tool_choice": {"type": "tool", "name": "t"}}
    with LoopbackServer(SimulatedModel(answer)) as srv:
        url = f"{srv.anthropic_base_url}/v1/messages"
        status, _, data = post(url, body, ANTHROPIC_HEADERS)
        assert status == 200 and data["stop_reason"] == "tool_use"
        block = data["content"][0]
        assert block["type"] == "tool_use" and block["name"] == "t"
        assert len(block["input"]["items"]) == 2
        assert set(data["usage"]) >= {"input_tokens", "output_tokens", "cache_read_input_tokens"}
        plain = {k: v for k, v in body.items() if k not in ("tools", "tool_choice")}
        status, _, data = post(url, plain, ANTHROPIC_HEADERS)
        assert data["content"][0]["type"] == "text"
        assert json.loads(data["content"][0]["text"])["items"][0]["n"] == 3
        status, _, data = post(url, plain)  # no anthropic-version header
        assert status == 400 and data["type"] == "error"


def test_attempts_count_per_tasks_block_so_seeded_faults_vary() -> None:
    model = SimulatedModel(answer, faults=FaultPlan(script={0: "malformed_json"}))
    with LoopbackServer(model) as srv:
        first = chat(srv)[2]["choices"][0]["message"]["content"]
        second = chat(srv)[2]["choices"][0]["message"]["content"]
        srv.reset_stats()  # a new round (say, of a benchmark) starts its attempts over
        third = chat(srv)[2]["choices"][0]["message"]["content"]
    with pytest.raises(ValueError):
        json.loads(first)
    assert len(json.loads(second)["items"]) == 2
    assert third == first
    assert model.calls == 3


def _wire(identity: tuple[str, ...]) -> dict[str, Any]:
    from batchjson._content.schema import compile_schema, wire_schema

    answer_schema = {"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"]}
    schema = wire_schema(compile_schema(answer_schema), TASKS, identity)
    return {"type": "json_schema", "json_schema": {"name": "batchjson_items", "schema": schema}}


def _reworded(identity_line: str) -> str:
    """The same tasks block under different prose, as an edit of the prompt template gives."""
    block = PROMPT[PROMPT.index(TASKS_BEGIN):]
    return f"Please handle these.\n{identity_line}\n{block}"


def _items(srv: LoopbackServer, prompt: str, **extra: Any) -> list[dict[str, Any]]:
    _, _, data = chat(srv, prompt, **extra)
    return json.loads(data["choices"][0]["message"]["content"])["items"]


def test_rewording_the_prompt_never_changes_the_fake_models_answers() -> None:
    prompts = [PROMPT, _reworded("Echo nothing but the answer."),
               _reworded("Copy these identity fields from the task unchanged into its object: "
                         "task_id."),
               PROMPT.replace("Copy these identity fields", "Keep")]
    for extra in ({}, {"response_format": {"type": "json_object"}},
                  {"response_format": _wire(("task_id", "case_id"))}):
        answers = []
        for prompt in prompts:
            with LoopbackServer(SimulatedModel(answer)) as srv:  # fresh attempt numbering
                answers.append(_items(srv, prompt, **extra))
        assert all(a == answers[0] for a in answers), extra
        assert answers[0] == [{"task_id": "a", "case_id": "x", "n": 3},
                              {"task_id": "b", "case_id": "y", "n": 3}]


def test_identity_comes_from_the_schemas_pinned_fields_whatever_the_prose_says() -> None:
    prompt = _reworded("Copy these identity fields from the task unchanged into its object: "
                       "task_id, case_id.")
    with LoopbackServer(SimulatedModel(answer)) as srv:
        only_task_id = _items(srv, prompt, response_format=_wire(("task_id",)))
        both = _items(srv, _reworded("Answer."), response_format=_wire(("task_id", "case_id")))
    assert [set(item) for item in only_task_id] == [{"task_id", "n"}] * 2
    assert [set(item) for item in both] == [{"task_id", "case_id", "n"}] * 2


def test_a_tasks_block_that_is_not_a_list_of_tasks_is_a_400() -> None:
    with LoopbackServer(SimulatedModel(answer)) as srv:
        status, _, data = chat(srv, f"{TASKS_BEGIN}{{\"task_id\": 1}}{TASKS_END}")
    assert status == 400 and "unreadable tasks block" in data["error"]["message"]


def test_value_mode_without_tasks_block() -> None:
    with LoopbackServer(SimulatedModel(lambda task: {"echo": task["prompt"]})) as srv:
        _, _, data = chat(srv, "just a question")
    assert json.loads(data["choices"][0]["message"]["content"]) == {"echo": "just a question"}


def test_api_key_check_and_counters() -> None:
    with LoopbackServer(SimulatedModel(answer), api_key="sk-good-key-123456") as srv:
        url = f"{srv.base_url}/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
        assert post(url, body)[0] == 401
        status, _, data = post(url, body, {"Authorization": "Bearer sk-bad-key-000000"})
        assert status == 401 and data["error"]["code"] == "invalid_api_key"
        assert post(url, body, {"Authorization": "Bearer sk-good-key-123456"})[0] == 200
        status, _, _ = post(f"{srv.anthropic_base_url}/v1/messages",
                            {"model": "c", "max_tokens": 5, "messages": []},
                            {**ANTHROPIC_HEADERS, "x-api-key": "nope"})
        assert status == 401
        assert srv.requests == 4 and dict(srv.responses) == {401: 3, 200: 1}


def test_http_faults_script_rates_and_validation() -> None:
    faults = HttpFaults(rate_429=0.5, seed=3, script={1: "500"})
    drawn = [faults.draw(n) for n in range(1, 201)]
    assert drawn[0] == "500"
    assert drawn == [faults.draw(n) for n in range(1, 201)]  # reproducible
    assert 60 < drawn.count("429") < 140
    assert HttpFaults().draw(5) is None
    with pytest.raises(ConfigError, match="choose from"):
        HttpFaults(script={1: "418"})
    with LoopbackServer(faults=HttpFaults(script={1: "429"}, retry_after=4)) as srv:
        status, headers, data = chat(srv)
    assert status == 429 and headers["Retry-After"] == "4" and "error" in data
    assert srv.injected["429"] == 1


def test_async_context_manager_and_stats() -> None:
    async def go() -> dict[str, Any]:
        async with LoopbackServer(SimulatedModel(answer)) as srv:
            async with aiohttp.ClientSession() as session:
                for _ in range(3):
                    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
                    async with session.post(f"{srv.base_url}/chat/completions", json=body) as r:
                        assert r.status == 200
                async with session.get(f"http://127.0.0.1:{srv.port}/stats") as r:
                    return await r.json()
    stats = asyncio.run(go())
    assert stats["requests"] == 3 and stats["responses"] == {"200": 3}


@pytest.mark.parametrize("command", [["-m", "batchjson.testing.server"],
                                     ["-m", "batchjson", "serve"]])
def test_cli_serves_until_terminated(command: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, *command, "--port", "0", "--latency", "0"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert match, line
        status, _, data = post(f"{match.group(0)}/chat/completions",
                               {"model": "m", "messages": [{"role": "user", "content": PROMPT}]})
        assert status == 200 and "choices" in data
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1])["requests"] == 1


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (0.001, "1ms"), (0.012, "12ms"),
                                               (1.235, "1.235s"), (20, "20s"), (360, "6m0s"),
                                               (411480, "114h18m0s")])
def test_openai_resets_are_go_durations_as_recorded(seconds: float, text: str) -> None:
    from batchjson.testing._ratelimits import go_duration

    assert go_duration(seconds) == text


def test_anthropic_resets_are_rfc3339_seconds_in_utc() -> None:
    from batchjson.testing._ratelimits import rfc3339

    assert rfc3339(1755780059.2) == "2025-08-21T12:41:00Z"


@pytest.mark.parametrize(("text", "closed"), [
    ('{"items": [{"task_id": "a", "n": 3}, {"task_id": "b", "n"', {"items": [
        {"task_id": "a", "n": 3}, {"task_id": "b"}]}),
    ('{"items": [{"task_id": "a", "label": "po', {"items": [{"task_id": "a", "label": "po"}]}),
    ('{"value": tr', {}),
    ('{"items": [{"task_id": "a", "n": 3}]', {"items": [{"task_id": "a", "n": 3}]}),
    ('{"a": "x\\', {"a": "x"}),
])
def test_a_tool_call_cut_by_max_tokens_keeps_what_a_partial_json_parser_reads(text, closed):
    from batchjson.testing._bodies import tool_input_of

    assert tool_input_of(text, whole=False) == closed


def test_anthropic_max_tokens_inside_a_batch_tool_call_drops_the_unfinished_items() -> None:
    tasks = [{"task_id": str(i), "prompt": "x" * 40} for i in range(6)]
    body = {"model": "c", "max_tokens": 4096, "messages": [
        {"role": "user", "content": render_items_prompt(tasks, ("task_id",), None)}],
        "tools": [{"name": "t", "input_schema": {"type": "object", "properties": {
            "items": {"type": "array"}}}}], "tool_choice": {"type": "tool", "name": "t"}}
    with LoopbackServer(SimulatedModel(answer), faults=HttpFaults(script={1: "length"})) as srv:
        status, headers, data = post(f"{srv.anthropic_base_url}/v1/messages", body,
                                     ANTHROPIC_HEADERS)
    assert status == 200 and data["stop_reason"] == "max_tokens"
    items = data["content"][0]["input"]["items"]
    assert 0 < len(items) < len(tasks) and items[0] == {"task_id": "0", "n": 40}
    assert {k.lower(): v for k, v in headers.items()}["request-id"].startswith("req_011C")


def test_every_fault_name_is_accepted_and_answers_as_the_provider_would() -> None:
    from batchjson.testing import HTTP_FAULTS

    script = dict(enumerate(HTTP_FAULTS, start=1))
    statuses = {}
    with LoopbackServer(SimulatedModel(answer), faults=HttpFaults(script=script, hold=0.01,
                                                                 retry_after=0)) as srv:
        for name in HTTP_FAULTS:
            if name in ("truncate", "cut_json"):
                with pytest.raises((aiohttp.ClientPayloadError, ValueError)):
                    chat(srv)  # a body cut short
                statuses[name] = None
                continue
            status, headers, data = chat(srv)
            statuses[name] = status
            assert "x-request-id" in {k.lower() for k in headers}, name
    assert srv.injected == dict.fromkeys(HTTP_FAULTS, 1)
    assert {k: v for k, v in statuses.items() if v not in (200, None)} == {
        "400": 400, "401": 401, "404": 404, "429": 429, "429_tokens": 429,
        "insufficient_quota": 429, "500": 500, "503": 503, "529": 529, "timeout": 504}
