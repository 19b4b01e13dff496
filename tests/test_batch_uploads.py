"""A batch job's upload streamed from a temporary file: the very bytes a job sent when it was
held as text, and a disk with no room either refused before anything is recorded or handled as
a failed upload (nothing lost, sent again later)."""

from __future__ import annotations

import errno
import json
from typing import Any

import pytest

from batchjson._errors import ConfigError
from batchjson._providers import batch_client as upload_module
from batchjson.testing import LoopbackServer
from tests.helpers import ledger_rows
from tests.test_batch_jobs import PROTOCOLS, SCHEMA, session, tasks

ODD = "caf\u00e9 \u2603 \u65e5\u672c line\u2028separator\u2029paragraph \U0001f600"


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def sent_bodies(srv: LoopbackServer, protocol: str) -> list[bytes]:
    """Each job's upload as the server received it."""
    if protocol == "anthropic":
        return list(srv.batches.messages.bodies)
    return [srv.batches.contents[b["input_file_id"]] for b in srv.batches.batches.values()]


@pytest.fixture
def srv():
    with LoopbackServer() as server:
        server.batches.delay = 0.1
        yield server


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_upload_streamed_from_disk_is_each_lines_compact_json_byte_for_byte(srv, protocol,
                                                                              tmp_path):
    """Non-ASCII text and U+2028/U+2029 go as the JSON escapes the in-memory upload sent; the
    framing (JSON Lines, or ``{"requests":[...]}``) is unchanged."""
    work = [{**t, "prompt": f"{t['prompt']} {ODD}"} for t in tasks(5)]
    s = session(srv, ledger=tmp_path / "l.sqlite", protocol=protocol)
    result = s.run_batch("labels", work, SCHEMA, transport="batch", wait=True)
    assert result.resolved and len(result.values) == 5
    [body] = sent_bodies(srv, protocol)
    assert body.isascii() and b"\\u2028" in body and b"caf\\u00e9" in body
    if protocol == "anthropic":
        lines = json.loads(body)["requests"]
        assert body == b'{"requests":[' + b",".join(map(compact, lines)) + b"]}"
    else:
        lines = [json.loads(line) for line in body.split(b"\n")[:-1]]
        assert body == b"".join(compact(line) + b"\n" for line in lines)
    assert len(lines) == 5
    s.close()


def test_no_room_for_an_upload_file_is_a_config_error_naming_tmpdir_before_anything_is_recorded(
        srv, tmp_path, monkeypatch):
    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(upload_module, "TemporaryFile", full)
    target = tmp_path / "l.sqlite"
    s = session(srv, ledger=target)
    with pytest.raises(ConfigError, match="no room for a batch job's upload.*set TMPDIR"):
        s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    assert ledger_rows(target, "SELECT COUNT(*) FROM jobs") == [(0,)]
    assert ledger_rows(target, "SELECT COUNT(*) FROM attempts") == [(0,)]
    assert srv.batches.created == 0 and not srv.batches.contents
    s.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_disk_filling_while_a_recorded_job_is_written_cancels_it_unsent_and_a_rerun_sends_it(
        srv, protocol, tmp_path, monkeypatch):
    """The job was recorded before its lines could be written: it is cancelled as never sent
    (as a failed upload is), its reservations released, and the next run sends every request
    once."""
    def full(self: Any, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(upload_module.Upload, "_put", full)
    target = tmp_path / "l.sqlite"
    s = session(srv, ledger=target, protocol=protocol)
    failed = s.run_batch("labels", tasks(4), SCHEMA, transport="batch", on_exhausted="return")
    assert failed.status == "unresolved" and not failed.jobs
    assert any("was not submitted" in note and "no room for a batch job's upload" in note
               and "set TMPDIR" in note for note in failed.notes), failed.notes
    [job] = s.ledger.store.jobs(every=True)
    assert job["status"] == "cancelled" and job["provider_job_id"] is None
    assert srv.batches.created == 0 and not sent_bodies(srv, protocol)
    assert s.ledger.spend("labels")["calls"] == 0
    monkeypatch.undo()
    again = s.run_batch("labels", tasks(4), SCHEMA, transport="batch", wait=True)
    assert again.resolved and len(again.values) == 4
    rows = ledger_rows(target, "SELECT request_key, COUNT(*) FROM attempts WHERE status = "
                       "'accepted' GROUP BY request_key")
    assert {count for _, count in rows} == {1}
    s.close()


def test_a_full_disk_while_recording_a_created_jobs_id_is_tried_again_and_never_pays_twice(
        srv, tmp_path, monkeypatch):
    """The provider created (and bills) the job; its id is the one record that cannot be made
    later. A disk full for a moment: written when it clears, the job collected, sent once."""
    from batchjson._errors import LedgerError
    from batchjson._ledger.store import Store

    failures, submitted = [2], Store.job_submitted

    def full_for_a_moment(self: Any, *args: Any) -> bool:
        if failures[0]:
            failures[0] -= 1
            raise LedgerError("disk full", cause=OSError(errno.ENOSPC, "No space left"))
        return submitted(self, *args)

    monkeypatch.setattr(Store, "job_submitted", full_for_a_moment)
    s = session(srv, ledger=tmp_path / "l.sqlite")
    result = s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    assert result.resolved and srv.batches.created == 1
    s.close()


def test_a_created_job_whose_id_never_reaches_the_disk_is_named_in_the_error(
        srv, tmp_path, monkeypatch):
    from batchjson._errors import LedgerError
    from batchjson._ledger.store import Store
    from batchjson._replay import jobs

    def full(self: Any, *args: Any) -> bool:
        raise LedgerError("disk full", cause=OSError(errno.ENOSPC, "No space left"))

    monkeypatch.setattr(Store, "job_submitted", full)
    monkeypatch.setattr(jobs, "RECORD_CREATED_WAITS", (0.0, 0.0))
    s = session(srv, ledger=tmp_path / "l.sqlite")
    with pytest.raises(LedgerError) as raised:
        s.run_batch("labels", tasks(3), SCHEMA, transport="batch", wait=True)
    [created] = srv.batches.batches
    assert created in str(raised.value) and "cancel the job at the provider" in str(raised.value)
    assert "No space left" in str(raised.value) and srv.batches.created == 1
    s.close()
