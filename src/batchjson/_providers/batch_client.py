"""What the batch APIs' clients share: requests to the provider's base URL with its key and pool.
A client only transports: each result line becomes a ``Reply`` or a ``ProviderError`` as the live
endpoint's would. A job's upload is built in a temporary file: a big job takes disk, not memory."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Mapping, Sequence
from tempfile import TemporaryFile
from typing import IO, Any

import aiohttp

from .._canon import read_json
from .._content.tasks import no_room
from .._errors import ConfigError, ProviderError, ProviderSetupError
from ._http import HttpProvider, http_error
from .pricing import batch_share
from .reply import Reply

WINDOW_HOURS = 24  # a job ends within this many hours, answered or expired (both providers)
LONGEST_ID = "bj_" + "0" * 48  # the length of every custom_id (_ledger/store_jobs._custom_id)
NOT_UTF8 = "__not_utf8__"  # an output line's first byte that is not UTF-8 (OutputLines)
TEXT = "__text__"  # an output line's own text (OutputLines)


class BatchClient:
    """The batch endpoints under ``provider``'s base URL: ``answer`` finds a line's status and
    body, which ``outcome`` reads as the provider reads a live answer."""

    protocol = ""
    max_requests = 0
    max_bytes = 0  # the provider's ceiling on one job's upload
    jobs_path = ""  # the batches: GET it to list (exactly when the batch API exists)
    frame = (b"", b"", b"\n", b"")  # an Upload's head, between two lines, after each, tail
    line_head: Mapping[str, str] = {}  # a line's fields between its custom_id and its body
    body_field = "body"
    reply_at: tuple[str, ...] = ()  # where in a line's text its reply's body is

    def __init__(self, provider: HttpProvider) -> None:
        self.provider = provider
        self.endpoint = provider.base_url  # what may be shown of where jobs go
        self.share = batch_share(provider.model, provider.prices)

    def lines_that_fit(self, calls: list[Any]) -> int:
        """How many of ``calls``, from the first, one job's upload holds (at least one)."""
        room = self.max_bytes - 64  # the request's own wrapping
        for taken, call in enumerate(calls):
            room -= len(json.dumps(self.line(LONGEST_ID, call)[0]).encode()) + 2
            if room < 0:
                return max(1, taken)
        return len(calls)

    def line(self, custom_id: str, call: Any) -> tuple[dict[str, Any], bool]:
        """A request's line in the upload, and whether a scalar answer was wrapped."""
        body, wrapped = self.provider.request_body(call)
        return {"custom_id": custom_id, **self.line_head, self.body_field: body}, wrapped

    def finished(self, upload: Upload) -> IO[bytes]:
        """The whole upload, refused when over the provider's ceiling on one job."""
        data = upload.finish()
        if upload.size > self.max_bytes:
            raise ProviderError(  # lines_that_fit sizes jobs: only one request can be too big
                f"{self.protocol}: a job's upload of {upload.size} bytes is over the provider's "
                f"ceiling of {self.max_bytes} even with one request; send a smaller pack, or "
                "this batch live (transport='live')", retryable=False)
        return data

    async def _call(self, method: str, path: str, body: Any = None) -> bytes:
        """``body``: a dict sent as JSON, JSON already encoded (bytes or a file), or a form."""
        p = self.provider
        base, headers = (p._endpoint.get() or p.url).removesuffix(p.path), None
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        elif isinstance(body, aiohttp.FormData):
            def headers() -> dict[str, str]:  # multipart: aiohttp sets the content type
                return {k: v for k, v in p._headers().items() if k != "Content-Type"}
        return (await p._request(method, base + path, body, headers))[1]

    async def _json(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        raw = await self._call(method, path, body)
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ProviderError(f"{self.protocol}: {method} {path} did not answer a JSON "
                                "object", retryable=True)
        return data

    async def check(self) -> None:
        """Refuse a base URL without the batch endpoints before anything is recorded."""
        try:
            await self._json("GET", f"{self.jobs_path}?limit=1")
        except ProviderError as exc:
            if exc.status in (404, 405, 501):
                raise ProviderSetupError(
                    f"{self.provider.base_url} has no Batch API (GET {self.jobs_path} answered "
                    f"HTTP {exc.status}); use transport='live' with this server, or an "
                    "endpoint with the provider's batch endpoints") from None
            raise

    async def find(self, uid: str, since: float) -> dict[str, Any] | None:
        """The job created with ``uid`` in its metadata after ``since`` (unix seconds), if any."""
        return None

    async def poll(self, job_id: str) -> dict[str, Any]:
        return await self._json("GET", f"{self.jobs_path}/{job_id}")

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._json("POST", f"{self.jobs_path}/{job_id}/cancel")

    @staticmethod
    def counts(batch: Mapping[str, Any]) -> dict[str, Any]:
        return dict(batch.get("request_counts") or {})

    def progress(self, batch: Mapping[str, Any]) -> tuple[int, int] | None:
        """(lines ended, lines in all) as the provider counts them; None when it counts none."""
        counts = self.counts(batch)
        total = counts.get("total")
        if not isinstance(total, int) or total <= 0:
            return None
        return sum(v for k, v in counts.items() if k in ("completed", "failed")
                   and isinstance(v, int)), total

    @staticmethod
    def whole_failure(batch: Mapping[str, Any]) -> str | None:
        """Why a job failed as a whole, else None."""
        return None

    @staticmethod
    def too_large(batch: Mapping[str, Any]) -> bool:
        """Whether a job failed for holding more tokens than the provider takes at once."""
        return False

    def outcome(self, line: Mapping[str, Any], wrapped: bool) -> Reply | ProviderError:
        """One result line's reply, or its error as the live endpoint's would be."""
        found = self.answer(line)
        if isinstance(found, ProviderError):
            return found
        status, body = found
        p = self.provider
        if status >= 400:
            return http_error(p.name, status, {}, json.dumps(body).encode(), p._secrets,
                              p.key_env)
        try:
            return p.read_reply(body, line.get(TEXT), wrapped, at=self.reply_at,
                                price_factor=self.share)
        except ProviderError as exc:
            return exc

    @staticmethod
    def line_id(line: Any) -> str | None:
        """A line's ``custom_id``; one that is no string as its JSON text (never one of ours)."""
        cid = line.get("custom_id") if isinstance(line, dict) else None
        return cid if cid is None or isinstance(cid, str) else json.dumps(cid)[:200]


class OutputLines:
    """A job's result files as lines, parsed anew on each iteration (only bytes are held): an object
    keeps its text under :data:`TEXT` (:data:`NOT_UTF8` if not UTF-8), any other line is text."""

    def __init__(self, files: Sequence[bytes]) -> None:
        self.files = files

    def __iter__(self) -> Iterator[Any]:
        for raw in self.files:
            for line in io.BytesIO(raw):
                try:
                    text, bad = line.decode("utf-8"), None
                except UnicodeDecodeError as exc:
                    text, bad = line.decode("utf-8", "replace"), exc.start
                text = text.rstrip("\r\n")
                if not text.strip():
                    continue
                try:
                    parsed = read_json(text)
                except ValueError:
                    parsed = None
                yield ({**parsed, TEXT: text, **({} if bad is None else {NOT_UTF8: bad})}
                       if isinstance(parsed, dict) else text)


WHAT = "for a batch job's upload"


class Upload:
    """One job's upload in a temporary file: ``head``, lines (``sep`` between, ``end`` after),
    ``tail``. No file is a ConfigError before the job is recorded; a refused write fails finish."""

    def __init__(self, head: bytes, sep: bytes, end: bytes, tail: bytes) -> None:
        try:
            self.file: IO[bytes] = TemporaryFile(prefix="batchjson-upload-")
        except OSError as exc:
            raise ConfigError(f"{no_room(WHAT, exc)}, and run again; this job was not recorded and "
                              "nothing was spent for it") from exc
        self.sep, self.end = sep, end
        self.tail: bytes | None = tail  # None once written
        self.lines = 0  # lines added
        self.size = 0  # bytes of the whole upload, head and tail included
        self.failed: OSError | None = None
        self._write(head)

    def add(self, text: str) -> None:
        self._write((self.sep if self.lines else b"") + text.encode() + self.end)
        self.lines += 1

    def finish(self) -> IO[bytes]:
        """The whole upload, or a retryable ProviderError when the disk refused a write."""
        if self.tail is not None:
            self._write(self.tail)
            self.tail = None
        try:
            self.file.seek(0)  # flushed first
        except OSError as exc:
            self.failed = self.failed or exc
        if self.failed is not None:
            raise ProviderError(f"{no_room(WHAT, self.failed)}; its requests are sent again later",
                                retryable=True)
        return self.file

    def _write(self, data: bytes) -> None:
        self.size += len(data)
        if self.failed is None:
            try:
                self._put(data)
            except OSError as exc:
                self.failed = exc

    def _put(self, data: bytes) -> None:
        self.file.write(data)

    def close(self) -> None:
        self.file.close()
