"""Attacks on the windowed run: streaming must keep every promise a run holding its requests
in a list kept (nothing paid twice, nothing forgotten, the same values, errors and counts,
refusals before anything is spent).

Most tests shrink the window, the replay's feed and the spill size so a few dozen tasks cross
every boundary a million would; the boundary tests use the real sizes.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

import pytest
from pydantic import BaseModel, field_validator

from batchjson import CallableProvider, ConfigError, InvalidBatch, RunSpec, Session
from batchjson._content import tasks as spool
from batchjson._ledger import store_runs
from batchjson._replay import replay
from batchjson._session import window
from tests.helpers import LABEL_SCHEMA, answer, items_reply, ledger_rows, review_tasks


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of 8 requests, the replay fed 4 at a time, texts on disk past 300 characters."""
    monkeypatch.setattr(window, "WINDOW", 8)
    monkeypatch.setattr(replay, "FEED", 4)
    monkeypatch.setattr(spool, "SPILL_CHARS", 300)


def expected(tasks) -> dict:
    return {t["task_id"]: answer(t) for t in tasks}


def request_keys(path) -> list[str]:
    return [row[0] for row in ledger_rows(path, "SELECT key FROM requests ORDER BY id")]


def seventh_fails(item, task):
    """A validator that fails every seventh task, wherever its window falls."""
    if int(task["candidate_id"].rsplit("-", 1)[1]) % 7 == 0:
        raise ValueError("seventh candidate refused")


def outcome(result) -> tuple:
    """What a user reads of a run: status, counts, values, errors by task, calls per task."""
    errors = sorted((e.get("task_id"), e.get("type")) for e in result.errors)
    return (result.status, result.calls, result.resumed, dict(result.values), errors,
            dict(result.attempts_by_task), result.accepted_returns, result.rejected_returns)


# -- what the caller hands over -----------------------------------------------------------------

def test_a_task_dict_reused_and_mutated_after_each_yield_is_run_as_it_was_yielded(
        tmp_path, small_windows):
    tasks = review_tasks(50)
    result = Session(CallableProvider(items_reply), ledger=tmp_path / "g.sqlite").run_batch(
        "b", reusing(tasks), LABEL_SCHEMA, pack=3)
    listed = Session(CallableProvider(items_reply), ledger=tmp_path / "l.sqlite").run_batch(
        "b", tasks, LABEL_SCHEMA, pack=3)
    assert dict(result.values) == expected(tasks) and result.calls == 17
    assert request_keys(tmp_path / "g.sqlite") == request_keys(tmp_path / "l.sqlite")
    assert listed.revision == result.revision


def reusing(tasks):
    """One dict, refilled for every task: the caller keeps it and changes it after yielding."""
    task: dict = {}
    for t in tasks:
        task.clear()
        task.update(t)
        yield task


@pytest.mark.parametrize("pack", [1, 2])
def test_a_refused_task_of_a_reused_dict_is_named_as_it_was_yielded(pack):
    tasks, session = review_tasks(6), Session(CallableProvider(items_reply))
    with pytest.raises(InvalidBatch, match=r"candidate-127' \(tasks #0 and #3\)"):
        session.run_batch("b", reusing([*tasks[:3], dict(tasks[0], prompt=5), tasks[4]]),
                          LABEL_SCHEMA, pack=pack)
    with pytest.raises(InvalidBatch, match=r"candidate-129' holds a string that is not valid"):
        session.run_batch("b", reusing([*tasks[:2], dict(tasks[2], prompt="\ud800"),
                                        *tasks[3:]]), LABEL_SCHEMA, pack=pack)


def test_a_generator_that_raises_midway_records_and_spends_nothing(tmp_path, small_windows):
    tasks, path, sent = review_tasks(40), tmp_path / "r.sqlite", []

    def breaking():
        yield from tasks[:30]
        raise KeyError("source went away")

    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call)),
                      ledger=path)
    with pytest.raises(KeyError, match="source went away"):  # the caller's own error, as is
        session.run_batch("b", breaking(), LABEL_SCHEMA, pack=3)
    assert sent == [] and ledger_rows(path, "SELECT COUNT(*) FROM requests") == [(0,)]
    assert ledger_rows(path, "SELECT COUNT(*) FROM revisions") == [(0,)]
    assert session.run_batch("b", iter(tasks), LABEL_SCHEMA, pack=3).calls == 14


def test_a_generator_read_by_a_run_then_passed_again_is_refused_as_empty(tmp_path):
    tasks, path = review_tasks(12), tmp_path / "e.sqlite"
    stream = iter(tasks)
    session = Session(CallableProvider(items_reply), ledger=path)
    first = session.run_batch("b", stream, LABEL_SCHEMA, pack=2)
    before = ledger_rows(path, "SELECT id, status FROM attempts ORDER BY id")
    with pytest.raises(InvalidBatch, match="empty batch"):
        session.run_batch("b", stream, LABEL_SCHEMA, pack=2)
    assert ledger_rows(path, "SELECT id, status FROM attempts ORDER BY id") == before
    again = session.run_batch("b", iter(tasks), LABEL_SCHEMA, pack=2)  # a new one resumes
    assert again.calls == 0 and again.revision == first.revision


def test_ids_that_differ_only_in_unicode_normalization_are_two_tasks_and_an_int_is_refused(
        tmp_path, small_windows):
    composed = unicodedata.normalize("NFC", "caf\u00e9")
    decomposed = unicodedata.normalize("NFD", composed)
    tasks = [dict(t, task_id=t["task_id"] + suffix)
             for t, suffix in zip(review_tasks(2), (composed, decomposed), strict=True)]
    tasks += [dict(t, task_id=composed + "\u2028" + t["task_id"]) for t in review_tasks(30)[2:]]
    result = Session(CallableProvider(items_reply)).run_batch("b", iter(tasks), LABEL_SCHEMA,
                                                              pack=4)
    assert result.status == "resolved" and set(result.values) == {t["task_id"] for t in tasks}
    with pytest.raises(InvalidBatch, match=r"task #1: task_id must be a non-empty string, "
                                           r"got 1"):
        Session(CallableProvider(items_reply)).run_batch(
            "b", iter([dict(tasks[0], task_id="1"), dict(tasks[1], task_id=1)]), LABEL_SCHEMA)


def test_a_duplicate_id_far_across_the_spill_boundary_is_refused_before_any_call(
        tmp_path, small_windows):
    tasks, sent = review_tasks(200), []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call)),
                      ledger=tmp_path / "d.sqlite")
    with pytest.raises(InvalidBatch, match=r"candidate-128' \(tasks #1 and #200\)"):
        session.run_batch("b", iter([*tasks, tasks[1]]), LABEL_SCHEMA, pack=3)
    assert sent == [] and ledger_rows(tmp_path / "d.sqlite",
                                      "SELECT COUNT(*) FROM requests") == [(0,)]


def test_a_single_task_larger_than_the_spill_size_reaches_the_model_whole(tmp_path):
    big = "é\u2028" * (spool.SPILL_CHARS // 2 + 1000)  # past the spill on its own
    tasks = [*review_tasks(3)]
    tasks[1] = dict(tasks[1], prompt=tasks[1]["prompt"] + big)
    seen: list[str] = []

    def model(call):
        seen.extend(t["prompt"] for t in call.tasks)
        return items_reply(call)

    result = Session(CallableProvider(model), ledger=tmp_path / "big.sqlite").run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=2)
    assert result.status == "resolved" and dict(result.values) == expected(tasks)
    assert seen == [t["prompt"] for t in tasks]


# -- windows, feeds and packs at their edges ------------------------------------------------------

@pytest.mark.parametrize("count", [1000, 1001, 500, 501])
def test_a_run_at_the_real_window_and_feed_edges_resolves_each_request_once(tmp_path, count):
    tasks, sent = review_tasks(count), []
    result = Session(CallableProvider(lambda call: sent.append(call.tasks[0]["task_id"])
                                      or items_reply(call)), ledger=tmp_path / "e.sqlite",
                     concurrency=8).run_batch("b", (dict(t) for t in tasks), LABEL_SCHEMA, pack=1)
    assert result.status == "resolved" and result.calls == count
    assert sorted(sent) == sorted(t["task_id"] for t in tasks)  # each once, none forgotten
    assert dict(result.values) == expected(tasks)


@pytest.mark.parametrize(("count", "pack"), [(24, 3), (25, 3), (32, 1), (33, 1), (17, 5),
                                             (10, 3), (9, 4)])
def test_a_windowed_run_gives_the_values_errors_and_counts_of_one_window(
        tmp_path, monkeypatch, count, pack):
    """Windows of 8 requests, fed 4 at a time, against one window holding every request; a
    validator fails some tasks in every window."""
    tasks = review_tasks(count)

    def run(path):
        return Session(CallableProvider(items_reply), ledger=path, repairs=1, replays=0,
                       concurrency=3).run_batch(
            "b", iter(tasks), LABEL_SCHEMA, pack=pack, validator=seventh_fails,
            on_exhausted="return")

    whole = run(tmp_path / "whole.sqlite")
    monkeypatch.setattr(window, "WINDOW", 8)
    monkeypatch.setattr(replay, "FEED", 4)
    monkeypatch.setattr(spool, "SPILL_CHARS", 300)
    windowed = run(tmp_path / "windowed.sqlite")
    assert outcome(windowed) == outcome(whole)
    assert request_keys(tmp_path / "windowed.sqlite") == request_keys(tmp_path / "whole.sqlite")
    failing = {t["task_id"] for t in tasks if int(t["candidate_id"][-3:]) % 7 == 0}
    assert failing and {e["task_id"] for e in windowed.errors} >= failing
    again = run(tmp_path / "windowed.sqlite")  # a resume reads the ledger a page at a time
    monkeypatch.undo()
    assert outcome(again) == outcome(run(tmp_path / "whole.sqlite"))


def test_budget_exhausted_midway_through_a_window_then_resumed_pays_each_request_once(
        tmp_path, small_windows):
    tasks, path, sent = review_tasks(60), tmp_path / "b.sqlite", []

    def model(call):
        sent.append(tuple(t["task_id"] for t in call.tasks))
        return items_reply(call)

    first = Session(CallableProvider(model), ledger=path, concurrency=3).run(RunSpec(
        "b", iter(tasks), LABEL_SCHEMA, pack=2, max_calls=11, on_exhausted="return",
        refuse_short_budget=False))
    assert first.status == "unresolved" and first.calls == 11 and len(first.values) == 22
    again = Session(CallableProvider(model), ledger=path, concurrency=3).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=2)
    assert again.status == "resolved" and again.calls == 19 and again.resumed == 11
    assert len(sent) == len(set(sent)) == 30 and dict(again.values) == expected(tasks)


def test_requests_split_in_one_run_are_resumed_from_ledger_pages_paying_each_half_once(
        ledger_at, small_windows):
    """Halves share their parent's position: a page of positions holds a request and its
    halves together, across a resume that stopped midway."""
    tasks, path, sent = review_tasks(64), ledger_at(), []
    bad = {t["task_id"] for t in tasks[::9]}

    def model(call):  # a pack carrying a bad task is refused until it is alone
        ids = tuple(t["task_id"] for t in call.tasks)
        sent.append((call.request_key, ids))
        return "not json" if len(ids) > 1 and bad & set(ids) else items_reply(call)

    def run(**limits):
        return Session(CallableProvider(model, source="m"), ledger=path, repairs=0, replays=0,
                       concurrency=2).run(RunSpec(
            "b", iter(tasks), LABEL_SCHEMA, pack=4, split=True, on_exhausted="return",
            refuse_short_budget=False, **limits))

    first = run(max_calls=20)
    assert first.status == "unresolved" and first.calls == 20
    again = run()
    assert again.status == "resolved" and dict(again.values) == expected(tasks)
    keys = [key for key, _ in sent]
    assert len(keys) == len(set(keys)) == 8 + 8 * 5  # a bad pack: itself, 2 halves, 2 singles
    leaves = ledger_rows(path, "SELECT COUNT(*) FROM requests WHERE split = 0")[0][0]
    accepted = ledger_rows(path, "SELECT request_key FROM attempts WHERE status = 'accepted'")
    assert len(accepted) == len(set(accepted)) == leaves


# -- a full disk ---------------------------------------------------------------------------------

TEMPORARY_FILE = tempfile.TemporaryFile


def disk_with_room(room: int, spare_files: int = 0):
    """``tempfile.TemporaryFile`` on a disk that takes ``room`` bytes more, then fails every
    write with ENOSPC (a write that does not fit writes what does); the first ``spare_files``
    files made are on a disk with room."""
    left, made = [room], []

    class FullDisk:
        def __init__(self, *args, **kwargs) -> None:
            self._file = TEMPORARY_FILE(buffering=0)
            made.append(self)
            self._spare = len(made) <= spare_files

        def write(self, data) -> int:
            if self._spare:
                return self._file.write(data)
            if not left[0]:
                raise OSError(errno.ENOSPC, "No space left on device")
            taken = self._file.write(bytes(data[:left[0]]))
            left[0] -= taken
            return taken

        def flush(self) -> None:
            pass

        def fileno(self) -> int:
            return self._file.fileno()

        def close(self) -> None:
            self._file.close()

    return FullDisk


def no_file_to_be_had(*args, **kwargs):
    raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.parametrize("room", [0, 700, None])
def test_no_room_to_spill_tasks_is_a_batchjson_error_naming_tmpdir_before_anything_is_spent(
        tmp_path, monkeypatch, small_windows, room):
    monkeypatch.setattr(spool.tempfile, "TemporaryFile",
                        no_file_to_be_had if room is None else disk_with_room(room))
    path, sent = tmp_path / "full.sqlite", []
    session = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call)),
                      ledger=path)
    with pytest.raises(ConfigError, match="set TMPDIR to a directory on a disk with room"
                       ) as raised:
        session.run_batch("b", iter(review_tasks(40)), LABEL_SCHEMA, pack=3)
    assert ("Too many open files" if room is None else "No space left") in str(raised.value)
    assert sent == [] and ledger_rows(path, "SELECT COUNT(*) FROM requests") == [(0,)]


@pytest.mark.parametrize("room", [0, 700, None])
def test_no_room_to_spill_the_calls_log_midrun_loses_no_call_and_counts_each_one(
        tmp_path, monkeypatch, room):
    tasks, path = review_tasks(60), tmp_path / "log.sqlite"
    monkeypatch.setattr(spool, "SPILL_CHARS", 600)
    monkeypatch.setattr(spool, "WRITE_BYTES", 100, raising=False)
    disk = disk_with_room(room or 0, spare_files=1)
    made: list = []

    def no_second_file(*args, **kwargs):
        made.append(1)
        return disk() if len(made) == 1 else no_file_to_be_had()

    monkeypatch.setattr(spool.tempfile, "TemporaryFile", disk if room is not None else
                        no_second_file)
    result = Session(CallableProvider(items_reply), ledger=path, concurrency=2).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=1)  # the tasks' file has room, the log's not
    assert result.status == "resolved" and result.calls == 60
    assert dict(result.attempts_by_task) == dict.fromkeys((t["task_id"] for t in tasks), 1)
    assert ledger_rows(path, "SELECT status, COUNT(*) FROM attempts GROUP BY status") == [
        ("accepted", 60)]


# -- kills and a second runner -------------------------------------------------------------------

RUNNER = """
import os, signal, sys, time
sys.path.insert(0, os.getcwd())
from batchjson import CallableProvider, Session
from batchjson._content import tasks as spool
from batchjson._ledger import store_runs
from batchjson._replay import replay
from batchjson._session import window
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

window.WINDOW, replay.FEED, spool.SPILL_CHARS = 8, 4, 300
path, die, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
calls = []

if die == "insert":  # killed while the revision's requests stream in, a few rows at a time
    store_runs.INSERT_ROWS = 3
    from batchjson._ledger.sqlite import SQLiteStore
    many, chunks = SQLiteStore._many, []
    def dying(self, tx, sql, rows):
        if sql.startswith("INSERT INTO requests"):
            chunks.append(1)
            if len(chunks) == 4:
                os.kill(os.getpid(), signal.SIGKILL)
        return many(self, tx, sql, rows)
    SQLiteStore._many = dying

def model(call):
    calls.append(1)
    if die == "call" and len(calls) == 13:  # a call out, its answer never read
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ.get("DELAY", "0")))
    return items_reply(call)

result = Session(CallableProvider(model, source="m"), ledger=path, concurrency=3).run_batch(
    "b", (t for t in review_tasks(count)), LABEL_SCHEMA, pack=2)
print(result.status, result.calls, flush=True)
"""


def runner(path, die: str, count: int, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUNNER, str(path), die, str(count)],
                            env={**os.environ, **env}, cwd=Path(__file__).parent.parent,
                            stdout=subprocess.PIPE, text=True)


def accepted_once(path, requests: int) -> None:
    """Every request accepted exactly once, none still open, no half-written revision."""
    accepted = ledger_rows(path, "SELECT request_key FROM attempts WHERE status = 'accepted'")
    assert len(accepted) == len(set(accepted)) == requests
    assert ledger_rows(path, "SELECT COUNT(*) FROM requests") == [(requests,)]
    assert ledger_rows(path, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.parametrize("die", ["insert", "call"])
def test_a_kill_while_streaming_requests_or_calls_then_a_resume_completes_paying_once(
        tmp_path, die):
    path = tmp_path / "k.sqlite"
    proc = runner(path, die, 60)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    if die == "insert":  # the revision and its requests commit together, or not at all
        assert ledger_rows(path, "SELECT COUNT(*) FROM revisions") == [(0,)]
        assert ledger_rows(path, "SELECT COUNT(*) FROM requests") == [(0,)]
    open_before = ledger_rows(path, "SELECT COUNT(*) FROM attempts WHERE status = 'accepted'")
    sent: list = []
    result = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call),
                                      source="m"), ledger=path).run_batch(
        "b", iter(review_tasks(60)), LABEL_SCHEMA, pack=2)
    assert result.status == "resolved" and dict(result.values) == expected(review_tasks(60))
    assert len(sent) == 30 - open_before[0][0]
    accepted_once(path, 30)


def test_two_processes_running_one_windowed_batch_on_one_ledger_pay_each_request_once(
        tmp_path):
    path = tmp_path / "two.sqlite"
    Session(ledger=path).close()  # the ledger made once, before either starts
    procs = [runner(path, "none", 80, DELAY="0.005") for _ in range(2)]
    outs = [proc.communicate(timeout=60)[0].split() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert [out[0] for out in outs] == ["resolved", "resolved"]
    assert sum(int(out[1]) for out in outs) == 40  # every call made by one of them, once
    assert ledger_rows(path, "SELECT COUNT(*) FROM attempts") == [(40,)]
    accepted_once(path, 40)


# -- values read back ----------------------------------------------------------------------------

class Shouted(BaseModel):
    """A fully fingerprinted model that cannot load what it dumps: its validator upper-cases
    the verdict and refuses one already upper-case."""

    verdict: str

    @field_validator("verdict")
    @classmethod
    def shout(cls, verdict: str) -> str:
        if verdict.isupper():
            raise ValueError("already shouted")
        return verdict.upper()


@pytest.mark.parametrize("ledger", ["file", "memory"])
def test_a_value_its_own_model_cannot_load_back_is_an_error_of_its_task_not_a_crash(
        tmp_path, ledger):
    tasks = review_tasks(4)
    path = tmp_path / "v.sqlite" if ledger == "file" else None
    session = Session(CallableProvider(items_reply), ledger=path)
    for _ in range(2):  # the run that accepted them, then a resume of it
        result = session.run_batch("b", iter(tasks), Shouted, pack=2, on_exhausted="return")
        assert result.status == "unresolved" and dict(result.values) == {}
        assert [(e["task_id"], e["type"]) for e in result.errors] == [
            (t["task_id"], "stored_invalid") for t in tasks]
        assert result.values.get(tasks[0]["task_id"]) is None
    assert result.calls == 0 and "already shouted" in result.errors[0]["message"]


# -- what a notebook shows -----------------------------------------------------------------------

def test_a_large_windowed_result_renders_its_first_failures_and_counts_the_rest(
        tmp_path, small_windows):
    tasks = review_tasks(300)
    result = Session(CallableProvider(items_reply), ledger=tmp_path / "big.sqlite",
                     repairs=0, replays=0).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=2, validator=seventh_fails, on_exhausted="return")
    failed = {t["task_id"] for t in tasks if int(t["candidate_id"][-3:]) % 7 == 0}
    page = result._repr_html_()
    assert f"{len(failed)} failed request(s)" in page and "more failed request(s)" in page
    assert f"{300 - 2 * len(failed)}/300" in page and len(page) < 20_000
    assert len(result.failures) == len(failed)
    assert len(result.values) + 2 * len(failed) == 300 and store_runs.INSERT_ROWS == 2000
