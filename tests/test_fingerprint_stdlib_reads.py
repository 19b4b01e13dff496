"""A validator that reads its rules through the stdlib's other doors judges by what it reads.

``sqlite3.connect``, ``os.listdir``, ``os.walk``, ``glob.glob``, ``os.path.exists``,
``linecache``, ``fileinput`` with a constant path count by the file's bytes, the listing or the
path's state, read again at every run; a computed path or a program run (``subprocess``) makes
the fingerprint partial; a ``functools.lru_cache`` around a reader is seen through and named,
since its cache hides an edit from the process.
"""

from __future__ import annotations

import fileinput
import functools
import glob
import json
import linecache
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from batchjson import CallableProvider, Session
from batchjson._fingerprint.fingerprint import describe_changes, fingerprint_function
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

MODEL = "reviewer-v1"


def publish(*verdicts: str) -> None:
    """The allowed verdicts, in every form the validators below read them."""
    Path("rules.txt").write_text("".join(f"{v}\n" for v in verdicts))
    Path("rules.json").write_text(json.dumps({"allowed": list(verdicts)}))
    Path("rules.db").unlink(missing_ok=True)
    db = sqlite3.connect("rules.db")
    db.execute("CREATE TABLE allowed (verdict TEXT)")
    db.executemany("INSERT INTO allowed VALUES (?)", [(v,) for v in verdicts])
    db.commit()
    db.close()
    Path("allowed").mkdir(exist_ok=True)
    for old in Path("allowed").iterdir():
        old.unlink()
    for v in verdicts:
        (Path("allowed") / v).touch()
    Path("no_match.allowed").unlink(missing_ok=True)
    if "no_match" in verdicts:
        Path("no_match.allowed").touch()


def judge(verdict: str, allowed: Any) -> None:
    if verdict not in allowed:
        raise ValueError(f"verdict {verdict!r} is not allowed")


def by_sqlite(item: Any, task: Any) -> None:
    db = sqlite3.connect("rules.db")
    try:
        judge(item["verdict"], [row[0] for row in db.execute("SELECT verdict FROM allowed")])
    finally:
        db.close()


def by_listdir(item: Any, task: Any) -> None:
    judge(item["verdict"], os.listdir("allowed"))


def by_walk(item: Any, task: Any) -> None:
    judge(item["verdict"], [name for _, _, files in os.walk("allowed") for name in files])


def by_glob(item: Any, task: Any) -> None:
    judge(item["verdict"], [Path(p).name for p in glob.glob("allowed/*")])


def by_exists(item: Any, task: Any) -> None:
    if item["verdict"] == "no_match" and not os.path.exists("no_match.allowed"):
        raise ValueError("no_match is not allowed")


def by_exists_of_a_computed_path(item: Any, task: Any) -> None:
    if not os.path.exists("allowed/" + item["verdict"]):
        raise ValueError("not allowed")


def by_subprocess(item: Any, task: Any) -> None:
    judge(item["verdict"], subprocess.check_output(["cat", "rules.txt"], text=True).split())


def by_linecache(item: Any, task: Any) -> None:
    linecache.checkcache("rules.txt")
    judge(item["verdict"], [line.strip() for line in linecache.getlines("rules.txt")])


def by_fileinput(item: Any, task: Any) -> None:
    with fileinput.input("rules.txt") as lines:
        judge(item["verdict"], [line.strip() for line in lines])


@functools.lru_cache
def cached_rules() -> list[str]:
    return json.load(open("rules.json"))["allowed"]


def by_cached_loader(item: Any, task: Any) -> None:
    judge(item["verdict"], cached_rules())


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    publish("match", "no_match")
    cached_rules.cache_clear()
    return tmp_path


def everything_matches(call: Any) -> str:
    return items_reply(call, **{t["task_id"]: {"verdict": "match"} for t in call.tasks})


@pytest.mark.parametrize("validator", [by_sqlite, by_listdir, by_walk, by_glob, by_exists,
                                       by_exists_of_a_computed_path, by_subprocess,
                                       by_linecache, by_fileinput])
def test_answers_the_edited_data_source_now_rejects_are_not_returned(
        here: Path, validator: Any) -> None:
    tasks = review_tasks(6)
    model = {"answer": items_reply}
    session = Session(CallableProvider(lambda call: model["answer"](call), source=MODEL),
                      ledger=here / "ledger.sqlite")
    assert session.run_batch("review", tasks, LABEL_SCHEMA, validator=validator).resolved

    publish("match")  # three stored no_match answers now fail
    model["answer"] = everything_matches
    result = session.run_batch("review", tasks, LABEL_SCHEMA, validator=validator)
    assert result.resolved and {v["verdict"] for v in result.values.values()} == {"match"}
    assert (result.rechecked, result.calls) == (3, 3), result.notes
    again = session.run_batch("review", tasks, LABEL_SCHEMA, validator=validator)
    assert again.calls == 0 and again.values == result.values
    session.close()


@pytest.mark.parametrize(("validator", "changed"), [
    (by_sqlite, "file rules.db changed"),
    (by_listdir, "directory listing allowed changed"),
    (by_walk, "directory tree allowed changed"),
    (by_glob, "files matching allowed/* changed"),
    (by_exists, "path check exists('no_match.allowed') changed"),
    (by_fileinput, "file rules.txt changed"),
])
def test_a_constant_path_read_through_the_stdlib_counts_by_what_it_reads(
        here: Path, validator: Any, changed: str) -> None:
    before = fingerprint_function(validator)
    assert not before.partial, before.unseen
    assert fingerprint_function(validator).digest == before.digest
    publish("match")
    assert describe_changes(before, fingerprint_function(validator)) == [changed]


@pytest.mark.parametrize(("validator", "named"), [
    (by_exists_of_a_computed_path,
     "os.path.exists(): a file read whose path is computed at run time"),
    (by_subprocess, "subprocess.check_output(): runs a program"),
    (by_linecache, "linecache keeps the lines it read in this process"),
    (by_cached_loader, "cached_rules() is cached (functools.lru_cache): an edit of what it "
                       "reads is not seen by this process until cached_rules.cache_clear()"),
])
def test_a_read_the_fingerprint_cannot_cover_makes_it_partial_and_names_it(
        here: Path, validator: Any, named: str) -> None:
    fingerprint = fingerprint_function(validator)
    assert fingerprint.partial and any(named in u for u in fingerprint.unseen), fingerprint.unseen


def test_a_cached_loader_is_walked_into_and_its_staleness_named_in_the_run(here: Path) -> None:
    """The file under the cache is part of the fingerprint; the cache is named, so the user
    knows why answers stay as they were until the cache is cleared."""
    before = fingerprint_function(by_cached_loader)
    publish("match")
    assert describe_changes(before, fingerprint_function(by_cached_loader)) == [
        "global cached_rules: file rules.json changed"]
    publish("match", "no_match")
    session = Session(CallableProvider(items_reply, source=MODEL), ledger=here / "l.sqlite")
    assert session.run_batch("review", review_tasks(4), LABEL_SCHEMA,
                             validator=by_cached_loader).resolved
    publish("match")
    stale = session.run_batch("review", review_tasks(4), LABEL_SCHEMA,
                              validator=by_cached_loader)
    assert any("cached_rules.cache_clear()" in note for note in stale.notes), stale.notes
    cached_rules.cache_clear()
    fresh = session.run_batch("review", review_tasks(4), LABEL_SCHEMA,
                              validator=by_cached_loader, on_exhausted="return")
    assert {v["verdict"] for v in fresh.values.values()} == {"match"}
    session.close()


def test_an_in_memory_database_is_no_file_read(here: Path) -> None:
    def in_memory(item: Any, task: Any) -> None:
        sqlite3.connect(":memory:").close()

    assert not fingerprint_function(in_memory).partial
