"""Request keys are evidence: a faster way of computing one must give the very same key."""

from __future__ import annotations

import enum
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from batchjson._canon import canonical_json, ledger_json, read_json
from batchjson._content.keys import KEY_COMPONENTS, Keys, key_maker, tasks_digest
from batchjson._content.tasks import Request, normalize_tasks, render_items_prompt, sha


def request_key(tasks, content):
    """Hash of exact content, the tasks encoded with it: what key_maker splices."""
    return sha(canonical_json({"tasks": list(tasks), **content}))


CONTENT = {"schema": "s" * 64, "validator": "none", "instructions": "i" * 64,
           "identity": "task_id,case_id", "mode": "items"}
KEYS = Keys(CONTENT)  # components without an answer source: keyed by CONTENT alone

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8)


@st.composite
def task_lists(draw):
    count = draw(st.integers(1, 7))
    tasks = []
    ids = st.text().filter(lambda text: "\x00" not in text)  # (a task_id holding NUL: refused)
    for i in range(count):
        extra = draw(st.dictionaries(st.text().filter(lambda k: k not in ("task_id", "prompt")),
                                     json_values, max_size=3))
        tasks.append({"prompt": draw(st.text()), **extra, "task_id": f"t{i}-{draw(ids)}",
                      "case_id": draw(json_values)})
    return tasks


@settings(max_examples=150, deadline=None)
@given(task_lists(), st.integers(1, 4),
       st.dictionaries(st.sampled_from(KEY_COMPONENTS), st.text(), min_size=1))
def test_packed_keys_equal_request_key_on_any_content(tasks, pack, components):
    normalized, texts, _ = normalize_tasks(tasks, ("task_id",))  # case_id: any JSON
    keys = Keys({**components, "source": "s"})
    content = keys.content
    requests = keys.pack(normalized, pack, texts)
    assert [t for r in requests for t in r.tasks] == normalized
    for request in requests:
        assert request.key == request_key(request.tasks, content)
        assert json.loads(request.tasks_json) == list(request.tasks)
        assert json.loads(request.task_ids_json) == [t["task_id"] for t in request.tasks]
        for child in keys.split(request):
            assert child.key == request_key(child.tasks, content)
            assert json.loads(child.tasks_json) == list(child.tasks)


def test_request_keys_of_existing_ledgers_do_not_change():
    """A pinned key: if this moves, every ledger written before would stop resuming."""
    tasks = [{"task_id": "case-078", "prompt": "Review the pair.", "case_id": "gold-pair-078",
              "note": "naïve ✓"}]
    (request,) = KEYS.pack(tasks, 1)
    assert request.key == "de5a537051136c8d0da4fb82a732d995d4153f2371920afa486856563936ddf2"


class Shade(enum.StrEnum):
    DARK = "dark"


class Level(enum.IntEnum):
    HIGH = 3


class Record(dict):
    pass


def varied_tasks() -> list[dict]:
    """Tasks whose JSON holds what an encoder could get subtly wrong: escapes and non-ASCII,
    floats at their limits, big ints, nesting, and Python values JSON stands in for."""
    return [
        {"task_id": "naïve-1", "case_id": "c1", "score": 0.1, "tiny": 1e-300, "neg": -0.0,
         "huge": 1.7976931348623157e308, "whole": 2.0,
         "prompt": "Résumé ✓ 日本語 😀 \u2028 \"q\" \\ \t\x01\x7f"},
        {"task_id": "t2", "case_id": 12345678901234567890123, "prompt": "p",
         "nested": {"z": [1, {"b": None, "a": [True, False]}], "a": {"é": {}}, "m": []}},
        {"prompt": "order", "task_id": "t3", "case_id": "c3", "tuple": (1, "two", 3.5),
         "shade": Shade.DARK, "level": Level.HIGH, "record": Record(b=1, a=2)},
    ]


@settings(max_examples=100, deadline=None)
@given(task_lists(), st.sampled_from([None, 1, 3]))
def test_the_field_names_read_while_checking_are_those_of_the_tasks_as_the_ledger_holds_them(
        tasks, pack):
    """What an echoing identity holds a return to, and a tasks file's memo keeps: every field,
    in the order the ledger's JSON first shows it (keys sorted), read while the tasks are
    checked rather than by decoding them again."""
    held, _, fields = normalize_tasks(tasks, ("task_id",), pack=pack, note_fields=True)
    assert fields == tuple(dict.fromkeys(key for task in held for key in task))


class _Field(str, enum.Enum):  # noqa: UP042 - str() of this one is "_Field.COLOR"
    COLOR = "color"


def test_the_fields_a_result_compares_if_echoed_are_plain_text_for_enum_keys() -> None:
    """A caller's dicts keyed by a str enum: the names a result shows are the text the ledger
    holds, never the enum members."""
    from batchjson import CallableProvider, Session
    from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

    tasks = [{**task, _Field.COLOR: "red"} for task in review_tasks(3)]
    session = Session(CallableProvider(items_reply), ledger=":memory:")
    result = session.run_batch("enum-keys", tasks, LABEL_SCHEMA)
    session.close()
    assert result.compared_if_echoed == ("candidate_id", "case_id", "color")
    assert [type(name) for name in result.compared_if_echoed] == [str, str, str]


def test_keys_of_varied_tasks_do_not_change():
    """Pinned keys and revision digest over varied content: a faster encoding of tasks that
    moved any of them would leave every ledger written before unable to resume."""
    tasks, _, _ = normalize_tasks(varied_tasks(), ("task_id", "case_id"), pack=2)
    assert tasks_digest(tasks) == (
        "58418f2281e86ba394a961a9f946b255b75ed0f46eb6bc1c49b28c9f94df3d7c")
    assert [r.key for r in KEYS.window(tasks, 0, 2)] == [
        "acaeef6043e7db07c2e2e93e3a9a0a0fb83a97292fdbed001485700890560ffa",
        "d9309fb97ac41c268d1cee6c449d81a24f3ae33269722160848c3514f90dfd9c"]
    assert [r.key for r in KEYS.pack(varied_tasks(), 1)] == [
        "8a6cd859d3b5d09a48a7bd0eb4bec3e779ca9c4f22c5b8a8355a5d526264e1f9",
        "78e167cab556b429f5d1f45fa3250cff9f80188ccf9a3bcc1c553007321f47d3",
        "d9309fb97ac41c268d1cee6c449d81a24f3ae33269722160848c3514f90dfd9c"]


def test_ledger_round_trip_keeps_the_same_prompt_and_children():
    tasks, texts, _ = normalize_tasks([{"task_id": f"t{i}", "prompt": f"p{i}",
                                        "x": {"b": 1, "a": 2}} for i in range(3)], ("task_id",))
    (packed,) = KEYS.pack(tasks, 3, texts)
    reloaded = Request(packed.key, tuple(json.loads(packed.tasks_json)), packed.position)
    prompt = render_items_prompt(packed.tasks, ("task_id",), None, packed.tasks_json)
    assert prompt == render_items_prompt(reloaded.tasks, ("task_id",), None)
    assert [c.key for c in KEYS.split(packed)] == [c.key for c in KEYS.split(reloaded)]


@settings(max_examples=100, deadline=None)
@given(task_lists(), st.dictionaries(st.text(), st.text(), min_size=1))
def test_spliced_keys_equal_request_key_for_any_content_names(tasks, content):
    normalized, _, _ = normalize_tasks(tasks, ("task_id",))
    assert key_maker(content)(json.dumps(normalized, sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=False)) == request_key(normalized, content)


def test_a_remembered_key_is_the_key_however_many_texts_came_between(monkeypatch):
    """Each pass of a run (survey, record, send) asks for the same keys: they are remembered,
    a bounded number, and a key given again, remembered or made anew, is the same key."""
    import batchjson._content.keys as keys_module

    monkeypatch.setattr(keys_module, "KEYS_HELD", 3)
    key = key_maker(CONTENT)
    texts = [canonical_json([{"task_id": f"t{i}", "prompt": "é" * i}]) for i in range(8)]
    first = [key(text) for text in texts]
    assert first == [request_key(json.loads(text), CONTENT) for text in texts]
    assert [key(text) for text in reversed(texts)] == first[::-1]  # past the bound: anew
    assert [key(text) for text in texts[-2:]] == first[-2:]  # remembered


def test_an_enum_member_as_an_identity_value_is_held_as_the_scalar_it_encodes_to():
    tasks, _, _ = normalize_tasks([{"task_id": "a", "prompt": "p", "case_id": Shade.DARK}],
                               ("task_id", "case_id"))
    assert tasks == [{"task_id": "a", "prompt": "p", "case_id": "dark"}]
    assert type(tasks[0]["case_id"]) is str


_json_texts = st.one_of(
    json_values.map(json.dumps),
    json_values.map(lambda value: json.dumps(value, ensure_ascii=False)),
    st.text(alphabet='{}[]",:0123456789.eE+-tnufalsr \\u\n\ud800\x00é', max_size=40),
)


def _read(read, text):
    try:
        return "read", repr(read(text))
    except (ValueError, RecursionError) as exc:
        return "raised", type(exc)


@settings(max_examples=600)
@given(_json_texts)
def test_task_texts_and_replies_are_read_exactly_as_json_loads_reads_them(text):
    """Tasks, request texts and provider replies are read by a faster parser: each must read to
    the very value (a big integer, -0.0, a lone surrogate escape) and refuse the very texts
    json.loads does, or a stored request would be keyed and judged against other tasks."""
    assert _read(read_json, text) == _read(json.loads, text)
    assert _read(read_json, text.encode("utf-8", "surrogatepass")) == _read(
        json.loads, text.encode("utf-8", "surrogatepass"))


def test_json_the_fast_parser_refuses_is_still_read_as_json_loads_reads_it():
    for text in ('"\\ud800"', '{"a": "\\udc00\\ud800"}', "[" * 600 + "]" * 600,
                 '{"n": 123456789012345678901234567890, "z": -0.0, "big": 1e400}'):
        assert repr(read_json(text)) == repr(json.loads(text))
    deepest = "[" * 100_000 + "]" * 100_000
    assert _read(read_json, deepest) == _read(json.loads, deepest)


def test_a_value_that_failed_to_encode_part_way_encodes_once_fixed():
    """An encoder records the containers it is inside; one failing part way (a task holding an
    object) must not leave them recorded, or fixing that task and running again would be refused
    as a circular reference, in the keying form and in the ledger's alike."""
    for encode in (canonical_json, ledger_json):
        task = {"task_id": "t1", "prompt": "p", "context": {"when": object()}}
        try:
            encode(task)
        except TypeError:
            pass
        else:
            raise AssertionError("an object has no JSON form")
        task["context"]["when"] = "2026-12-03"
        assert json.loads(encode(task)) == {"task_id": "t1", "prompt": "p",
                                            "context": {"when": "2026-12-03"}}


class _CaseBlindId(str):
    """An id type that compares and hashes without case: its JSON text is its own text."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.lower())


def test_ids_that_repeat_as_text_are_refused_whatever_their_type_compares_as():
    """The duplicate check reads an id as the text the ledger records: a str subclass whose own
    hash or equality differ from its text's must not let two tasks of one id through (two calls
    paid, one answer lost)."""
    from batchjson import CallableProvider, InvalidBatch, Session

    calls = []
    session = Session(CallableProvider(lambda call: calls.append(call) or "{}", source="m"))
    twice = [{"task_id": _CaseBlindId("Ab"), "prompt": "first"},
             {"task_id": _CaseBlindId("Ab"), "prompt": "second"}]
    for pack in (1, 2):
        try:
            session.run_batch("twice", iter(twice), {"type": "object"}, pack=pack)
        except InvalidBatch as exc:
            assert "duplicate task_id 'Ab' (tasks #0 and #1)" in str(exc)
        else:
            raise AssertionError("a repeated id was let through")
    try:
        normalize_tasks(twice, None)  # unpacked: the tasks themselves held
    except InvalidBatch as exc:
        assert "duplicate task_id 'Ab' (tasks #0 and #1)" in str(exc)
    else:
        raise AssertionError("a repeated id was let through")
    apart = [{"task_id": _CaseBlindId("Ab"), "prompt": "p"},
             {"task_id": _CaseBlindId("aB"), "prompt": "p"}]  # alike to the type, not as text
    assert [t["task_id"] for t in normalize_tasks(apart, None)[0]] == ["Ab", "aB"]
    assert not calls
    session.close()


def test_a_task_that_is_a_mapping_but_not_a_dict_is_taken_as_its_items():
    from types import MappingProxyType

    tasks = [MappingProxyType({"task_id": "a", "prompt": "p", "case_id": "078"}), {
        "task_id": "b", "prompt": "q", "case_id": "079"}]
    held, texts, _ = normalize_tasks(tasks, ["task_id", "case_id"])
    assert held == [{"task_id": "a", "prompt": "p", "case_id": "078"},
                    {"task_id": "b", "prompt": "q", "case_id": "079"}]
    assert texts[0] == canonical_json(dict(tasks[0]))
