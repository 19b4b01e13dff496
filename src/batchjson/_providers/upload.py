"""A batch job's upload on disk: lines written to an unnamed temporary file as they are built and
sent from it, so a job of 50,000 lines takes disk, never the runner's memory. Lines are framed as
the provider wants (OpenAI: JSON Lines; Anthropic: ``{"requests":[...]}``)."""

from __future__ import annotations

from tempfile import TemporaryFile
from typing import IO

from .._content.spool import no_room, write_all
from .._errors import ConfigError, ProviderError

WRITE_BYTES = 1 << 16  # lines written to the file this many bytes at a time
WHAT = "for a batch job's upload"


class Upload:
    """One job's upload: ``head``, each line (``sep`` between, ``end`` after), then ``tail``. No
    temporary file is a ConfigError naming ``TMPDIR`` before the job is recorded; a write refused
    later is told by :meth:`finish` as a failed upload (the job cancelled unsent)."""

    def __init__(self, head: bytes, sep: bytes, end: bytes, tail: bytes) -> None:
        try:
            self.file: IO[bytes] = TemporaryFile(prefix="batchjson-upload-", buffering=0)
        except OSError as exc:
            raise ConfigError(f"{no_room(WHAT, exc)}, and run again; this job was not recorded and "
                              "nothing was spent for it") from exc
        self.sep, self.end = sep, end
        self.tail: bytes | None = tail  # None once written
        self.lines = 0  # lines added
        self.size = 0  # bytes of the whole upload, head and tail included
        self.failed: OSError | None = None
        self._unwritten, self._waiting = [head], len(head)

    def add(self, text: str) -> None:
        """One line's JSON text."""
        data = (self.sep if self.lines else b"") + text.encode() + self.end
        self.lines += 1
        self._unwritten.append(data)
        self._waiting += len(data)
        if self._waiting >= WRITE_BYTES:
            self._flush()

    def finish(self) -> IO[bytes]:
        """The whole upload, from its first byte: the file, or a ProviderError (retryable)
        when the disk refused a write. Called again, the same file from its start."""
        if self.tail is not None:
            self._unwritten.append(self.tail)
            self.tail = None
            self._flush()
        if self.failed is not None:
            raise ProviderError(f"{no_room(WHAT, self.failed)}; its requests are sent again later",
                                retryable=True)
        self.file.seek(0)
        return self.file

    def _flush(self) -> None:
        data = b"".join(self._unwritten)
        self._unwritten, self._waiting = [], 0
        self.size += len(data)
        if self.failed is None:
            try:
                self._put(data)
            except OSError as exc:
                self.failed = exc

    def _put(self, data: bytes) -> None:
        write_all(self.file, data)

    def close(self) -> None:
        self.file.close()

