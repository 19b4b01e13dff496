"""Shared builders for tests: tasks shaped like the seed's review batch, calls and HTTP
providers pointed at the loopback server, and a scripted endpoint for RLM engines' clients."""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from batchjson._acceptance.judge import Verdict, judge
from batchjson._content.schema import compile_schema, wire_schema
from batchjson._content.tasks import render_items_prompt
from batchjson._loop import run_sync
from batchjson._providers.anthropic import AnthropicProvider
from batchjson._providers.base import Call
from batchjson._providers.openai import OpenAIProvider
from batchjson._providers.reply import Reply, received
from batchjson.testing import LoopbackServer

LABEL_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]}},
    "required": ["verdict"],
}


def review_tasks(n: int = 20, case: str = "gold-pair-078") -> list[dict[str, Any]]:
    """n candidates of one case, identity fields as in the seed's failure record."""
    return [
        {
            "task_id": f"{case}::{case}-candidate-{127 + i}",
            "case_id": case,
            "candidate_id": f"{case}-candidate-{127 + i}",
            "prompt": f"Does candidate {127 + i} match {case}?",
        }
        for i in range(n)
    ]


def answer(task: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": "match" if int(task["candidate_id"].rsplit("-", 1)[1]) % 2 else "no_match"}


def items_reply(call: Any, **overrides: Any) -> str:
    """A correct {"items": [...]} return for a call, with per-task overrides."""
    items = []
    for task in call.tasks:
        item = {k: task[k] for k in call.identity} | answer(task)
        item.update(overrides.get(task["task_id"], {}))
        items.append(item)
    return json.dumps({"items": items})


class ConcurrentModel:
    """An async provider function that records each call's task_ids and the peak number of
    calls in flight at once, answering with ``respond(call)`` after ``delay`` seconds."""

    def __init__(self, respond=None, delay: float = 0.01) -> None:
        self.respond = respond or items_reply
        self.delay = delay
        self.in_flight = 0
        self.peak = 0
        self.sent: list[tuple[str, ...]] = []

    async def __call__(self, call: Any) -> str:
        import asyncio

        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        self.sent.append(tuple(t["task_id"] for t in call.tasks))
        return self.respond(call)


# -- HTTP providers against the loopback server ----------------------------------------

KEY = "sk-test-SECRETVALUE-0123456789abcdef"
IDENTITY = ("task_id", "case_id")
TASKS = [{"task_id": "t1", "case_id": "c1", "prompt": "alpha"},
         {"task_id": "t2", "case_id": "c2", "prompt": "beta"}]
ITEM_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}},
               "required": ["answer"], "additionalProperties": False}
def upper(task: dict[str, Any]) -> dict[str, Any]:
    return {"answer": task["prompt"].upper()}


def items_call(schema: dict | None = None, system: str = "Be exact.") -> Call:
    wire = wire_schema(compile_schema(schema or ITEM_SCHEMA), TASKS, IDENTITY)
    return Call(tasks=tuple(TASKS), prompt=render_items_prompt(TASKS, IDENTITY, "Shout."),
                system=system, schema=wire, attempt=0, kind="answer", request_key="rk",
                identity=IDENTITY)


def openai(srv: LoopbackServer, **kw: Any) -> OpenAIProvider:
    kw.setdefault("api_key", KEY)
    return OpenAIProvider(kw.pop("model", "gpt-4o-mini"), base_url=srv.base_url, **kw)


def anthropic(srv: LoopbackServer, **kw: Any) -> AnthropicProvider:
    kw.setdefault("api_key", KEY)
    return AnthropicProvider(kw.pop("model", "claude-haiku-4-5"),
                             base_url=srv.anthropic_base_url, **kw)


# -- RLM engines' own OpenAI clients against a scripted endpoint --------------------------

_LABELLING_CELL = '''
reviews = REVIEWS
prompts = [f"Label the sentiment of review {i}: {text}" for i, text in enumerate(reviews)]
schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}

def validate_labels(value, index):
    if value["label"] not in ("pos", "neg"):
        raise ValueError(f"label must be 'pos' or 'neg', got {value['label']!r}")

result = llm_batch_json(prompts, schema, max_repair_attempts=1, validator=validate_labels)
if result["errors"]:
    raise RuntimeError(f"{len(result['errors'])} prompt(s) still failing")
answer["content"] = ",".join(value["label"] for value in result["values"])
answer["ready"] = True
'''


def labelling_cell(reviews: str) -> str:
    """The seed's RLM cell: its validator is defined inline and it raises while prompts fail,
    so the host re-runs it. ``reviews`` is the expression that gives the review texts."""
    return _LABELLING_CELL.replace("REVIEWS", reviews, 1)


class MockOpenAI:
    """OpenAI chat completions on 127.0.0.1 for an RLM engine's own client (rlm's, droste's).
    A root request (it opens with the engine's system prompt) gets ``root_reply``; a subcall
    gets ``subcall(prompt)``. Every request's messages are kept. A scripted endpoint, not a
    model: it tests the engines' loops and clients, never an API dialect."""

    def __init__(self, root_reply: str, subcall: Callable[[str], str]) -> None:
        self.root_reply = root_reply
        self.subcall = subcall
        self.roots: list[list[dict[str, Any]]] = []
        self.subcalls: list[str] = []
        self._lock = threading.Lock()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = mock.answer(body["messages"])
                payload = json.dumps({
                    "id": "chatcmpl-mock", "object": "chat.completion", "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                              "total_tokens": 15}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, messages: list[dict[str, Any]]) -> str:
        with self._lock:
            if messages[0]["role"] == "system":
                self.roots.append(messages)
                return self.root_reply
            self.subcalls.append(messages[-1]["content"])
            return self.subcall(messages[-1]["content"])

    def __enter__(self) -> MockOpenAI:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def flaky_labels(bad: int) -> Callable[[str], str]:
    """Subcall answers: the first ``bad`` break the validator, then every one passes."""
    seen = iter(range(10**6))

    def answer(prompt: str) -> str:
        return '{"label": "maybe"}' if next(seen) < bad else '{"label": "pos"}'

    return answer


def ctrl_c_in_a_live_loop(cell: Callable[[], Any]) -> float:
    """Run the coroutine ``cell()`` as Jupyter runs a cell (on a live event loop) and expect the
    Ctrl-C it simulates with ``_thread.interrupt_main()``; the seconds it took to raise.

    Garbage left by earlier tests is collected first: a Ctrl-C that lands while a finalizer
    runs on this thread is swallowed by Python ("Exception ignored in ..."), whatever the code
    under test does.
    """
    gc.collect()
    loop = asyncio.new_event_loop()  # no asyncio.run: it would swallow the first SIGINT
    started = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(cell())
    finally:
        loop.close()
    return time.perf_counter() - started


# -- reading and writing a ledger of either store, as the store itself does -------------------

def ledger_rows(target: Any, sql: str, *args: Any) -> list[tuple]:
    """The rows of one query (``?`` parameters) on the ledger at ``target``."""
    from batchjson import Ledger

    held = Ledger(target)
    try:
        return [tuple(row) for row in held.store._read(sql, args)]
    finally:
        held.close()


def ledger_write(target: Any, *statements: tuple[str, tuple]) -> list[Any]:
    """Run statements in one transaction on the ledger at ``target`` (another runner's or a
    crashed one's writes); for each INSERT the new row's id."""
    from batchjson import Ledger

    held = Ledger(target)
    out = []
    try:
        with held.store.transaction() as tx:
            for sql, args in statements:
                if sql.lstrip().upper().startswith("INSERT INTO ATTEMPTS"):
                    out.append(held.store._insert(tx, sql, args))
                else:
                    out.append(held.store._exec(tx, sql, args).rowcount)
        return out
    finally:
        held.close()


def kill_runner_mid_call(script: str, target: Any, calls: int) -> None:
    """Run ``script`` (``python -c``, the ledger as its argument) until it has printed "sent"
    for ``calls`` calls, then SIGKILL it: a runner that died with its calls in flight."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(target)], env=env,
                            stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        for _ in range(calls):
            assert proc.stdout.readline().strip() == "sent"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def accept_items(text: str, tasks: Any, identity: Any, schema: Any, validator: Any) -> Verdict:
    """Judge an ``{"items": [...]}`` return as the replay loop does, from sync test code."""
    return run_sync(lambda: judge(received(Reply(text=text)), tasks, mode="items",
                                  identity=identity, schema=schema, validator=validator))


def cell_ok(ip: Any, source: str) -> Any:
    """Run one notebook cell in ``ip``; it must succeed (its error shown otherwise): its value."""
    result = ip.run_cell(source)
    assert result.success, result.error_before_exec or result.error_in_exec
    return result.result
