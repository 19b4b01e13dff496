"""The official SDKs' batch calls against the loopback server: what they cannot parse, or parse
into something the real API never sends, is a dialect of ours."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from batchjson.testing import BatchFaults, LoopbackServer

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"],
          "additionalProperties": False}


def chat_line(custom_id: str, text: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": "gpt-4o-mini", "messages": [
                           {"role": "user", "content": text}], "response_format": {
                               "type": "json_schema", "json_schema": {
                                   "name": "answer", "schema": SCHEMA, "strict": True}}}})


def wait_for(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    deadline = time.monotonic() + 10
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled") or (
                time.monotonic() > deadline):
            return batch
        time.sleep(0.05)


def test_openai_sdk_lists_every_batch_newest_first_page_by_page():
    """The SDK's auto-pagination (``after`` the last id while ``has_more``) reads the whole
    list: batchjson finds a job whose id was never recorded the same way."""
    with LoopbackServer() as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        upload = client.files.create(file=("in.jsonl", (chat_line("a", "A.") + "\n").encode()),
                                     purpose="batch")
        made = [client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h", metadata={"n": str(i)}).id
                for i in range(5)]
        page = client.batches.list(limit=2)
        assert [b.id for b in page.data] == made[:-3:-1] and page.has_more
        assert [b.id for b in client.batches.list(limit=2)] == made[::-1]  # every page
        assert [b.id for b in client.batches.list(limit=2, after=made[2])] == made[1::-1]
        with pytest.raises(openai.BadRequestError):
            client.batches.list(limit=101)


def test_openai_sdk_uploads_creates_polls_and_reads_a_batch():
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        srv.batches.faults = [BatchFaults(lines={1: "http_400"}, shuffle=True)]
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        data = "\n".join(chat_line(f"req-{i}", f"Label {i}.") for i in range(3)) + "\n"
        upload = client.files.create(file=("in.jsonl", data.encode()), purpose="batch")
        assert upload.purpose == "batch" and upload.bytes == len(data.encode())
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h", metadata={"run": "x"})
        assert batch.status == "validating" and batch.metadata == {"run": "x"}
        done = wait_for(client, batch.id)
        assert done.status == "completed" and done.request_counts.total == 3
        assert done.request_counts.completed == 2 and done.request_counts.failed == 1
        output = [json.loads(line) for line in
                  client.files.content(done.output_file_id).text.splitlines()]
        assert [o["custom_id"] for o in output] == ["req-2", "req-0"]  # any order
        for line in output:
            completion = openai.types.chat.ChatCompletion.model_validate(
                line["response"]["body"])
            assert json.loads(completion.choices[0].message.content)["label"]
        [error] = [json.loads(line) for line in
                   client.files.content(done.error_file_id).text.splitlines()]
        assert error["custom_id"] == "req-1" and error["response"]["status_code"] == 400
        assert [b.id for b in client.batches.list()] == [batch.id]


def test_openai_sdk_cancels_a_batch_and_sees_failed_validation():
    with LoopbackServer() as srv:
        srv.batches.delay = 0.5
        srv.batches.faults = [BatchFaults(), BatchFaults(whole="fail_validation")]
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        upload = client.files.create(file=("in.jsonl", (chat_line("a", "x") + "\n").encode()),
                                     purpose="batch")
        running = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                        endpoint="/v1/chat/completions")
        time.sleep(0.25)
        assert client.batches.cancel(running.id).status == "cancelling"
        assert wait_for(client, running.id).status == "cancelled"
        failed = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                       endpoint="/v1/chat/completions")
        done = wait_for(client, failed.id)
        assert done.status == "failed" and done.errors.data[0].code == "invalid_request"


def message_params(text: str) -> dict:
    return {"model": "claude-haiku-4-5", "max_tokens": 256,
            "messages": [{"role": "user", "content": text}],
            "tools": [{"name": "answer", "input_schema": SCHEMA}],
            "tool_choice": {"type": "tool", "name": "answer"}}


def test_anthropic_sdk_creates_polls_and_streams_message_batch_results():
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        srv.batches.faults = [BatchFaults(lines={1: "http_400", 2: "expired"}, shuffle=True)]
        client = anthropic.Anthropic(base_url=srv.anthropic_base_url, api_key="sk-ant-test",
                                     max_retries=0)
        batch = client.messages.batches.create(requests=[
            {"custom_id": f"req-{i}", "params": message_params(f"Label {i}.")}
            for i in range(4)])
        assert batch.processing_status == "in_progress"
        assert batch.request_counts.processing == 4
        deadline = time.monotonic() + 10
        while batch.processing_status != "ended" and time.monotonic() < deadline:
            time.sleep(0.05)
            batch = client.messages.batches.retrieve(batch.id)
        assert batch.processing_status == "ended" and batch.results_url
        assert batch.request_counts.succeeded == 2 and batch.request_counts.errored == 1
        assert batch.request_counts.expired == 1
        results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
        assert set(results) == {"req-0", "req-1", "req-2", "req-3"}
        assert results["req-1"].type == "errored"
        assert results["req-1"].error.error.type == "invalid_request_error"
        assert results["req-2"].type == "expired"
        [block] = results["req-0"].message.content
        assert block.type == "tool_use" and block.input["label"]
        assert [b.id for b in client.messages.batches.list()] == [batch.id]


def test_anthropic_sdk_cancels_and_is_refused_a_bad_custom_id():
    with LoopbackServer() as srv:
        srv.batches.delay = 0.5
        client = anthropic.Anthropic(base_url=srv.anthropic_base_url, api_key="sk-ant-test",
                                     max_retries=0)
        batch = client.messages.batches.create(requests=[
            {"custom_id": "a", "params": message_params("x")}])
        cancelling = client.messages.batches.cancel(batch.id)
        assert cancelling.processing_status == "canceling" and cancelling.cancel_initiated_at
        time.sleep(0.7)
        [line] = list(client.messages.batches.results(batch.id))
        assert line.result.type == "canceled"
        with pytest.raises(anthropic.BadRequestError, match="custom_id"):
            client.messages.batches.create(requests=[
                {"custom_id": "not valid!", "params": message_params("x")}])


def test_openai_sdk_lists_files_and_batches_from_the_loopback_server():
    """``files.list()`` (``GET /v1/files``) answered 405 before: the SDK pages both lists."""
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        uploads = [client.files.create(file=(f"in{i}.jsonl", (chat_line("a", "A.") + "\n")
                                             .encode()), purpose="batch").id for i in range(3)]
        batch = client.batches.create(input_file_id=uploads[0], completion_window="24h",
                                      endpoint="/v1/chat/completions")
        wait_for(client, batch.id)
        assert [f.id for f in client.files.list(purpose="batch")] == uploads[::-1]
        assert [f.id for f in client.files.list(purpose="batch", limit=2)] == uploads[::-1]
        page = client.files.list(purpose="batch", limit=2, order="asc")
        assert [f.id for f in page.data] == uploads[:2] and page.has_more
        every = {f.id: f.purpose for f in client.files.list()}
        assert set(uploads) < set(every) and "batch_output" in every.values()
        assert [b.id for b in client.batches.list()] == [batch.id]
        with pytest.raises(openai.BadRequestError):
            client.files.list(limit=0)


def test_a_loopback_batch_passes_through_finalizing_before_it_completes():
    with LoopbackServer() as srv:
        srv.batches.delay = 0.6  # finalizing for 0.2 s: a poll every 10 ms sees it
        client = openai.OpenAI(base_url=srv.base_url, api_key="sk-test", max_retries=0)
        upload = client.files.create(file=("in.jsonl", (chat_line("a", "A.") + "\n").encode()),
                                     purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, completion_window="24h",
                                      endpoint="/v1/chat/completions")
        seen, deadline = [], time.monotonic() + 10
        while (not seen or seen[-1] != "completed") and time.monotonic() < deadline:
            status = client.batches.retrieve(batch.id).status
            if not seen or seen[-1] != status:
                seen.append(status)
            time.sleep(0.01)
        order = ["validating", "in_progress", "finalizing", "completed"]
        assert seen[-2:] == order[-2:] and seen == sorted(seen, key=order.index), seen
        done = client.batches.retrieve(batch.id)
        assert done.finalizing_at and done.finalizing_at <= done.completed_at


def test_anthropic_message_batch_bodies_are_compact_json_as_the_api_writes_them():
    """Every body of the Message Batches endpoints, results lines and errors included."""
    with LoopbackServer() as srv:
        srv.batches.delay = 0.1
        srv.batches.faults = [BatchFaults(lines={1: "http_400"})]
        client = anthropic.Anthropic(base_url=srv.anthropic_base_url, api_key="sk-ant-test",
                                     max_retries=0)
        created = client.messages.batches.with_raw_response.create(requests=[
            {"custom_id": f"req-{i}", "params": message_params(f"Label {i}.")}
            for i in range(2)])
        batch = created.parse()
        bodies = [created.http_response.content]
        deadline = time.monotonic() + 10
        while batch.processing_status != "ended" and time.monotonic() < deadline:
            time.sleep(0.05)
            raw = client.messages.batches.with_raw_response.retrieve(batch.id)
            batch, _ = raw.parse(), bodies.append(raw.http_response.content)
        bodies.append(client.messages.batches.with_raw_response.list().http_response.content)
        bodies += httpx.get(f"{srv.anthropic_base_url}/v1/messages/batches/{batch.id}/"
                            "results").content.splitlines()
        bodies.append(httpx.get(f"{srv.anthropic_base_url}/v1/messages/batches/nope").content)
        for body in bodies:
            assert body == json.dumps(json.loads(body), separators=(",", ":")).encode(), body
        assert len(bodies) >= 6
