"""A validator that reads a data file judges by that file: an edit is never reused on trust.

A constant path read in the user's code puts the file's content into the fingerprint, hashed
again at every run; any other read (a computed path, an installed library's reader) makes the
fingerprint partial, so stored answers are re-judged before reuse.
"""

from __future__ import annotations

import gzip
import json
import os
from gzip import open as gzip_open
from pathlib import Path
from typing import Any

import pytest

from batchjson import CallableProvider, Session, ValidatorChanged
from batchjson._fingerprint.fingerprint import describe_changes, fingerprint_function
from tests.helpers import LABEL_SCHEMA, answer, items_reply, review_tasks

RULES = "rules.json"
MODEL = "reviewer-v1"  # one answer source across sessions: its stored answers can be reused


def allowed_by_rules(item: Any, task: Any) -> None:
    rules = json.load(open("rules.json"))
    if item["verdict"] not in rules["allowed"]:
        raise ValueError(f"verdict {item['verdict']!r} is not allowed by rules.json")


def allowed_by_computed_path(item: Any, task: Any) -> None:
    with open(os.path.join(os.getcwd(), RULES), encoding="utf-8") as handle:
        rules = json.load(handle)
    if item["verdict"] not in rules["allowed"]:
        raise ValueError(f"verdict {item['verdict']!r} is not allowed")


def allow(*verdicts: str) -> None:
    Path(RULES).write_text(json.dumps({"allowed": list(verdicts)}))


def everything_matches(call: Any) -> str:
    return items_reply(call, **{t["task_id"]: {"verdict": "match"} for t in call.tasks})


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    allow("match", "no_match")
    return tmp_path


@pytest.mark.parametrize("validator", [allowed_by_rules, allowed_by_computed_path])
def test_answers_that_fail_the_edited_file_are_not_returned(here: Path, validator: Any) -> None:
    tasks = review_tasks(6)
    model = {"answer": items_reply}  # what the model says; its source stays one

    def reviewer(call: Any) -> str:
        return model["answer"](call)

    session = Session(CallableProvider(reviewer, source=MODEL), ledger=here / "ledger.sqlite")
    assert session.run_batch("review", tasks, LABEL_SCHEMA, validator=validator).resolved
    assert sorted(v["verdict"] for v in session.ledger.checkpoint("review").values()) == [
        "match"] * 3 + ["no_match"] * 3

    allow("match")  # three stored answers now fail
    model["answer"] = everything_matches
    result = session.run_batch("review", tasks, LABEL_SCHEMA, validator=validator)
    assert result.resolved and {v["verdict"] for v in result.values.values()} == {"match"}
    assert (result.rechecked, result.calls) == (3, 3)  # the passing three reused, no call
    named = ("validator 'allowed_by_rules' changed (file rules.json changed)"
             if validator is allowed_by_rules
             else "open(): a file read whose path is computed at run time")
    assert any(named in note for note in result.notes), result.notes
    again = session.run_batch("review", tasks, LABEL_SCHEMA, validator=validator)
    assert again.calls == 0 and again.values == result.values

    later = Session(CallableProvider(reviewer, source=MODEL), ledger=here / "ledger.sqlite")
    restarted = later.run_batch("review", tasks, LABEL_SCHEMA, validator=validator)
    assert restarted.calls == 0 and restarted.values == result.values  # a kernel restart


def test_a_strict_session_reports_the_validator_changed_by_its_file(here: Path) -> None:
    allow("match")
    session = Session(CallableProvider(items_reply), ledger=here / "ledger.sqlite", strict=True,
                      repairs=0, replays=0)
    result = session.run_batch("review", review_tasks(4), LABEL_SCHEMA,
                               validator=allowed_by_rules, on_exhausted="return")
    assert len(result.values) == 2  # the no_match answers stay owed under these rules
    allow("match", "no_match")
    with pytest.raises(ValidatorChanged, match="file rules.json changed") as changed:
        session.run_batch("review", review_tasks(4), LABEL_SCHEMA, validator=allowed_by_rules)
    assert changed.value.changes == ["file rules.json changed"]
    assert "while 2 request(s) recorded under the old version are unresolved" in str(
        changed.value) and "or the file it reads" in str(changed.value)
    assert session.ledger.cost_summary()["total"]["calls"] == 4  # nothing sent on refusal


def test_the_file_is_hashed_again_at_every_fingerprint(here: Path) -> None:
    before = fingerprint_function(allowed_by_rules)
    assert fingerprint_function(allowed_by_rules).digest == before.digest
    assert not before.partial
    allow("match")
    after = fingerprint_function(allowed_by_rules)
    assert describe_changes(before, after) == ["file rules.json changed"]
    allow("match", "no_match")
    assert fingerprint_function(allowed_by_rules).digest == before.digest  # content, not time


def read_text_of_path(item: Any, task: Any) -> str:
    return Path("rules.json").read_text()


RULES_PATH = Path("rules.json")


def read_bytes_of_global(item: Any, task: Any) -> bytes:
    return RULES_PATH.read_bytes()


def open_with_mode(item: Any, task: Any) -> str:  # keyword arguments, a reading mode
    return open(file=RULES, mode="rb").read().decode()


def helper_reads() -> Any:
    return json.load(open(RULES))


def through_a_helper(item: Any, task: Any) -> Any:
    return helper_reads()


@pytest.mark.parametrize(("validator", "changed"), [
    (read_text_of_path, "file rules.json changed"),
    (read_bytes_of_global, "file rules.json changed"),
    (open_with_mode, "file rules.json changed"),
    (through_a_helper, "global helper_reads: file rules.json changed"),
])
def test_every_spelling_of_a_constant_path_is_read_by_content(here: Path, validator: Any,
                                                              changed: str) -> None:
    before = fingerprint_function(validator)
    allow("nothing")
    after = fingerprint_function(validator)
    assert not after.partial and describe_changes(before, after) == [changed]


def computed_read_text(item: Any, task: Any) -> str:
    return Path(task["rules"]).read_text()


def library_reader(item: Any, task: Any) -> bytes:
    return gzip.open("rules.json.gz").read()


def library_reader_by_name(item: Any, task: Any) -> bytes:
    return gzip_open("rules.json.gz").read()


@pytest.mark.parametrize(("validator", "named"), [
    (computed_read_text, ".read_text(): a file read whose path is computed at run time"),
    (library_reader, "gzip.open(): a file read inside an installed library"),
    (library_reader_by_name, "gzip.open(): a file read inside an installed library"),
    (allowed_by_computed_path, "open(): a file read whose path is computed at run time"),
])
def test_a_read_no_hash_can_cover_makes_the_fingerprint_partial_and_names_it(
        here: Path, validator: Any, named: str) -> None:
    fingerprint = fingerprint_function(validator)
    assert fingerprint.partial and any(named in u for u in fingerprint.unseen), fingerprint.unseen


def writes_a_log(item: Any, task: Any) -> None:
    with open("judged.log", "a", encoding="utf-8") as log:
        log.write(f"{task['task_id']}\n")


def test_a_file_the_validator_writes_is_not_part_of_what_it_judges_by(here: Path) -> None:
    session = Session(CallableProvider(items_reply), ledger=here / "ledger.sqlite",
                      strict=True)
    for _ in range(2):  # the log grows; the validator stays one version, in a strict session
        assert session.run_batch("review", review_tasks(2), LABEL_SCHEMA,
                                 validator=writes_a_log).resolved
    assert [v.version for v in session.validators.versions("writes_a_log")] == [1]


def test_a_missing_file_is_seen_when_it_appears_and_a_pipe_is_never_read(here: Path) -> None:
    Path(RULES).unlink()
    missing = fingerprint_function(allowed_by_rules)
    assert not missing.partial and fingerprint_function(allowed_by_rules).digest == missing.digest
    allow("match")
    assert describe_changes(missing, fingerprint_function(allowed_by_rules)) == [
        "file rules.json changed"]
    Path(RULES).unlink()
    os.mkfifo(RULES)  # reading it ahead would block until a writer came
    piped = fingerprint_function(allowed_by_rules)
    assert piped.partial and "not a regular file" in piped.unseen[0]


def test_judging_by_the_answers_of_a_file_is_unchanged_by_reading_it(here: Path) -> None:
    """The answer a validator gives is the file's, read when it runs: the fingerprint's own
    read of the file neither consumes nor alters it."""
    allow("match")
    before = Path(RULES).read_bytes()
    fingerprint_function(allowed_by_rules)
    assert Path(RULES).read_bytes() == before
    with pytest.raises(ValueError, match="not allowed by rules.json"):
        allowed_by_rules(answer({"candidate_id": "c-2"}), {})


class Hostile:
    def __getattribute__(self, name: str) -> Any:
        raise RuntimeError("no peeking")


HOSTILE = Hostile()


def reads_from_a_hostile_object(item: Any, task: Any) -> Any:
    return HOSTILE.read_text()


def test_a_read_from_an_object_that_raises_when_read_blinds_only_that_read() -> None:
    fingerprint = fingerprint_function(reads_from_a_hostile_object)
    assert fingerprint.unseen == (
        "HOSTILE.read_text(): a file read whose path is computed at run time",)
    assert "code" in dict(fingerprint.parts)  # still read as a function, not one opaque object
    assert fingerprint.by_identity == ("global:HOSTILE",)
