"""OpenAI's Batch API as a transport: a JSONL file of chat-completion requests, one batch over it,
its output and error files. Lines come in any order with their ``custom_id``; ``completed`` says
only that the batch stopped, not that any line succeeded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from .._errors import ProviderError
from .._secrets import provider_text_masked
from .base import Call
from .batch_client import BatchClient, OutputLines
from .reply import Reply
from .upload import Upload

RUNNING = frozenset(("validating", "in_progress", "finalizing", "cancelling"))


class OpenAIBatches(BatchClient):
    """The Files and Batches endpoints of the provider's base URL, with its key and pool."""

    protocol = "openai-batch"
    max_requests = 50_000
    max_bytes = 200 * 1024 * 1024
    url = "/v1/chat/completions"
    running = RUNNING
    jobs_path = "/batches"

    def line(self, custom_id: str, call: Call) -> tuple[dict[str, Any], bool]:
        """One request of the input file, and whether its value was wrapped."""
        body, wrapped = self.provider.request_body(call)
        return {"custom_id": custom_id, "method": "POST", "url": self.url,
                "body": body}, wrapped

    async def upload(self, upload: Upload) -> str:
        """Upload the input file (streamed from the job's file on disk); its id. Nothing is
        billed for a file."""
        data = upload.finish()
        if upload.size > self.max_bytes:
            raise ProviderError(f"openai batch: input file over {self.max_bytes} bytes",
                                retryable=False)
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", data, filename="batchjson.jsonl",
                       content_type="application/jsonl")
        return str((await self._json("POST", "/files", body=form))["id"])

    async def create(self, file_id: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        return await self._json("POST", "/batches", json_body={
            "input_file_id": file_id, "endpoint": self.url, "completion_window": "24h",
            "metadata": dict(metadata)})

    async def find(self, uid: str, since: float) -> dict[str, Any] | None:
        """The batch whose metadata names ``uid``: the batches are listed newest first, a page
        of 100 at a time (``after`` the last one seen), back to ``since``."""
        after = ""
        while True:
            page = await self._json("GET", f"/batches?limit=100{after}")
            data = [b for b in page.get("data") or () if isinstance(b, dict)]
            for batch in data:
                if (batch.get("metadata") or {}).get("batchjson_job") == uid:
                    return batch
            oldest = data[-1].get("created_at") if data else None
            if not page.get("has_more") or not data or (
                    isinstance(oldest, (int, float)) and oldest < since):
                return None
            after = f"&after={quote(str(data[-1].get('id')), safe='')}"

    @staticmethod
    def status(batch: Mapping[str, Any]) -> str:
        return str(batch.get("status"))

    @staticmethod
    def whole_failure(batch: Mapping[str, Any]) -> str | None:
        """Why a batch failed as a whole (validation, token_limit_exceeded), else None."""
        if batch.get("status") != "failed":
            return None
        errors = (batch.get("errors") or {}).get("data") or []
        return provider_text_masked("; ".join(f"{e.get('code')}: {e.get('message')}"
                                              for e in errors if isinstance(e, dict))
                                    or "no reason given")

    @staticmethod
    def too_large(batch: Mapping[str, Any]) -> bool:
        errors = (batch.get("errors") or {}).get("data") or []
        return any(isinstance(e, dict) and e.get("code") == "token_limit_exceeded"
                   for e in errors)

    async def results(self, batch: Mapping[str, Any]) -> OutputLines:
        """The lines of the output and error files (either may be absent), each parsed when
        read; a line that is not JSON is kept as its text, for the runner to name."""
        files = []
        for field in ("output_file_id", "error_file_id"):
            file_id = batch.get(field)
            if file_id:
                files.append(await self._call("GET", f"/files/{file_id}/content"))
        return OutputLines(files)

    def answer(self, line: Mapping[str, Any]) -> tuple[int, Any] | ProviderError:
        """A line's ``response``: its status and body; a line without a 2xx or an HTTP error
        status (an ``error`` of its own) is a provider error."""
        response = line.get("response") or {}
        error = line.get("error")
        status = response.get("status_code") if isinstance(response, dict) else None
        body = response.get("body") if isinstance(response, dict) else None
        if isinstance(status, int) and status >= 400:
            return status, body
        if error or not isinstance(status, int) or not 200 <= status < 300:
            what = error if isinstance(error, dict) else {"message": str(error)}
            said = f"{what.get('code') or ''} {what.get('message') or 'no response'}"
            return ProviderError(f"openai batch line failed: {provider_text_masked(said.strip())}",
                                 status=status, retryable=True)
        if not isinstance(body, dict):
            return ProviderError("openai batch line has no response body", status=status,
                                 retryable=True)
        return status, body

    def read(self, line: Mapping[str, Any], body: Mapping[str, Any], wrapped: bool) -> Reply:
        return self.provider.read_reply(body, wrapped, price_factor=self.share)
