"""A run streams over its requests a window at a time: its memory does not grow with its tasks.

Checked tasks are held as request texts (on disk past a few megabytes), the run's steps read
its requests a window at a time from them (or from the ledger, for a revision on record), the
replay loop is fed as it runs low, and duplicate ids are found without a set of every id.
Each test shrinks the window and the spill size so a few hundred tasks exercise what a million
would, and checks the same keys, results and receipts as a run holding everything.
"""

from __future__ import annotations

import copy
import json
import weakref

import pytest

from batchjson import CallableProvider, InvalidBatch, Session
from batchjson._content import tasks as spool
from batchjson._content import tasks as tasks_module
from batchjson._replay import replay
from batchjson._session import window
from tests.helpers import LABEL_SCHEMA, answer, items_reply, ledger_rows, review_tasks


@pytest.fixture
def small_windows(monkeypatch):
    """Windows of 8 requests, the replay fed 4 at a time, texts on disk past 300 characters."""
    monkeypatch.setattr(window, "WINDOW", 8)
    monkeypatch.setattr(replay, "FEED", 4)
    monkeypatch.setattr(spool, "SPILL_CHARS", 300)


def live_requests(monkeypatch) -> dict[str, int]:
    """Counts the Request objects alive at once (the most ever, and now)."""
    seen = {"now": 0, "most": 0}
    made = tasks_module.Request.__post_init__

    def gone() -> None:
        seen["now"] -= 1

    def post_init(self) -> None:
        made(self)
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        weakref.finalize(self, gone)

    monkeypatch.setattr(tasks_module.Request, "__post_init__", post_init)
    return seen


def request_keys(path) -> list[str]:
    return [row[0] for row in ledger_rows(path, "SELECT key FROM requests ORDER BY id")]


def test_a_run_holds_a_few_windows_of_requests_never_all_of_them(tmp_path, monkeypatch,
                                                                  small_windows):
    tasks = review_tasks(300)
    held = live_requests(monkeypatch)
    result = Session(CallableProvider(items_reply), ledger=tmp_path / "w.sqlite",
                     concurrency=4).run_batch("b", (dict(t) for t in tasks), LABEL_SCHEMA, pack=1)
    assert result.status == "resolved" and result.calls == 300
    assert dict(result.values) == {t["task_id"]: answer(t) for t in tasks}
    assert held["most"] <= 40, held  # 300 if every request were held at once
    monkeypatch.undo()
    whole = Session(CallableProvider(items_reply), ledger=tmp_path / "whole.sqlite").run_batch(
        "b", tasks, LABEL_SCHEMA, pack=1)
    assert request_keys(tmp_path / "w.sqlite") == request_keys(tmp_path / "whole.sqlite")
    assert whole.revision == result.revision and whole.calls == result.calls


def test_a_resume_owing_work_reads_its_requests_from_the_ledger_a_page_at_a_time(
        tmp_path, monkeypatch, small_windows):
    tasks, path = review_tasks(120), tmp_path / "w.sqlite"
    failing = {t["task_id"] for t in tasks[::3]}

    def some_fail(call):
        if any(t["task_id"] in failing for t in call.tasks):
            return "not json"
        return items_reply(call)

    first = Session(CallableProvider(some_fail, source="model-1"), ledger=path, repairs=0,
                    replays=0, concurrency=4).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=2, on_exhausted="return")
    owed = len(first.unresolved)
    assert first.status == "unresolved" and owed == 80  # each failing task takes its pack
    held = live_requests(monkeypatch)
    sent: list = []
    again = Session(CallableProvider(lambda call: sent.append(call) or items_reply(call),
                                     source="model-1"), ledger=path, concurrency=4).run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=2)
    assert again.status == "resolved" and again.revision == first.revision
    assert len(sent) == again.calls == owed // 2 and again.resumed == 60 - owed // 2
    assert held["most"] <= 30, held
    assert dict(again.values) == {t["task_id"]: answer(t) for t in tasks}


def test_tasks_spilled_to_disk_give_the_keys_and_values_a_list_gives(tmp_path, monkeypatch):
    tasks = [dict(t, note="é\u2028\n", n=i) for i, t in enumerate(review_tasks(45))]
    whole = Session(CallableProvider(items_reply), ledger=tmp_path / "whole.sqlite").run_batch(
        "b", tasks, LABEL_SCHEMA, pack=4)
    monkeypatch.setattr(spool, "SPILL_CHARS", 100)
    held, texts, _ = tasks_module.normalize_tasks(
        iter(tasks), tasks_module.normalize_identity(None), pack=4)
    assert texts._file is not None and list(held) == tasks and held[44] == tasks[44]
    spilled = Session(CallableProvider(items_reply), ledger=tmp_path / "disk.sqlite").run_batch(
        "b", iter(tasks), LABEL_SCHEMA, pack=4)
    assert request_keys(tmp_path / "disk.sqlite") == request_keys(tmp_path / "whole.sqlite")
    assert dict(spilled.values) == dict(whole.values) and spilled.calls == whole.calls == 12


def test_a_duplicate_id_is_refused_by_its_positions_even_when_every_hash_collides(monkeypatch):
    monkeypatch.setattr(tasks_module, "hash", lambda text: 7, raising=False)  # every id alike
    tasks = review_tasks(30)
    held, _, _ = tasks_module.normalize_tasks(iter(tasks), tasks_module.normalize_identity(None),
                                           pack=4)
    assert list(held) == tasks  # alike hashes, different ids: nothing refused
    with pytest.raises(InvalidBatch, match=r"duplicate task_id .*-candidate-130' \(tasks #3 "
                                           r"and #30\)"):  # the first to repeat, in order
        tasks_module.normalize_tasks(iter([*tasks, tasks[3], tasks[29]]),
                                     tasks_module.normalize_identity(None), pack=4)


def test_ids_alike_in_their_kept_hash_bits_are_told_apart_by_the_ids(monkeypatch):
    """An id is kept as the low 48 bits of its hash: ids alike there but not above are no
    duplicates, and a true repeat is still named by its positions."""
    tasks = review_tasks(30)
    number = {t["task_id"]: n for n, t in enumerate(tasks)}
    monkeypatch.setattr(tasks_module, "hash", lambda text: (number.get(text, 99) << 48) | 7,
                        raising=False)
    ids = tasks_module.TaskIds()
    ids.update(number)
    kept = [(len(low), set(low), set(high))
            for low, high in zip(ids._low, ids._high, strict=True) if low]
    assert kept == [(30, {0}, {0})]  # every id's short hash alike, in one bucket
    ids.refuse_repeats(number)
    held, _, _ = tasks_module.normalize_tasks(iter(tasks), tasks_module.normalize_identity(None),
                                           pack=4)
    assert list(held) == tasks
    with pytest.raises(InvalidBatch, match=r"duplicate task_id .*-candidate-132' \(tasks #5 "
                                           r"and #30\)"):
        tasks_module.normalize_tasks(iter([*tasks, tasks[5]]),
                                     tasks_module.normalize_identity(None), pack=4)


def test_whichever_comes_first_of_a_duplicate_and_a_bad_task_is_named():
    tasks = review_tasks(6)
    bad = dict(tasks[5], prompt=5)
    identity = tasks_module.normalize_identity(None)
    with pytest.raises(InvalidBatch, match=r"duplicate task_id .* \(tasks #0 and #3\)"):
        tasks_module.normalize_tasks(iter([*tasks[:3], tasks[0], bad]), identity, pack=2)
    with pytest.raises(InvalidBatch, match="prompt must be a string"):
        tasks_module.normalize_tasks(iter([*tasks[:2], bad, tasks[0]]), identity, pack=2)
    with pytest.raises(InvalidBatch, match=r"duplicate task_id .* \(tasks #1 and #2\)"):
        tasks_module.normalize_tasks(iter([tasks[0], tasks[1], dict(tasks[1], prompt=None)]),
                                     identity, pack=2)


def test_attempts_per_task_count_every_call_that_carried_it_when_spooled(monkeypatch):
    monkeypatch.setattr(spool, "SPILL_CHARS", 50)
    tasks = review_tasks(8)
    tries: dict[str, int] = {}

    def once_wrong(call):
        first = call.tasks[0]["task_id"]
        tries[first] = tries.get(first, 0) + 1
        return "not json" if first == tasks[2]["task_id"] and tries[first] == 1 else (
            items_reply(call))

    result = Session(CallableProvider(once_wrong), repairs=1).run_batch(
        "b", tasks, LABEL_SCHEMA, pack=2)
    assert result.status == "resolved" and result.calls == 5
    assert dict(result.attempts_by_task) == {
        t["task_id"]: 2 if i in (2, 3) else 1 for i, t in enumerate(tasks)}
    assert json.loads(json.dumps(dict(result.attempts_by_task)))  # plain data


def test_a_result_whose_texts_spilled_to_disk_can_be_deep_copied(monkeypatch, small_windows):
    tasks = review_tasks(40)
    result = Session(CallableProvider(items_reply)).run_batch(
        "b", (dict(t) for t in tasks), LABEL_SCHEMA, pack=1)
    copied = copy.deepcopy(result)
    assert dict(copied.values) == dict(result.values) and len(copied.values) == 40
    assert dict(copied.attempts_by_task) == dict(result.attempts_by_task)
    assert set(dict(copied.attempts_by_task).values()) == {1}
