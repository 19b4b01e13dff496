"""A stored answer is reused exactly when it should be: a hostile user's edits that the content
key cannot see, through the public API only."""

from __future__ import annotations

from typing import Any

from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

TASKS = review_tasks(4)  # candidates 127..130: verdicts match, no_match, match, no_match

# A notebook cell: the validator reads the banned verdict through globals(), which no
# fingerprint can see, so editing BANNED leaves the validator's digest as it was.
VALIDATOR_CELL = '''
BANNED = {banned!r}
def check(item, task):
    if item["verdict"] == globals()["BANNED"]:
        raise ValueError("banned verdict")
'''

SCHEMA_CELL = '''
from pydantic import BaseModel, field_validator
BANNED = {banned!r}
class Label(BaseModel):
    verdict: str

    @field_validator("verdict")
    @classmethod
    def allowed(cls, value):
        if value == globals()["BANNED"]:
            raise ValueError("banned verdict")
        return value
'''


def _cell(source: str, banned: str, namespace: dict[str, Any] | None = None) -> dict[str, Any]:
    namespace = {} if namespace is None else namespace
    exec(compile(source.format(banned=banned), "<cell>", "exec"), namespace)
    return namespace


def _session() -> tuple[Session, list[int]]:
    sent: list[int] = []

    def model(call: Any) -> str:
        sent.append(len(call.tasks))
        return items_reply(call)

    return Session(CallableProvider(model, source="hostile-reuse"), repairs=0, replays=0), sent


def _run(session: Session, **options: Any) -> Any:
    options.setdefault("schema", LABEL_SCHEMA)
    return session.run_batch("labels", TASKS, options.pop("schema"), on_exhausted="return",
                             identity=["task_id"], **options)


def test_a_hidden_value_the_validator_reads_changing_never_hands_back_stale_answers() -> None:
    session, sent = _session()
    ns = _cell(VALIDATOR_CELL, "nothing")
    first = _run(session, validator=ns["check"])
    assert first.status == "resolved" and len(sent) == 4
    _cell(VALIDATOR_CELL, "match", ns)  # the same code; only the hidden value changed
    second = _run(session, validator=ns["check"])
    # the two 'match' answers fail the rules as they are now: never returned as accepted
    assert sorted(v["verdict"] for v in second.values.values()) == ["no_match", "no_match"]
    assert second.status == "unresolved" and len(sent) == 6  # only those two asked again
    assert any("no fingerprint can see" in note for note in second.notes)


def test_an_unchanged_hidden_value_resumes_with_no_call_and_no_new_revision() -> None:
    session, sent = _session()
    ns = _cell(VALIDATOR_CELL, "nothing")
    first = _run(session, validator=ns["check"])
    _cell(VALIDATOR_CELL, "nothing", ns)  # the cell re-run as it was
    again = _run(session, validator=ns["check"])
    assert again.values == first.values and len(sent) == 4
    assert again.revision == first.revision and len(session.ledger.revisions("labels")) == 1


def test_a_hidden_value_changed_back_re_judges_the_kept_returns_instead_of_re_asking() -> None:
    session, sent = _session()
    ns = _cell(VALIDATOR_CELL, "match")
    strict = _run(session, validator=ns["check"])
    assert len(strict.values) == 2 and len(sent) == 4
    _cell(VALIDATOR_CELL, "nothing", ns)
    loose = _run(session, validator=ns["check"])
    assert loose.status == "resolved" and len(sent) == 4  # the rejected returns pass now
    assert loose.rechecked == 2


def test_a_pydantic_validator_reading_a_hidden_value_reuses_only_what_still_passes() -> None:
    session, sent = _session()
    ns = _cell(SCHEMA_CELL, "nothing")
    first = _run(session, schema=ns["Label"])
    assert first.status == "resolved" and len(sent) == 4
    _cell(SCHEMA_CELL, "no_match", ns)  # redefines Label: same content, other hidden value
    second = _run(session, schema=ns["Label"])
    assert sorted(v.verdict for v in second.values.values()) == ["match", "match"]
    assert not [e for e in second.errors if e["type"] == "stored_invalid"]  # not a dead end
    _cell(SCHEMA_CELL, "nothing", ns)
    third = _run(session, schema=ns["Label"])
    assert third.status == "resolved" and len(sent) == 6  # re-judged, never re-bought


def test_a_schema_description_edit_asks_again_and_the_old_schema_resumes() -> None:
    session, sent = _session()
    _run(session)
    described = {**LABEL_SCHEMA, "description": "is the candidate the same case?"}
    edited = _run(session, schema=described)  # the model is shown other text: ask again
    assert edited.status == "resolved" and len(sent) == 8
    back = _run(session)
    assert back.revision == 1 and back.calls == 0 and len(sent) == 8


LOGGING_CELL = '''
PROBLEMS = []
COUNTS = {{"judged": 0}}
def check(item, task):
    COUNTS["judged"] += 1
    PROBLEMS.append(task["task_id"])
'''


class _CountingCheck:
    def __init__(self) -> None:
        self.judged = 0
        self.log: list[str] = []
        self.banned = "nothing"

    def __call__(self, item: Any, task: Any) -> None:
        self.judged += 1
        self.log.append(task["task_id"])
        if item["verdict"] == self.banned:
            raise ValueError("banned verdict")


def test_a_validator_that_logs_and_counts_while_judging_resumes_in_a_strict_session() -> None:
    calls = []

    def flaky(call: Any) -> str:  # the first three calls fail: evidence stays open
        calls.append(1)
        return items_reply(call) if len(calls) > 3 else "not json"

    session = Session(CallableProvider(flaky, source="flaky"), strict=True, repairs=0, replays=0)
    ns = _cell(LOGGING_CELL, "")
    first = session.run_batch("log", TASKS, LABEL_SCHEMA, validator=ns["check"],
                              on_exhausted="return")
    assert first.status == "unresolved" and ns["PROBLEMS"]
    # the log grew while judging: still the same validator, no ValidatorChanged, one revision
    again = session.run_batch("log", TASKS, LABEL_SCHEMA, validator=ns["check"])
    assert again.status == "resolved" and again.revision == first.revision
    assert len(session.validators.versions("check")) == 1


def test_a_callable_validator_counting_on_itself_keeps_one_version_but_its_settings_count(
) -> None:
    session, sent = _session()
    check = _CountingCheck()
    first = _run(session, validator=check)
    again = _run(session, validator=check)
    assert again.revision == first.revision and again.calls == 0 and len(sent) == 4
    check.banned = "match"  # a setting, not something judging changes: a new revision
    stricter = _run(session, validator=check)
    assert stricter.revision != first.revision
    assert sorted(v["verdict"] for v in stricter.values.values()) == ["no_match", "no_match"]


RESTART = '''
import sys
from batchjson import CallableProvider, Session
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks
sent = []
def model(call):
    sent.append(1)
    return items_reply(call)
session = Session(CallableProvider(model, source="restart"), ledger=sys.argv[1])
result = session.run_batch("labels", review_tasks(3), LABEL_SCHEMA,
                           identity={"task_id", "case_id", "candidate_id"})
print(result.status, len(sent))
'''


def test_an_identity_given_as_a_set_resumes_after_a_restart_with_another_hash_seed(
        tmp_path: Any) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    ledger = tmp_path / "ledger.sqlite"
    runs = []
    for seed in ("1", "2", "3"):  # set order follows the hash seed: each run is a new kernel
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        done = subprocess.run([sys.executable, "-c", RESTART, str(ledger)], env=env, cwd=root,
                              capture_output=True, text=True, check=True)
        runs.append(done.stdout.split())
    assert runs == [["resolved", "3"], ["resolved", "0"], ["resolved", "0"]]


def test_a_validator_made_stricter_then_looser_again_pays_once_and_reuses_the_first_answers(
) -> None:
    session, sent = _session()

    def check(item: Any, task: Any) -> None:
        return None

    loose = _run(session, validator=check)
    assert loose.status == "resolved" and len(sent) == 4

    def check(item: Any, task: Any) -> None:  # noqa: F811 - the cell edited
        if item["verdict"] == "match":
            raise ValueError("no match allowed")

    strict = _run(session, validator=check)
    assert strict.rechecked == 2 and len(sent) == 6  # the two 'match' answers asked again
    assert sorted(v["verdict"] for v in strict.values.values()) == ["no_match", "no_match"]

    def check(item: Any, task: Any) -> None:  # noqa: F811 - and edited back
        return None

    again = _run(session, validator=check)
    assert again.revision == loose.revision and again.calls == 0 and len(sent) == 6
    assert again.values == loose.values


def _env_check(item: Any, task: Any) -> None:
    import os

    if item["verdict"] == os.environ.get("BATCHJSON_TEST_BANNED", ""):
        raise ValueError("banned verdict")


def test_a_validator_reading_an_environment_variable_never_reuses_answers_it_now_rejects(
        monkeypatch: Any) -> None:
    session, sent = _session()
    monkeypatch.setenv("BATCHJSON_TEST_BANNED", "nothing")
    first = _run(session, validator=_env_check)
    assert first.status == "resolved" and len(sent) == 4
    monkeypatch.setenv("BATCHJSON_TEST_BANNED", "no_match")
    second = _run(session, validator=_env_check)
    assert sorted(v["verdict"] for v in second.values.values()) == ["match", "match"]
    assert any("os.environ" in note for note in second.notes)


LOGGED_MODEL_CELL = '''
from typing import ClassVar
from pydantic import BaseModel, field_validator
class Label(BaseModel):
    judged: ClassVar[list] = []
    verdict: str

    @field_validator("verdict")
    @classmethod
    def log(cls, value):
        cls.judged.append(value)
        return value
'''


def test_a_pydantic_model_logging_on_its_class_while_judging_keeps_one_revision() -> None:
    session, sent = _session()
    ns = _cell(LOGGED_MODEL_CELL, "")
    first = _run(session, schema=ns["Label"])
    assert ns["Label"].judged  # the log grew while judging
    again = _run(session, schema=ns["Label"])
    assert again.revision == first.revision and again.calls == 0 and len(sent) == 4
    assert len(session.ledger.revisions("labels")) == 1


FREE_SCHEMA = {"type": "object", "properties": {"verdict": {"type": "string"}},
               "required": ["verdict"]}
BANNED_CELL = '''
BANNED = {banned!r}
def check(item, task):
    if item["verdict"] in globals()["BANNED"]:
        raise ValueError("banned verdict")
'''


def _answering() -> tuple[Session, dict[str, str], list[int]]:
    """A session whose model answers every task with ``reply["verdict"]``, set by the test."""
    reply, sent = {"verdict": "a"}, []

    def model(call: Any) -> str:
        sent.append(len(call.tasks))
        return items_reply(call, **{t["task_id"]: reply for t in call.tasks})

    session = Session(CallableProvider(model, source="answering"), repairs=0, replays=0)
    return session, reply, sent


def _banned_run(session: Session, ns: dict[str, Any], banned: set[str],
                name: str = "free") -> Any:
    _cell(BANNED_CELL, banned, ns)  # the cell re-run: the same code, another hidden value
    return session.run_batch(name, TASKS[:2], FREE_SCHEMA, validator=ns["check"],
                             identity=["task_id"], on_exhausted="return")


def test_an_answer_accepted_after_a_hidden_change_is_re_judged_after_the_next_one() -> None:
    session, reply, sent = _answering()
    ns: dict[str, Any] = {}
    _banned_run(session, ns, set())
    reply["verdict"] = "b"
    second = _banned_run(session, ns, {"a"})  # the 'a' answers fail: asked again, now 'b'
    assert {v["verdict"] for v in second.values.values()} == {"b"} and len(sent) == 4
    reply["verdict"] = "c"
    # the first answers fail exactly as before, and so do those the second run accepted
    third = _banned_run(session, ns, {"a", "b"})
    assert {v["verdict"] for v in third.values.values()} == {"c"} and len(sent) == 6
    assert third.status == "resolved" and third.calls == 2


def test_hidden_rules_met_before_take_back_the_answers_they_accepted_with_no_call() -> None:
    session, reply, sent = _answering()
    ns: dict[str, Any] = {}
    first = _banned_run(session, ns, set())
    reply["verdict"] = "b"
    _banned_run(session, ns, {"a"})
    reply["verdict"] = "c"
    _banned_run(session, ns, {"a", "b"})
    assert len(sent) == 6
    again = _banned_run(session, ns, {"a"})  # the second run's rules: its answers pass again
    assert {v["verdict"] for v in again.values.values()} == {"b"} and len(sent) == 6
    back = _banned_run(session, ns, set())
    assert back.values == first.values and back.revision == first.revision and len(sent) == 6


def test_another_batch_of_the_same_tasks_never_takes_answers_its_hidden_rules_reject() -> None:
    session, reply, sent = _answering()
    ns: dict[str, Any] = {}
    _banned_run(session, ns, set(), name="kept")  # 'a' accepted under content keys
    reply["verdict"] = "b"
    other = _banned_run(session, ns, {"a"}, name="other")  # the same keys, stricter rules
    assert {v["verdict"] for v in other.values.values()} == {"b"} and len(sent) == 4
    assert any("no fingerprint can see" in note for note in other.notes)
