"""Anthropic's Message Batches as a transport: ``requests: [{custom_id, params}]`` in the creation's
body, results (JSONL, once ended) in any order. There is no file to upload: ``upload`` only stages
the requests, so a failure before the batch is created has created nothing."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .._errors import ProviderError
from ._http import ITEMS_NAME, WRAPPED_VALUE
from .base import Call
from .batch_client import TEXT, BatchClient, OutputLines
from .reply import Reply
from .upload import Upload

# Anthropic error types and the HTTP status each stands for on the live endpoint.
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401,
                "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529}


class AnthropicBatches(BatchClient):
    """The Message Batches endpoints of an AnthropicProvider's base URL."""

    protocol = "anthropic-batch"
    max_requests = 100_000
    max_bytes = 256 * 1024 * 1024
    running = frozenset(("in_progress", "canceling"))
    jobs_path = "/v1/messages/batches"
    frame = (b'{"requests":[', b",", b"", b"]}")

    def __init__(self, provider: Any) -> None:
        super().__init__(provider)
        self._staged: dict[str, Upload] = {}  # a creation's body, by its upload token

    def _base(self) -> str:
        return super()._base().removesuffix("/v1")

    def line(self, custom_id: str, call: Call) -> tuple[dict[str, Any], bool]:
        body, _, wrapped = self.provider.request_body(call)
        return {"custom_id": custom_id, "params": body}, wrapped

    async def upload(self, upload: Upload) -> str:
        """Stage the requests (the job's file on disk) as the body of the batch's creation,
        streamed from that file when it is created."""
        upload.finish()
        if upload.size > self.max_bytes:
            raise ProviderError(f"anthropic batch: requests over {self.max_bytes} bytes",
                                retryable=False)
        token = uuid.uuid4().hex
        self._staged[token] = upload
        return token

    async def create(self, staged: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        return await self._json("POST", "/v1/messages/batches",
                                json_text=self._staged.pop(staged).finish())

    @staticmethod
    def status(batch: Mapping[str, Any]) -> str:
        """``processing_status``, with an ended batch that was asked to cancel said so."""
        status = str(batch.get("processing_status"))
        if status == "ended":
            return "cancelled" if batch.get("cancel_initiated_at") else "completed"
        return status

    async def results(self, batch: Mapping[str, Any]) -> OutputLines:
        """The result lines, each parsed when read."""
        return OutputLines([await self._call("GET", f"/v1/messages/batches/{batch['id']}/"
                                              "results")])

    def answer(self, line: Mapping[str, Any]) -> tuple[int, Any] | ProviderError:
        """A ``succeeded`` line's message; an ``errored`` one's error at the status its type has on
        the live endpoint; ``canceled`` and ``expired`` lines are still owed."""
        result = line.get("result") if isinstance(line.get("result"), dict) else {}
        kind = result.get("type")
        if kind == "succeeded" and isinstance(result.get("message"), dict):
            return 200, result["message"]
        if kind == "errored":
            error = result.get("error") or {}
            return ERROR_STATUS.get((error.get("error") or {}).get("type"), 500), error
        if kind in ("canceled", "expired"):
            return ProviderError(f"anthropic batch line {kind} before it was answered",
                                 retryable=True)
        return ProviderError(f"anthropic batch line of unknown result type {kind!r}",
                             retryable=True)

    def read(self, line: Mapping[str, Any], body: Mapping[str, Any], wrapped: bool) -> Reply:
        """The message, with the line's own text kept so a tool input is its exact text."""
        tool = (WRAPPED_VALUE if wrapped else ITEMS_NAME) if self.provider.mode == "tool" else None
        return self.provider.read_reply(body, line.get(TEXT), tool, wrapped,
                                        at=("result", "message"), price_factor=self.share)
