"""Anthropic's Message Batches on the loopback server: ``POST /v1/messages/batches``, its
``processing_status`` (``in_progress``, ``canceling``, ``ended``) and its results, JSONL from
``results_url`` once it has ended, each line's ``result.type`` ``succeeded``, ``errored``,
``canceled`` or ``expired``. Faults and timing are the desk's (``_batches.py``); a batch with
the ``fail_validation`` fault is refused when it is created, as Anthropic validates then."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ._requests import anthropic_ask
from ._wire import error_response

if TYPE_CHECKING:
    from ._batches import BatchDesk, BatchFaults

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
compact = partial(json.dumps, separators=(",", ":"))  # Anthropic's JSON has no spaces


def _stamp(offset: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).isoformat().replace("+00:00", "Z")


class MessageBatches:
    """Message batches kept in memory for the server's life."""

    def __init__(self, desk: BatchDesk) -> None:
        self.desk = desk
        self.batches: dict[str, dict[str, Any]] = {}
        self.results: dict[str, bytes] = {}
        self.bodies: list[bytes] = []  # each creation's body as received, byte for byte

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages/batches", self._create)
        app.router.add_get("/v1/messages/batches", self._list)
        app.router.add_get("/v1/messages/batches/{id}", self._get)
        app.router.add_post("/v1/messages/batches/{id}/cancel", self._cancel)
        app.router.add_get("/v1/messages/batches/{id}/results", self._results)

    async def _create(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        data = await request.json()
        await asyncio.sleep(self.desk.upload_delay)  # the requests are its upload
        lines = data.get("requests") if isinstance(data, dict) else None
        if not isinstance(lines, list) or not lines:
            return error_response("anthropic", 400, "requests: a non-empty list is required")
        ids = [line.get("custom_id") if isinstance(line, dict) else None for line in lines]
        if any(not isinstance(i, str) or not CUSTOM_ID.match(i) for i in ids) or len(
                set(ids)) != len(ids):
            return error_response("anthropic", 400, "requests: each custom_id must match "
                                  "^[a-zA-Z0-9_-]{1,64}$ and be unique")
        faults = self.desk._faults()
        if faults.whole in ("fail_validation", "token_limit"):
            return error_response("anthropic", 400, "loopback: requests failed validation")
        batch_id = "msgbatch_" + self.desk.token("msgbatch")
        host = request.host
        batch = {"id": batch_id, "type": "message_batch", "processing_status": "in_progress",
                 "request_counts": {"processing": len(lines), "succeeded": 0, "errored": 0,
                                    "canceled": 0, "expired": 0},
                 "ended_at": None, "created_at": _stamp(), "expires_at": _stamp(86400),
                 "archived_at": None, "cancel_initiated_at": None, "results_url": None,
                 "_results_url": f"http://{host}/v1/messages/batches/{batch_id}/results"}
        self.batches[batch_id] = batch
        self.desk._schedule(self._run(batch, lines, faults))
        return web.json_response(_shown(batch), dumps=compact)

    async def _list(self, request: web.Request) -> web.Response:
        data = [_shown(b) for b in self.batches.values()]
        return web.json_response({"data": data, "has_more": False,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None}, dumps=compact)

    async def _get(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return error_response("anthropic", 404, "message batch not found")
        return web.json_response(_shown(batch), dumps=compact)

    async def _cancel(self, request: web.Request) -> web.Response:
        batch = self.batches.get(request.match_info["id"])
        if batch is None:
            return error_response("anthropic", 404, "message batch not found")
        if batch["processing_status"] == "in_progress":
            batch.update(processing_status="canceling", cancel_initiated_at=_stamp())
        return web.json_response(_shown(batch), dumps=compact)

    async def _results(self, request: web.Request) -> web.Response:
        data = self.results.get(request.match_info["id"])
        if self.desk.refuse_results:
            return error_response("anthropic", self.desk.refuse_results, "loopback: refused")
        if data is None:
            return error_response("anthropic", 404, "results are available once the batch "
                                  "has ended")
        return web.Response(body=data, content_type="application/binary")

    async def _run(self, batch: dict[str, Any], lines: list[dict[str, Any]],
                   faults: BatchFaults) -> None:
        await asyncio.sleep(self.desk.delay)
        if batch["processing_status"] == "canceling":
            rows = [self._lost(line, "canceled") for line in lines]
        else:
            output, errors = await self.desk._lines(lines, faults, self._answer, self._lost)
            rows = output + errors
        counts = batch["request_counts"]
        counts["processing"] = 0
        for row in rows:
            kind = row["result"]["type"]
            counts[kind] = counts.get(kind, 0) + 1
        self.results[batch["id"]] = "".join(compact(r) + "\n" for r in rows).encode()
        batch.update(processing_status="ended", ended_at=_stamp(),
                     results_url=batch["_results_url"])

    @staticmethod
    def _lost(line: dict[str, Any], kind: str) -> dict[str, Any]:
        return {"custom_id": line.get("custom_id"), "result": {"type": kind}}

    async def _answer(self, line: dict[str, Any], fault: str | None) -> dict[str, Any]:
        """One request answered as the Messages endpoint answers its params."""
        desk, server = self.desk, self.desk.server
        rid = desk._number(line, "anthropic")
        if fault in ("errored", "http_400"):
            kind = "api_error" if fault == "errored" else "invalid_request_error"
            return {"custom_id": line.get("custom_id"), "result": {"type": "errored", "error": {
                "type": "error", "error": {"type": kind, "message": f"loopback: {fault}"}}}}
        ask = anthropic_ask(line.get("params") or {}, server.model.model)
        outcome = await server._answer("anthropic", ask, rid)
        if isinstance(outcome, web.Response):
            body = json.loads(outcome.body)
            return {"custom_id": line.get("custom_id"), "result": {"type": "errored",
                                                                   "error": body}}
        message = server.payload("anthropic", ask, *outcome, None)[1]
        return {"custom_id": line.get("custom_id"),
                "result": {"type": "succeeded", "message": message}}


def _shown(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if not k.startswith("_")}
