"""A real HTTP server on loopback that speaks OpenAI and Anthropic, backed by SimulatedModel.

Tests and benchmarks exercise the real providers (sockets, status codes, Retry-After, cut bodies,
client timeouts) without reaching the internet. Use it as ``with LoopbackServer() as srv:``
(background thread), ``async with LoopbackServer() as srv:`` (current loop), or from a shell:
``python -m batchjson.testing.server --port 8765 --latency 0.05``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic_core
from aiohttp import web

from .._canon import show_as
from .._checks import seconds, whole_argument
from .._content.tasks import TASKS_BEGIN, TASKS_END, sha
from .._errors import ConfigError
from .._providers.base import Call
from ._batches import BatchDesk, BatchFaults
from ._bodies import anthropic_message, openai_completion, request_id, shape
from ._cache import PromptCache
from ._faults import HTTP_FAULTS, STATUS_FAULTS, HttpFaults
from ._openai_rules import refusal as openai_refusal
from ._ratelimits import Limits, counted_tokens
from ._requests import Ask, anthropic_ask, openai_ask, refusal_of
from ._wire import (
    JSON_HEADERS,
    enforced_429,
    error_response,
    fault_response,
    identity_fields,
    read_body,
    unauthorized,
)
from .simulated import SimulatedModel

__all__ = ["HTTP_FAULTS", "BatchFaults", "HttpFaults", "Limits", "LoopbackServer", "main"]

@dataclass
class Exchange:
    """One request in flight: its protocol, request id, start and the tokens it spent."""

    protocol: str
    request_id: str
    started: float
    tokens: tuple[int, int] = (0, 0)


ORGANIZATION_ID = "00000000-0000-4000-8000-00000000b10c"  # anthropic-organization-id


def tasks_block(prompt: str) -> str | None:
    """The JSON text of the tasks a rendered prompt carries (what the server answers)."""
    start = prompt.find(TASKS_BEGIN)
    end = prompt.find(TASKS_END, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return None
    return prompt[start + len(TASKS_BEGIN):end]



class LoopbackServer:
    """OpenAI chat completions and Anthropic Messages on 127.0.0.1, answered by a SimulatedModel.

    ``requests`` counts API requests, ``responses`` counts them by status, ``injected`` by HTTP
    fault, and ``last_body`` keeps the last request body for assertions. With ``api_key=`` set,
    a missing or wrong key gets a 401 shaped like the real provider's. Counters are updated on
    the server's own loop; read them after the requests you care about have returned.
    """

    def __init__(self, model: SimulatedModel | None = None, *, latency: float = 0.0,
                 faults: HttpFaults | None = None, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, rate_limits: Limits | None = None) -> None:
        self.model = model or SimulatedModel()
        self.latency = seconds("LoopbackServer latency", latency, ConfigError)
        self.faults = faults
        self.host = host
        self.port = port
        self.expected_key = api_key
        self.requests = 0
        self.responses: Counter[int] = Counter()
        self.injected: Counter[str] = Counter()
        self.limited: Counter[str] = Counter()  # 429s of enforced limits, by bucket
        self.admitted_tokens = 0  # tokens counted against enforced limits, as they arrived
        self.last_body: dict[str, Any] | None = None
        self.limits = rate_limits or Limits()  # Limits.enforced(...) refuses beyond them
        self.prompt_cache = PromptCache()
        self._exchanges: dict[int, Exchange] = {}
        self.first_at: float | None = None
        self.last_at: float | None = None
        self._seen: dict[str, int] = {}
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.batches = BatchDesk(self)  # OpenAI's Files and Batches endpoints (_batches.py)

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (ends in /v1), for OpenAIProvider(base_url=...)."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """Anthropic-style base URL (no /v1), for AnthropicProvider(base_url=...)."""
        return f"http://{self.host}:{self.port}"

    def stats(self) -> dict[str, Any]:
        span = (self.last_at - self.first_at) if self.first_at and self.last_at else 0.0
        return {"requests": self.requests, "responses": {str(k): v for k, v in
                                                         sorted(self.responses.items())},
                "injected": dict(self.injected), "limited": dict(self.limited),
                "span_seconds": span,
                "requests_per_second": (self.requests - 1) / span if span > 0 else None}

    def reset_stats(self) -> None:
        self.requests = 0
        self.responses.clear()
        self.injected.clear()
        self.limited.clear()
        self.admitted_tokens = 0
        self._seen.clear()  # attempt numbers (and so seeded fault draws) start over too
        self.first_at = self.last_at = None

    # -- lifecycle -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in ("/v1/chat/completions", "/chat/completions"):
            app.router.add_post(path, self._counted("openai", self._openai))
        for path in ("/v1/messages", "/messages"):
            app.router.add_post(path, self._counted("anthropic", self._anthropic))
        self.batches.routes(app)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/stats", self._stats)
        app.router.add_post("/stats/reset", self._reset)
        return app

    async def start(self) -> LoopbackServer:
        self._closing = asyncio.Event()
        self._runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> LoopbackServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> LoopbackServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve_in_thread, args=(ready,),
                                        name="batchjson-loopback", daemon=True)
        self._thread.start()
        if not ready.wait(30) or self._error is not None:
            raise ConfigError(f"loopback server failed to start on {self.host}:{self.port}: "
                              f"{self._error or 'timed out'}; pick another port (0 = any free)")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # loop already gone
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    def _serve_in_thread(self, ready: threading.Event) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.start()
            except BaseException as exc:  # reported to the starting thread
                self._error = exc
                ready.set()
                return
            ready.set()
            await self._stop.wait()
            await self.stop()

        asyncio.run(run())

    # -- request handling -------------------------------------------------------------------

    def _counted(self, protocol: str,
                 handler: Callable[[web.Request, str | None], Awaitable[web.StreamResponse]]
                 ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def wrapper(request: web.Request) -> web.StreamResponse:
            self.requests += 1
            now = time.perf_counter()
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            self._exchanges[id(request)] = Exchange(protocol, request_id(protocol, self.requests),
                                                    now)
            fault = self.faults.draw(self.requests) if self.faults else None
            if fault:
                self.injected[fault] += 1
            try:
                response = await handler(request, fault)
                if not response.prepared:
                    self._stamp(request, response)
            finally:
                self._exchanges.pop(id(request), None)
            self.responses[response.status] += 1
            return response
        return wrapper

    def _stamp(self, request: web.Request, response: web.StreamResponse) -> None:
        """The headers every real answer carries: its request id, processing time and rate
        limits (as the bucket stands after this request; a 429 already set its own)."""
        exchange = self._exchanges[id(request)]
        self.limits.spend(*exchange.tokens)
        now = time.time()
        headers = response.headers
        if exchange.protocol == "anthropic":
            headers.setdefault("request-id", exchange.request_id)
            headers.setdefault("anthropic-organization-id", ORGANIZATION_ID)
            for name, value in self.limits.anthropic_headers(now).items():
                headers.setdefault(name, value)
            return
        millis = round((time.perf_counter() - exchange.started) * 1000)
        headers.setdefault("x-request-id", exchange.request_id)
        headers.setdefault("openai-version", "2020-10-01")
        headers.setdefault("openai-organization", "org-loopback")
        headers.setdefault("openai-processing-ms", str(millis))
        headers.setdefault("access-control-expose-headers", "X-Request-ID")
        for name, value in self.limits.openai_headers(now).items():
            headers.setdefault(name, value)

    def _rid(self, request: web.Request) -> str:
        return self._exchanges[id(request)].request_id

    async def _openai(self, request: web.Request, fault: str | None) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        key = auth[7:] if auth.startswith("Bearer ") else None
        early = await self._early(request, fault, key, "openai")
        if early is not None:
            return early
        data = self.last_body = await read_body(request)
        refused = refusal_of("openai", data)
        if refused is not None or data is None:
            return error_response("openai", 400, refused or "request body is not a JSON object")
        limited = self._admit("openai", data, self._rid(request))
        if limited is not None:
            return limited
        rule = openai_refusal(data)  # what the real API refuses: the model's, strict mode's
        if rule is not None:
            return error_response("openai", 400, rule.message, rule.code, param=rule.param)
        return await self._reply(request, fault, data, openai_ask(data, self.model.model))

    async def _anthropic(self, request: web.Request, fault: str | None) -> web.StreamResponse:
        early = await self._early(request, fault, request.headers.get("x-api-key"), "anthropic")
        if early is not None:
            return early
        rid = self._rid(request)
        if "anthropic-version" not in request.headers:
            return error_response("anthropic", 400, "anthropic-version: header is required",
                                  request_id=rid)
        data = self.last_body = await read_body(request)
        refused = refusal_of("anthropic", data)
        if refused is not None or data is None:
            return error_response("anthropic", 400, refused or "request body is not a JSON "
                                  "object", request_id=rid)
        limited = self._admit("anthropic", data, rid)
        if limited is not None:
            return limited
        return await self._reply(request, fault, data, anthropic_ask(data, self.model.model))

    async def _reply(self, request: web.Request, fault: str | None, data: dict[str, Any],
                     ask: Ask) -> web.StreamResponse:
        """The simulated model's answer to ``ask``, in the body its protocol sends."""
        exchange = self._exchanges[id(request)]
        outcome = await self._answer(exchange.protocol, ask, exchange.request_id)
        if isinstance(outcome, web.Response):
            return outcome
        text, reply = outcome
        cached = (self.prompt_cache.anthropic if exchange.protocol == "anthropic"
                  else self.prompt_cache.openai)(data, reply.input_tokens)
        output_tokens, payload = self.payload(exchange.protocol, ask, text, reply, fault, cached)
        exchange.tokens = (reply.input_tokens, output_tokens)
        return await self._send(request, payload, fault)

    def payload(self, protocol: str, ask: Ask, text: str, reply: Any, fault: str | None,
                cache: tuple[int, int] = (0, 0)) -> tuple[int, dict[str, Any]]:
        """The answer's output tokens and the body its protocol answers with (a batch line's
        too)."""
        answer = shape(ask, text, reply.output_tokens, fault)
        build = anthropic_message if protocol == "anthropic" else openai_completion
        return answer.output_tokens, build(ask, answer, reply.input_tokens, self.requests, fault,
                                           cache)

    async def _early(self, request: web.Request, fault: str | None, key: str | None,
                     protocol: str) -> web.Response | None:
        """Answer auth failures and injected status/timeouts before touching the model."""
        rid = self._rid(request)
        if fault == "401" or (self.expected_key is not None and key != self.expected_key):
            return unauthorized(protocol, key, rid)
        if fault == "timeout":
            await self._hold(self.faults.hold if self.faults else 30.0)
            return error_response(protocol, 504, "loopback: request held past the client "
                                  "timeout", request_id=rid)
        if fault in STATUS_FAULTS:
            model = ((await read_body(request)) or {}).get("model") or self.model.model
            return fault_response(protocol, fault, self.faults, str(model), self.limits,
                                  time.time(), rid)
        return None

    def _admit(self, protocol: str, data: dict[str, Any], rid: str) -> web.Response | None:
        """Under enforced limits, a 429 for what arrives beyond them: OpenAI sends no
        ``retry-after`` (only ``x-ratelimit-reset-*`` and the wait in its message), Anthropic
        sends ``retry-after`` in whole seconds."""
        if not self.limits.enforcing:
            return None
        now = time.time()
        tokens = counted_tokens(data)
        refused = self.limits.admit(tokens, now)
        if refused is None:
            self.admitted_tokens += tokens
            return None
        bucket, wait = refused
        self.limited[bucket] += 1
        return enforced_429(protocol, bucket, str(data.get("model")), self.limits, now, wait,
                            tokens if bucket == "tokens" else 1, rid)

    async def _answer(self, protocol: str, ask: Ask, rid: str) -> tuple[str, Any] | web.Response:
        """Rebuild the Call the client made, then let the simulated model render its answer."""
        user, schema = ask.user, ask.schema
        block = tasks_block(user)
        try:
            if block is not None:
                tasks = json.loads(block)
                if not isinstance(tasks, list) or not all(isinstance(t, dict) and "task_id" in t
                                                          for t in tasks):
                    raise ValueError("expected a JSON list of task objects with task_id")
                mode, seen_key = "items", block
                identity = identity_fields(schema, tasks)
            else:
                tasks = [{"task_id": "0", "prompt": user}]
                mode, seen_key, identity = "value", user, ("task_id",)
        except ValueError as exc:
            return error_response(protocol, 400, f"loopback: unreadable tasks block ({exc})",
                                  request_id=rid)
        attempt = self._seen.get(seen_key, 0)
        self._seen[seen_key] = attempt + 1
        # ``kind`` only labels the call (the simulated model never reads it): a later attempt of
        # the same tasks is taken for a repair, without reading the prompt's wording.
        if ask.wrapped:  # the value's own schema, as the client's call carried it
            schema = _unwrapped(schema)
        call = Call(tasks=tuple(tasks), prompt=user, system=ask.system, schema=schema,
                    attempt=attempt, request_key=sha(seen_key), mode=mode, identity=identity,
                    kind="repair" if attempt else "answer")
        model = self.model
        model.calls += 1
        drawn = model.faults.draw(model.seed, call)
        delay = self.latency + model.latency
        if delay:
            await asyncio.sleep(delay)
        if "timeout" in drawn:
            await self._hold(self.faults.hold if self.faults else 30.0)
        if "provider_error" in drawn:
            return error_response(protocol, 503, "simulated provider error", request_id=rid)
        try:
            text = model.render(call, drawn)
        except Exception as exc:  # the test's answer() is broken: say so, do not retry
            return error_response(protocol, 400, f"loopback: simulated model failed: {exc!r}",
                                  request_id=rid)
        if ask.wrapped:
            text = f'{{"value": {text}}}'
        return text, model.reply(call, text)

    async def _hold(self, seconds: float) -> None:
        assert self._closing is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    async def _send(self, request: web.Request, payload: dict[str, Any],
                    fault: str | None) -> web.StreamResponse:
        """The body as each API formats it: OpenAI pretty-printed with a final newline,
        Anthropic compact; or cut short, for the transport faults."""
        if self._exchanges[id(request)].protocol == "anthropic":
            body = json.dumps(payload, separators=(",", ":")).encode()
        else:
            body = pydantic_core.to_json(payload, indent=2) + b"\n"
        if fault == "cut_json":
            return web.Response(body=body[: len(body) // 2], headers=JSON_HEADERS)
        if fault != "truncate":
            return web.Response(body=body, headers=JSON_HEADERS)
        response = web.StreamResponse(headers=JSON_HEADERS)
        response.content_length = len(body)
        self._stamp(request, response)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        if request.transport is not None:
            request.transport.close()  # the rest never comes
        return response

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model.model, "object": "model", "owned_by": "batchjson-loopback"}]})

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset_stats()
        return web.json_response({"ok": True})


def seconds_argument(text: str) -> float:
    """An argparse ``type=`` for a delay: ``nan``, ``inf`` or a negative number is a usage
    error (exit 2), not a server that never answers."""
    try:
        return seconds("", float(text), ConfigError)
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got "
                                         f"{text!r}") from None


seconds_argument.__name__ = "seconds"


def main(argv: Sequence[str] | None = None,
         prog: str = "python -m batchjson.testing.server") -> int:
    """Serve until interrupted; prints the OpenAI and Anthropic base URLs on one line."""
    parser = argparse.ArgumentParser(prog=prog,
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    parser.add_argument("--port", type=whole_argument(0, 65535), default=0,
                        help="0 picks a free port")
    parser.add_argument("--latency", type=seconds_argument, default=0.0,
                        help="seconds per answer")
    parser.add_argument("--api-key", default=None, help="require this key (401 otherwise)")
    for name in ("429", "500", "timeout", "truncate"):
        parser.add_argument(f"--rate-{name}", type=float, default=0.0,
                            help=f"probability of a {name} fault per request")
    parser.add_argument("--retry-after", type=seconds_argument, default=1.0,
                        help="seconds a 429 fault asks the client to wait")
    parser.add_argument("--hold", type=seconds_argument, default=30.0,
                        help="seconds a timeout is held")
    parser.add_argument("--seed", type=int, default=0, help="fault seed (default 0)")
    args = parser.parse_args(argv)
    try:
        faults = HttpFaults(rate_429=args.rate_429, rate_500=args.rate_500,
                            rate_timeout=args.rate_timeout, rate_truncate=args.rate_truncate,
                            retry_after=args.retry_after, hold=args.hold, seed=args.seed)
    except ConfigError as exc:  # a rate outside [0, 1]: usage, exit 2
        parser.error(str(exc).replace("HttpFaults.rate_", "--rate-").replace("_", "-"))
    server = LoopbackServer(latency=args.latency, faults=faults, host=args.host, port=args.port,
                            api_key=args.api_key)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        async with server:
            print(f"listening on {server.base_url} (OpenAI) and {server.anthropic_base_url} "
                  "(Anthropic)", flush=True)
            await stop.wait()

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve())
    except OSError as exc:  # the port is taken, the host does not resolve: usage, exit 2
        parser.exit(2, f"{parser.prog}: error: cannot listen on {args.host}:{args.port} "
                       f"({exc.strerror or exc}); pick another --port (0 picks a free one) "
                       "or --host\n")
    print(json.dumps(server.stats()), flush=True)
    return 0


def _unwrapped(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A value-mode schema the client wrapped as ``{"value": schema}`` (its $defs at the root)."""
    inner = dict((schema.get("properties") or {}).get("value") or {})
    if "$defs" in schema:
        inner["$defs"] = schema["$defs"]
    return inner


show_as("batchjson.testing", LoopbackServer, BatchFaults, HttpFaults, Limits)

if __name__ == "__main__":
    raise SystemExit(main())
