"""OpenAI's Files and Batches endpoints and Anthropic's Message Batches on the loopback server,
answered by its simulated model (the two share the desk's faults, timing and line answers).

A batch runs on the server's loop: ``validating``, then ``in_progress`` for ``delay`` seconds
(by default a job ends within about a second), then each line is answered as a chat completion
would be and the batch ends ``completed`` with an output and an error file. Faults are given
per batch, in the order batches are created: ``whole`` (``"fail_validation"``,
``"token_limit"``, ``"expire"``, ``"all_failed"``) and ``lines`` (line index -> ``"errored"``,
``"expired"``, ``"http_400"``, ``"duplicate"``, ``"unknown"``), and ``shuffle`` reverses the
output order. ``refuse_results`` (an HTTP status) answers every job's output with it;
``upload_delay`` slows each upload and creation (a large file, a slow link).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol

from aiohttp import web

from ._bodies import request_id, token
from ._requests import anthropic_ask, openai_ask
from ._wire import error_response


class Server(Protocol):
    """What the desk uses of the server that holds it (``server.py``, which imports this)."""

    requests: int
    model: Any

    async def _answer(self, protocol: str, ask: Any, rid: str) -> Any: ...

    def payload(self, protocol: str, ask: Any, *outcome: Any) -> Any: ...


WHOLE_FAULTS = {"fail_validation", "token_limit", "expire", "all_failed"}
LINE_FAULTS = {"errored", "expired", "http_400", "duplicate", "unknown"}


@dataclass
class BatchFaults:
    """Faults of one batch (the n-th created takes the n-th ``BatchFaults`` of the desk)."""

    whole: str | None = None
    lines: dict[int, str] = field(default_factory=dict)
    shuffle: bool = False

    def __post_init__(self) -> None:
        # a misspelled fault would inject nothing and let the test that asked for it pass
        wrong = {self.whole} - WHOLE_FAULTS - {None} | set(self.lines.values()) - LINE_FAULTS
        if wrong:
            raise ValueError(f"unknown batch fault(s) {sorted(map(str, wrong))}: the faults are "
                             f"whole={sorted(WHOLE_FAULTS)} and lines={sorted(LINE_FAULTS)}")


class BatchDesk:
    """Files and batches kept in memory for the server's life."""

    def __init__(self, server: Server, delay: float = 0.3) -> None:
        self.server = server
        self.delay = delay
        self.faults: list[BatchFaults] = []
        self.files: dict[str, dict[str, Any]] = {}
        self.contents: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.created = 0  # batches created (so a test can say nothing was submitted)
        self.page_limit = 100  # the most batches one page of the list holds (tests lower it)
        self.listed = 0  # pages of the batch list served
        self.lines_answered: Counter[str] = Counter()  # custom_id -> times answered
        self.refuse_results: int | None = None  # an HTTP status every job's output answers
        self.upload_delay = 0.0  # seconds an upload, and a batch's creation, take once received
        self._tasks: set[asyncio.Task] = set()
        self._made: Counter[str] = Counter()
        self.messages = MessageBatches(self)  # Anthropic's Message Batches

    def token(self, kind: str) -> str:
        """The next id of ``kind`` on this server, the same in every run (notebooks show them)."""
        self._made[kind] += 1
        return token(f"{kind}:{self._made[kind]}", 24)

    def routes(self, app: web.Application) -> None:
        self.messages.routes(app)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files", self._files)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_get("/v1/files/{id}", self._file)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches", self._list)
        app.router.add_get("/v1/batches/{id}", self._get)
        app.router.add_post("/v1/batches/{id}/cancel", self._cancel)

    def _keep(self, data: bytes, purpose: str, filename: str) -> dict[str, Any]:
        file_id = "file-" + self.token("file")
        self.files[file_id] = {"id": file_id, "object": "file", "bytes": len(data),
                               "created_at": int(time.time()), "filename": filename,
                               "purpose": purpose, "status": "processed"}
        self.contents[file_id] = data
        return self.files[file_id]

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch" or not hasattr(upload, "file"):
            return error_response("openai", 400, "expected purpose=batch and a file")
        data = upload.file.read()
        await asyncio.sleep(self.upload_delay)
        return web.json_response(self._keep(data, "batch", upload.filename or "input.jsonl"))

    async def _content(self, request: web.Request) -> web.StreamResponse:
        data = self.contents.get(request.match_info["id"])
        if self.refuse_results and self.files.get(request.match_info["id"], {}).get(
                "purpose") == "batch_output":
            return error_response("openai", self.refuse_results, "loopback: refused")
        if data is None:
            return error_response("openai", 404, "No such File object")
        return web.Response(body=data, content_type="application/octet-stream")

    @staticmethod
    def _found(table: dict[str, Any], request: web.Request, what: str
               ) -> dict[str, Any] | web.Response:
        """The object the path names, or the API's 404 for it."""
        item = table.get(request.match_info["id"])
        return item if item is not None else error_response("openai", 404,
                                                            f"No such {what} object")

    async def _files(self, request: web.Request) -> web.Response:
        """As OpenAI lists files: ``purpose`` filters, ``order`` (default ``desc``), ``limit``
        (1 to 10,000) at a time, ``after`` the id of the last one of the previous page."""
        query = request.query
        files = [f for f in self.files.values() if query.get("purpose") in (None, f["purpose"])]
        if query.get("order", "desc") == "desc":
            files.reverse()  # created in order, so newest last
        after = query.get("after")
        if after is not None:
            ids = [f["id"] for f in files]
            files = files[ids.index(after) + 1:] if after in ids else []
        limit = query.get("limit", "10000")
        if not (limit.isdigit() and 1 <= int(limit) <= 10_000) or query.get(
                "order", "desc") not in ("asc", "desc"):
            return error_response("openai", 400, "limit must be 1 to 10000, order asc or desc")
        page = files[:int(limit)]
        return web.json_response({
            "object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(files) > len(page)})

    async def _file(self, request: web.Request) -> web.Response:
        meta = self._found(self.files, request, "File")
        return meta if isinstance(meta, web.Response) else web.json_response(meta)

    async def _create(self, request: web.Request) -> web.Response:
        data = await request.json()
        await asyncio.sleep(self.upload_delay)
        file_id = data.get("input_file_id")
        if file_id not in self.contents or data.get("completion_window") != "24h":
            return error_response("openai", 400, "input_file_id must name an uploaded file and "
                                  "completion_window must be 24h")
        faults = self._faults()
        now = int(time.time())
        batch = {"id": "batch_" + self.token("batch"), "object": "batch",
                 "endpoint": data.get("endpoint"), "errors": None, "input_file_id": file_id,
                 "completion_window": "24h", "status": "validating", "output_file_id": None,
                 "error_file_id": None, "created_at": now, "in_progress_at": None,
                 "expires_at": now + 86400, "finalizing_at": None, "completed_at": None,
                 "failed_at": None, "expired_at": None, "cancelling_at": None,
                 "cancelled_at": None, "request_counts": {"total": 0, "completed": 0,
                                                          "failed": 0},
                 "metadata": data.get("metadata")}
        self.batches[batch["id"]] = batch
        self._schedule(self._run(batch, faults))
        return web.json_response(batch)

    async def _list(self, request: web.Request) -> web.Response:
        """As OpenAI lists batches: newest first, ``limit`` (1 to 100, default 20) at a time,
        ``after`` the id of the last one of the previous page."""
        try:
            limit = int(request.query.get("limit", 20))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            return error_response("openai", 400, "limit must be an integer from 1 to 100")
        newest = list(reversed(self.batches.values()))  # created in order, so newest last
        after = request.query.get("after")
        if after is not None:
            ids = [b["id"] for b in newest]
            if after not in ids:
                return error_response("openai", 400, f"No such Batch object: {after}")
            newest = newest[ids.index(after) + 1:]
        page = newest[:min(limit, self.page_limit)]
        self.listed += 1
        return web.json_response({
            "object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(newest) > len(page)})

    async def _get(self, request: web.Request) -> web.Response:
        batch = self._found(self.batches, request, "Batch")
        return batch if isinstance(batch, web.Response) else web.json_response(batch)

    async def _cancel(self, request: web.Request) -> web.Response:
        batch = self._found(self.batches, request, "Batch")
        if isinstance(batch, web.Response):
            return batch
        if batch["status"] in ("validating", "in_progress", "finalizing"):
            batch["status"], batch["cancelling_at"] = "cancelling", int(time.time())
        return web.json_response(batch)

    # -- running a batch -----------------------------------------------------------------------
    def _faults(self) -> BatchFaults:
        faults = self.faults[self.created] if self.created < len(self.faults) else BatchFaults()
        self.created += 1
        return faults

    def _schedule(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _lines(self, lines: list[dict[str, Any]], faults: BatchFaults,
                     answer: Any, lost: Any) -> tuple[list, list]:
        """Every line answered (``answer(line, fault)``) or lost (``lost(line, code)``), with
        the batch's line faults: (output lines, error lines)."""
        output, errors = [], []
        for index, line in enumerate(lines):
            fault = "expired" if faults.whole == "expire" else faults.lines.get(index)
            if faults.whole == "all_failed":
                fault = "errored"
            if fault == "expired":
                errors.append(lost(line, "expired"))
                continue
            out = await answer(line, fault)
            (errors if fault in ("errored", "http_400") else output).append(out)
            if fault == "duplicate":
                output.append(dict(out))
            if fault == "unknown":
                output.append(dict(out, custom_id="bj_" + "0" * 48))
        if faults.shuffle:
            output.reverse()
        return output, errors

    async def _run(self, batch: dict[str, Any], faults: BatchFaults) -> None:
        lines = [json.loads(t) for t in self.contents[batch["input_file_id"]].splitlines()
                 if t.strip()]
        batch["request_counts"]["total"] = len(lines)
        await asyncio.sleep(self.delay / 3)
        if faults.whole in ("fail_validation", "token_limit"):
            code = ("token_limit_exceeded" if faults.whole == "token_limit"
                    else "invalid_request")
            batch.update(status="failed", failed_at=int(time.time()), errors={
                "object": "list", "data": [{"code": code, "message": f"loopback: {code}",
                                            "param": None, "line": None}]})
            return
        if batch["status"] != "cancelling":
            batch.update(status="in_progress", in_progress_at=int(time.time()))
            await asyncio.sleep(self.delay * 2 / 3)
        if batch["status"] == "cancelling":
            return await self._finish(batch, [], [self._lost(line, "cancelled")
                                                  for line in lines], "cancelled")
        output, errors = await self._lines(lines, faults, self._answer, self._lost)
        await self._finish(batch, output, errors, "expired" if faults.whole == "expire"
                           else "completed")

    async def _finish(self, batch: dict[str, Any], output: list, errors: list,
                      status: str) -> None:
        """Counted, then ``finalizing`` for a third of ``delay`` (a poll sees it, as at
        OpenAI), then ended with its files."""
        batch["request_counts"].update(completed=len(output), failed=len(errors))
        if status != "cancelled":
            batch.update(status="finalizing", finalizing_at=int(time.time()))
            await asyncio.sleep(self.delay / 3)
        for name, rows in (("output_file_id", output), ("error_file_id", errors)):
            if rows:
                data = "".join(json.dumps(r) + "\n" for r in rows).encode()
                batch[name] = self._keep(data, "batch_output", f"{name}.jsonl")["id"]
        batch["status"] = status
        batch[{"completed": "completed_at", "expired": "expired_at",
               "cancelled": "cancelled_at"}[status]] = int(time.time())

    @staticmethod
    def _lost(line: dict[str, Any], why: str) -> dict[str, Any]:
        code = f"batch_{why}"
        return {"id": _line_id(line), "custom_id": line.get("custom_id"), "response": None,
                "error": {"code": code, "message": f"loopback: {code}"}}

    def _number(self, line: dict[str, Any], protocol: str) -> str:
        server = self.server
        server.requests += 1
        self.lines_answered[str(line.get("custom_id"))] += 1
        return request_id(protocol, server.requests)

    async def _answer(self, line: dict[str, Any], fault: str | None) -> dict[str, Any]:
        """One line answered as the chat-completions endpoint answers its body."""
        rid = self._number(line, "openai")
        out = {"id": _line_id(line), "custom_id": line.get("custom_id"), "error": None}
        if fault in ("errored", "http_400"):
            status = 500 if fault == "errored" else 400
            body = {"error": {"message": f"loopback: {fault} line", "type": "invalid_request"
                              if status == 400 else "server_error", "param": None,
                              "code": None}}
            out["response"] = {"status_code": status, "request_id": rid, "body": body}
            return out
        server = self.server
        ask = openai_ask(line.get("body") or {}, server.model.model)
        outcome = await server._answer("openai", ask, rid)
        if isinstance(outcome, web.Response):
            body = json.loads(outcome.body)
            out["response"] = {"status_code": outcome.status, "request_id": rid, "body": body}
            return out
        payload = server.payload("openai", ask, *outcome, None)[1]
        out["response"] = {"status_code": 200, "request_id": rid, "body": payload}
        return out


def _line_id(line: dict[str, Any]) -> str:
    return "batch_req_" + token(f"line:{line.get('custom_id')}", 24)


CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
compact = partial(json.dumps, separators=(",", ":"))  # Anthropic's JSON has no spaces


def _stamp(offset: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).isoformat().replace("+00:00", "Z")


class MessageBatches:
    """Anthropic's Message Batches, kept in memory for the server's life: ``POST
    /v1/messages/batches``, its ``processing_status`` (``in_progress``, ``canceling``,
    ``ended``) and its results, JSONL from ``results_url`` once it has ended, each line's
    ``result.type`` ``succeeded``, ``errored``, ``canceled`` or ``expired``. Faults and timing
    are the desk's; a batch with the ``fail_validation`` fault is refused when it is created,
    as Anthropic validates then."""

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
