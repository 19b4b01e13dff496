"""Content fingerprints: what a notebook user relies on when a cell is re-run."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, field_validator

from batchjson._fingerprint.fingerprint import (
    Fingerprint,
    Unhashable,
    canonical_json,
    content_hash,
    describe_changes,
    fingerprint_function,
)

SRC = Path(__file__).resolve().parents[1] / "src"

CELL = '''
THRESHOLD = 0.5
LABELS = ["positive", "negative", "neutral"]
ALLOWED = {"en", "de", "fr"}

def is_known(label):
    return label in LABELS

def validate_labels(items, limit=3, *, strict=True):
    errors = []
    for i, item in enumerate(items):
        if not is_known(item["label"]) or item["lang"] not in ALLOWED:
            errors.append(f"item {i}: bad label")
        elif strict and item["score"] < THRESHOLD:
            errors.append(f"item {i}: low score")
    if len(errors) > limit:
        raise RuntimeError("; ".join(errors))
    return errors
'''


def run_cell(src: str, ns: dict[str, Any] | None = None, filename: str = "<cell>") -> dict:
    """Execute source the way a notebook / RLM REPL executes a cell."""
    ns = {} if ns is None else ns
    exec(compile(src, filename, "exec"), ns)
    return ns


def fp_of(src: str, name: str = "validate_labels", **kw: Any) -> Fingerprint:
    return fingerprint_function(run_cell(src, **kw)[name])


# --- same content, same digest ------------------------------------------------------------


def test_reexecuted_cell_gives_same_digest_for_a_new_object() -> None:
    ns = run_cell(CELL)
    first = ns["validate_labels"]
    fp1 = fingerprint_function(first)
    run_cell(CELL, ns)
    assert ns["validate_labels"] is not first
    fp2 = fingerprint_function(ns["validate_labels"])
    assert fp2 == fp1
    assert fp2.stable and fp2.by_identity == ()
    assert len(fp1.digest) == 64 and fp1.short == fp1.digest[:12]


def test_other_line_other_file_other_namespace_same_digest() -> None:
    base = fp_of(CELL)
    moved = fp_of("\n\n\n# a comment\n" + CELL, filename="/somewhere/else/analysis.py")
    assert moved.digest == base.digest
    assert fp_of(CELL, filename="<ipython-input-7-abc>").digest == base.digest


def test_inherited_future_flags_do_not_change_the_digest() -> None:
    # compile() and IPython carry `from __future__` flags over from earlier code.
    flag = __import__("__future__").annotations.compiler_flag
    plain, future = {}, {}
    exec(compile(CELL, "<cell>", "exec", dont_inherit=True), plain)
    exec(compile(CELL, "<cell>", "exec", flags=flag, dont_inherit=True), future)
    assert future["validate_labels"].__code__.co_flags != plain["validate_labels"].__code__.co_flags
    assert fingerprint_function(future["validate_labels"]) == fingerprint_function(
        plain["validate_labels"])


def test_digest_survives_bytecode_specialisation() -> None:
    ns = run_cell(CELL)
    before = fingerprint_function(ns["validate_labels"])
    item = {"label": "positive", "lang": "en", "score": 0.9}
    for _ in range(2000):  # warm the adaptive interpreter
        ns["validate_labels"]([item] * 3)
    assert fingerprint_function(ns["validate_labels"]) == before


def test_parts_name_the_components() -> None:
    names = [n for n, _ in fp_of(CELL).parts]
    assert names[0] == "code"
    for expected in ("defaults", "kwdefaults", "global:THRESHOLD",
                     "global:ALLOWED", "global:is_known", "builtin:enumerate"):
        assert expected in names


# --- changed content, changed digest, named change ----------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "phrase"),
    [
        ("THRESHOLD = 0.5", "THRESHOLD = 0.7", "global THRESHOLD changed"),
        ('"neutral"]', '"neutral", "mixed"]',  # via the helper, and named through it
         "global is_known: global LABELS changed"),
        ('{"en", "de", "fr"}', '{"en", "de"}', "global ALLOWED changed"),
        ("limit=3", "limit=4", "default arguments changed"),
        ("strict=True", "strict=False", "keyword-only defaults changed"),
        ("errors.append(f\"item {i}: low score\")", "pass", "code changed"),
        ("return label in LABELS", "return label in LABELS[:2]", "global is_known: code changed"),
    ],
)
def test_changes_are_detected_and_named(old: str, new: str, phrase: str) -> None:
    assert old in CELL
    before, after = fp_of(CELL), fp_of(CELL.replace(old, new))
    assert after.digest != before.digest
    assert phrase in describe_changes(before, after)
    assert describe_changes(before, before) == []


def test_constant_inside_code_is_code() -> None:
    a = fingerprint_function(lambda x: x > 0.5)
    b = fingerprint_function(lambda x: x > 0.6)
    assert a.digest != b.digest and describe_changes(a, b) == ["code changed"]


def test_mutated_global_data_changes_digest() -> None:
    ns = run_cell(CELL)
    before = fingerprint_function(ns["validate_labels"])
    ns["LABELS"].append("mixed")
    after = fingerprint_function(ns["validate_labels"])
    assert describe_changes(before, after) == ["global is_known: global LABELS changed"]
    assert describe_changes(fingerprint_function(ns["is_known"]), fingerprint_function(
        run_cell(CELL)["is_known"])) == ["global LABELS changed"]


def test_closure_value_change_is_named() -> None:
    def make(threshold: float):
        def check(x: float) -> bool:
            return x > threshold

        return check

    a, b = fingerprint_function(make(0.5)), fingerprint_function(make(0.7))
    assert fingerprint_function(make(0.5)) == a
    assert describe_changes(a, b) == ["closure variable threshold changed"]


def test_added_and_removed_globals() -> None:
    a = fp_of("def f(x):\n    return x\n", name="f")
    b = fp_of("labels = ['a']\ndef f(x):\n    return x in labels\n", name="f")
    changes = describe_changes(a, b)
    assert "code changed" in changes and "global labels added" in changes
    assert "global labels removed" in describe_changes(b, a)


# --- recursion, identity fallback, other callables ----------------------------------------


def test_recursive_and_mutually_recursive_functions_terminate() -> None:
    src = (
        "def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n"
        "def even(n):\n    return n == 0 or odd(n - 1)\n"
        "def odd(n):\n    return n != 0 and even(n - 1)\n"
    )
    ns1, ns2 = run_cell(src), run_cell(src)
    for name in ("fact", "even", "odd"):
        fp = fingerprint_function(ns1[name])
        assert fp.stable and fingerprint_function(ns2[name]) == fp
    assert fingerprint_function(ns1["even"]) != fingerprint_function(ns1["odd"])
    changed = run_cell(src.replace("n != 0 and", "n != 1 and"))
    assert fingerprint_function(changed["even"]) != fingerprint_function(ns1["even"])


def test_opaque_global_falls_back_to_identity_and_is_named() -> None:
    src = "def f(x):\n    return db.execute(x)\n"
    db = sqlite3.connect(":memory:")  # a database's content is out of sight
    fp = fp_of(src, name="f", ns={"db": db})
    assert fp.by_identity == ("global:db",) and not fp.stable
    assert not fp.partial  # the very object is compared: nothing about it is unseen
    assert fp_of(src, name="f", ns={"db": db}) == fp  # same object: same digest
    other = fp_of(src, name="f", ns={"db": sqlite3.connect(":memory:")})
    assert other != fp
    assert describe_changes(fp, other) == ["global db changed (compared by identity)"]


def test_identity_fallback_in_a_helper_is_named_through_the_helper() -> None:
    src = "def helper():\n    return db\ndef f(x):\n    return helper()\n"
    fp = fp_of(src, name="f", ns={"db": sqlite3.connect(":memory:")})
    assert fp.by_identity == ("global:helper>global:db",)


def test_locks_go_by_type_and_loggers_by_name() -> None:
    src = "def f(x):\n    with lock:\n        log.debug(x)\n        return x\n"
    fp = fp_of(src, name="f", ns={"lock": threading.Lock(), "log": logging.getLogger("a.b")})
    assert fp.stable and not fp.partial
    again = fp_of(src, name="f", ns={"lock": threading.Lock(), "log": logging.getLogger("a.b")})
    assert again == fp
    assert fp_of(src, name="f", ns={"lock": threading.RLock(),
                                    "log": logging.getLogger("a.b")}) != fp
    renamed = fp_of(src, name="f", ns={"lock": threading.Lock(), "log": logging.getLogger("a.c")})
    assert describe_changes(fp, renamed) == ["global log: logger name changed"]


def test_partial_bound_method_and_callable_instance() -> None:
    ns = run_cell(CELL)
    v = ns["validate_labels"]
    p1 = fingerprint_function(functools.partial(v, limit=5))
    assert fingerprint_function(functools.partial(v, limit=5)) == p1
    p2 = fingerprint_function(functools.partial(v, limit=6))
    assert describe_changes(p1, p2) == ["partial keywords changed"]

    class Checker:
        def __init__(self, cutoff: int) -> None:
            self.cutoff = cutoff

        def __call__(self, x: int) -> bool:
            return x > self.cutoff

        def check(self, x: int) -> bool:
            return x > self.cutoff

    a, b = Checker(1), Checker(2)
    assert fingerprint_function(a) == fingerprint_function(Checker(1))
    assert "instance state changed" in describe_changes(fingerprint_function(a),
                                                        fingerprint_function(b))
    assert fingerprint_function(a.check) == fingerprint_function(Checker(1).check)
    assert fingerprint_function(a.check) != fingerprint_function(b.check)


def test_modules_builtins_and_compiled_patterns_are_stable() -> None:
    src = "import json, re\nPAT = re.compile(r'^[a-z]+$')\ndef f(s):\n" \
          "    return bool(PAT.match(s)) and json.dumps(s) and len(s)\n"
    fp = fp_of(src, name="f")
    assert fp.stable and fp_of(src, name="f") == fp
    changed = fp_of(src.replace("[a-z]", "[a-c]"), name="f")
    assert describe_changes(fp, changed) == ["global PAT changed"]


def test_pydantic_model_field_validator_change_is_detected() -> None:
    src = (
        "from pydantic import BaseModel, field_validator\n"
        "class Item(BaseModel):\n    label: str\n"
        "    @field_validator('label')\n    @classmethod\n"
        "    def known(cls, v):\n        assert v in ('a', 'b')\n        return v\n"
        "def f(x):\n    return Item.model_validate(x)\n"
    )
    fp = fp_of(src, name="f")
    assert fp.stable and fp_of(src, name="f") == fp
    assert fp_of(src.replace("('a', 'b')", "('a',)"), name="f") != fp


def test_loggers_go_by_name_user_objects_by_content() -> None:
    src = "def f(x):\n    log.debug(x)\n    return x > cfg.cutoff\n"
    config_cls = run_cell("class Config:\n    def __init__(self, c):\n        self.cutoff = c\n")
    make = config_cls["Config"]
    log = logging.getLogger("batchjson.test")
    fp = fp_of(src, name="f", ns={"log": log, "cfg": make(3)})
    assert fp.stable and not fp.partial
    log.isEnabledFor(10)  # a Logger's caches churn: never walked
    assert fp_of(src, name="f", ns={"log": log, "cfg": make(3)}) == fp
    changed = fp_of(src, name="f", ns={"log": log, "cfg": make(4)})
    assert describe_changes(fp, changed) == ["global cfg: instance state changed"]


def test_not_callable_is_rejected() -> None:
    with pytest.raises(TypeError):
        fingerprint_function(42)  # type: ignore[arg-type]


# --- cross-process stability ---------------------------------------------------------------

RICH = '''
import dataclasses, enum, functools, re
from pydantic import BaseModel, field_validator

class Label(enum.Enum):
    POS = "pos"
    NEG = "neg"

@dataclasses.dataclass
class Rules:
    cutoff: float
    allowed: frozenset

class Item(BaseModel):
    label: str
    @field_validator("label")
    @classmethod
    def known(cls, v):
        return Label(v).value

class Scorer:
    weight = 2
    def __call__(self, x):
        return x * self.weight

PAT = re.compile(r"^[a-z]+$", re.I)
RULES = Rules(0.5, frozenset({"a", "b", "c"}))

def make_depth():
    def depth(n):
        return 0 if n <= 0 else 1 + depth(n - 1)
    return depth

def validate(value, index, *, scorer=Scorer()):
    item = Item.model_validate(value)
    assert PAT.match(item.label) and make_depth()(2) == 2
    assert scorer(value["score"]) > RULES.cutoff and item.label in RULES.allowed

bounded = functools.partial(validate, index=0)
'''

CHILD = """
import json, sys
from batchjson._fingerprint.fingerprint import content_hash, fingerprint_function
out = []
for src, name in ((sys.argv[1], "validate_labels"), (sys.argv[2], "validate"),
                  (sys.argv[2], "bounded")):
    ns = {}
    exec(compile(src, "<cell>", "exec"), ns)
    fp = fingerprint_function(ns[name])
    out.append([fp.digest, list(fp.by_identity)])
out.append(content_hash([{"b": 1, "a": {"x", "y", "z"}}, (1, 2.5, None, b"q")]))
print(json.dumps(out))
"""


def test_digest_is_identical_in_other_processes_with_other_hash_seeds() -> None:
    here: list[Any] = []
    for src, name in ((CELL, "validate_labels"), (RICH, "validate"), (RICH, "bounded")):
        fp = fp_of(src, name=name)
        assert fp.stable, fp.by_identity
        here.append([fp.digest, []])
    here.append(content_hash([{"a": {"z", "y", "x"}, "b": 1}, (1, 2.5, None, b"q")]))
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", CHILD, CELL, RICH], env=env, check=True,
                             capture_output=True, text=True).stdout
        assert json.loads(out) == here


def test_rich_cell_changes_are_detected() -> None:
    base = fp_of(RICH, name="validate")
    for old, new in (("weight = 2", "weight = 3"), ('NEG = "neg"', 'NEG = "negative"'),
                     ("Label(v).value", "Label(v).name"), ("0.5, frozenset", "0.6, frozenset"),
                     ("1 + depth(n - 1)", "2 + depth(n - 1)"), ("re.I)", "0)")):
        assert old in RICH
        assert fp_of(RICH.replace(old, new), name="validate") != base, old


# --- content_hash ----------------------------------------------------------------------------


def test_content_hash_is_type_exact() -> None:
    values = [1, True, "1", [1], (1,), 1.0, b"1", {"1": 1}, {1: 1}, {1}, frozenset({1}), None,
              0, False, "", [], (), {}, 0.0, -0.0, [[1]], [(1,)], ["1"]]
    digests = [content_hash(v) for v in values]
    assert len(set(digests)) == len(values)


def test_content_hash_ignores_dict_and_set_order() -> None:
    assert content_hash({"a": 1, "b": [1, 2]}) == content_hash({"b": [1, 2], "a": 1})
    assert content_hash({3: "x", "3": "y"}) == content_hash({"3": "y", 3: "x"})
    assert content_hash({"x", "y", "z", 1}) == content_hash({1, "z", "y", "x"})
    assert content_hash([1, 2]) != content_hash([2, 1])


def test_records_fast_path_keeps_order_insensitivity_and_types() -> None:
    rows = [{"id": i, "label": "a", "score": i / 3} for i in range(50)]
    shuffled = [{"score": r["score"], "id": r["id"], "label": r["label"]} for r in rows]
    assert content_hash(rows) == content_hash(shuffled)
    variants = [
        [dict(r) for r in rows[:-1]] + [{**rows[-1], "id": True}],  # bool vs int
        [dict(r) for r in rows[:-1]] + [{**rows[-1], "id": str(rows[-1]["id"])}],
        [dict(r) for r in rows[:-1]] + [{**rows[-1], "meta": (1,)}],  # extra key
        [dict(r) for r in rows[:-1]] + [{"id": 49, "label": "a", "other": 1}],  # other key
        tuple(rows),
        [{**r, "label": ["a"]} for r in rows],
        [{**r, "label": ("a",)} for r in rows],
    ]
    digests = {content_hash(v) for v in variants} | {content_hash(rows)}
    assert len(digests) == len(variants) + 1
    assert content_hash([{"a": 1, "b": 2}]) != content_hash([{"a": 1, "c": 2}])
    assert content_hash([{"a": [1]}, {"a": [2]}]) != content_hash([{"b": [1]}, {"b": [2]}])


def test_content_hash_of_models_enums_and_dataclasses() -> None:
    class Color(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Box:
        w: int
        tags: set[str]

    class Item(BaseModel):
        label: str

        @field_validator("label")
        @classmethod
        def strip(cls, v: str) -> str:
            return v.strip()

    assert content_hash(Color.RED) != content_hash("red")
    assert content_hash(Box(1, {"a", "b"})) == content_hash(Box(1, {"b", "a"}))
    assert content_hash(Box(1, set())) != content_hash(Box(2, set()))
    assert content_hash(Item(label="x")) == content_hash(Item(label=" x "))
    assert content_hash(Item(label="x")) != content_hash({"label": "x"})
    assert content_hash(Item) == content_hash(Item)
    assert len(content_hash(Item)) == 64


def test_unhashable_values_raise() -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    @dataclasses.dataclass
    class Plain:
        x: int = 1

    for value in (object(), threading.Lock(), cyclic, lambda: 1, re.compile("x"), Plain, int):
        with pytest.raises(Unhashable):
            content_hash(value)


def test_canonical_json() -> None:
    assert canonical_json({"b": 1, "a": ["é", 2.5]}) == '{"a":["é",2.5],"b":1}'
    with pytest.raises(ValueError):
        canonical_json(float("nan"))


def test_canonical_json_refuses_what_json_dumps_refuses() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    for value, error in ((cyclic, ValueError), ({"a": float("inf")}, ValueError),
                         ([object()], TypeError), ({1: 1, "a": 2}, TypeError)):
        with pytest.raises(error):
            canonical_json(value)
    refused = [1, [float("nan")]]
    with pytest.raises(ValueError):
        canonical_json({"a": refused})
    refused[1] = 2  # the encoder that failed inside it would call it a cycle now
    assert canonical_json({"a": refused}) == '{"a":[1,2]}'


# --- properties ------------------------------------------------------------------------------

ATOMS = st.sampled_from([0, 1, True, False, "1", "", 1.0, 0.0, -0.0, None, "a", b"a"])
KEYS = st.sampled_from(["a", "b", "1", 1, 2])
SMALL = st.recursive(
    ATOMS,
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(KEYS, inner, max_size=3)
    | st.frozensets(ATOMS, max_size=3),
    max_leaves=8,
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def strict_eq(a: Any, b: Any) -> bool:
    """Equality that also compares types, float signs and dict keys' types."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        ka = {(type(k), k): v for k, v in a.items()}
        kb = {(type(k), k): v for k, v in b.items()}
        return ka.keys() == kb.keys() and all(strict_eq(ka[k], kb[k]) for k in ka)
    if isinstance(a, frozenset):
        return {(type(x), repr(x)) for x in a} == {(type(x), repr(x)) for x in b}
    return a == b


def tuplify(x: Any) -> Any:
    if isinstance(x, list):
        return tuple(tuplify(e) for e in x)
    if isinstance(x, dict):
        return {k: tuplify(v) for k, v in x.items()}
    return x


def contains_list(x: Any) -> bool:
    if isinstance(x, list):
        return True
    return isinstance(x, dict) and any(contains_list(v) for v in x.values())


@settings(max_examples=300, deadline=None)
@given(SMALL, SMALL)
def test_hash_equality_is_strict_equality(a: Any, b: Any) -> None:
    assert (content_hash(a) == content_hash(b)) == strict_eq(a, b)


RECORDS = st.lists(st.dictionaries(st.sampled_from("ab"), ATOMS | SMALL, min_size=1, max_size=2),
                  min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(RECORDS, RECORDS)
def test_records_hash_equality_is_strict_equality(a: Any, b: Any) -> None:
    assert (content_hash(a) == content_hash(b)) == strict_eq(a, b)


@settings(max_examples=200, deadline=None)
@given(st.one_of(SMALL, JSON, st.lists(st.fixed_dictionaries({"k": JSON, "n": st.integers()}))))
def test_hash_survives_deepcopy(x: Any) -> None:
    assert content_hash(copy.deepcopy(x)) == content_hash(x)


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_json_equal_but_type_different_values_differ(x: Any) -> None:
    if contains_list(x):
        assert canonical_json(tuplify(x)) == canonical_json(x)
        assert content_hash(tuplify(x)) != content_hash(x)
    if isinstance(x, dict) and x:
        reordered = dict(reversed(list(x.items())))
        assert content_hash(reordered) == content_hash(x)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_canonical_json_is_the_standard_encoders_text(x: Any) -> None:
    """canonical_json calls the stdlib's C encoder directly: the text is json.dumps's, byte for
    byte, since stored keys are hashes of it."""
    assert canonical_json(x) == json.dumps(x, sort_keys=True, separators=(",", ":"),
                                           ensure_ascii=False, allow_nan=False)


def _labels_check() -> Any:
    def check(value: Any, index: int) -> None:
        if value["label"] not in check.allowed:
            raise ValueError("bad label")
    return check


def _counting_check() -> Any:
    def check(value: Any, index: int) -> None:
        check.calls += 1
    check.calls = 0
    return check


def test_an_attribute_set_on_a_validator_function_is_part_of_what_it_is():
    """``check.allowed = ...`` set by a cell decides what ``check`` accepts: narrowing it is a
    new validator (its stored answers judged again), while a count the function keeps of its
    own calls changes nothing."""
    wide, narrow, again = _labels_check(), _labels_check(), _labels_check()
    wide.allowed, narrow.allowed, again.allowed = ("pos", "maybe"), ("pos",), ("pos", "maybe")
    assert fingerprint_function(wide).digest != fingerprint_function(narrow).digest
    assert fingerprint_function(wide).digest == fingerprint_function(again).digest
    counting = _counting_check()
    before = fingerprint_function(counting).digest
    counting.calls += 5
    assert fingerprint_function(counting).digest == before
    assert fingerprint_function(_counting_check()).digest == before


def test_a_validator_reading_an_attribute_of_itself_rejudges_when_the_attribute_narrows():
    from batchjson.rlm import bind

    calls: list[str] = []

    def helper(prompts: list[str]) -> list[str]:
        calls.extend(prompts)
        return ['{"label": "maybe"}' for _ in prompts]

    namespace: dict[str, Any] = {"prompts": ["a", "b"]}
    bind(namespace, helper)
    schema = {"type": "object", "properties": {"label": {"type": "string"}},
              "required": ["label"]}
    cell = ("def check(value, index):\n"
            "    if value['label'] not in check.allowed:\n"
            "        raise ValueError('bad label')\n"
            "check.allowed = ALLOWED\n"
            "result = llm_batch_json(prompts, schema, validator=check, max_repair_attempts=0)\n")
    namespace.update(schema=schema, ALLOWED=("pos", "maybe"))
    exec(cell, namespace)
    assert namespace["result"]["values"] == [{"label": "maybe"}] * 2 and len(calls) == 2
    namespace["ALLOWED"] = ("pos",)
    exec(cell, namespace)
    assert namespace["result"]["values"] == [None, None]  # 'maybe' no longer passes


RULES_CELL = '''
import dataclasses, enum

@dataclasses.dataclass
class Rules:
    allowed: tuple = ("pos", "neg")
    def ok(self, label):
        return label.lower() in self.allowed

class Level(enum.Enum):
    LOW = 1
    def admits(self, score):
        return score >= self.value

class Labels(dict):
    def ok(self, label):
        return label in self

RULES, LEVEL, LABELS = Rules(), Level.LOW, Labels(pos=1)

def check(value, index):
    if not (RULES.ok(value["label"]) and LEVEL.admits(value["score"])
            and LABELS.ok(value["label"])):
        raise ValueError("rejected")
'''


@pytest.mark.parametrize("edit", [
    ("return label.lower() in self.allowed", "return label in self.allowed"),
    ("return score >= self.value", "return score > self.value"),
    ("return label in self", "return label.lower() in self"),
])
def test_a_method_edited_in_the_class_of_a_value_the_validator_reads_is_a_new_validator(edit):
    """A dataclass, an enum member or a dict subclass is read as data, but its class is the
    user's code: an edited method decides other verdicts, so its answers are judged again."""
    before, same = fp_of(RULES_CELL, "check"), fp_of(RULES_CELL, "check")
    assert before.digest == same.digest and not before.by_identity
    assert fp_of(RULES_CELL.replace(*edit), "check").digest != before.digest


def test_a_sentinel_made_anew_by_a_rerun_cell_keeps_the_validator_it_was():
    """``_NOTHING = object()`` in a re-executed cell is a new object each run, yet the check
    behaves the same: compared by identity it would make every re-run a changed validator, the
    seed's ratchet (strict refuses the re-run; otherwise its evidence is orphaned)."""
    from batchjson.rlm import bind

    cell = ("_NOTHING = object()\n"
            "def check(value, index):\n"
            "    if value.get('label', _NOTHING) is _NOTHING:\n"
            "        raise ValueError('no label')\n"
            "result = llm_batch_json(prompts, schema, validator=check, max_repair_attempts=0)\n")
    unlabelled = {"a"}  # answered without a label until the first run is over
    calls: list[str] = []

    def helper(prompts: list[str]) -> list[str]:
        calls.extend(prompts)
        return ['{"other": 1}' if any(p.endswith(u) for u in unlabelled) else '{"label": "pos"}'
                for p in prompts]

    namespace: dict[str, Any] = {"prompts": ["a", "b"], "schema": {"type": "object"}}
    bind(namespace, helper)  # strict: a changed validator with evidence owed is refused
    exec(cell, namespace)
    first = fingerprint_function(namespace["check"])
    assert namespace["result"]["values"][1] == {"label": "pos"} and not first.by_identity
    assert namespace["result"]["values"][0] is None
    unlabelled.clear()
    paid = len(calls)
    exec(cell, namespace)  # the host re-executes the cell after its error
    assert fingerprint_function(namespace["check"]).digest == first.digest
    assert namespace["result"]["values"] == [{"label": "pos"}] * 2
    assert len(calls) == paid + 1  # only the prompt still owed is asked again
    assert namespace["batch_status"]()["minimum_exact_retry_calls"] == 0


def test_a_container_the_validator_keeps_on_itself_never_makes_it_a_new_validator():
    """``check.seen`` filled while judging would give the same function a new fingerprint after
    every call (a ratchet): it counts by its type and is named unseen, so its stored answers
    are judged again rather than trusted."""
    def check(value: Any, index: int) -> None:
        check.seen.append(value)

    check.seen = []
    before = fingerprint_function(check)
    check({"label": "pos"}, 0)
    after = fingerprint_function(check)
    assert after.digest == before.digest and "check.seen" in after.unseen


CACHED_CELL = '''
import dataclasses, functools

@dataclasses.dataclass(frozen=True)
class Rules:
    allowed: tuple = ("pos",)
    @functools.cached_property
    def lowered(self):
        return {a.lower() for a in self.allowed}
    @functools.singledispatchmethod
    def ok(self, label):
        return False
    @ok.register
    def _(self, label: str):
        return label.lower() in self.lowered

RULES = Rules()

def check(value, index):
    if not RULES.ok(value["label"]):
        raise ValueError("rejected")
'''


def test_a_class_with_cached_or_dispatching_methods_is_the_same_validator_each_run():
    """Descriptors wrapping a function are new objects each time the class is defined: walked
    by their function, a re-run cell keeps its validator (no ratchet), an edit is seen."""
    first, again = fp_of(CACHED_CELL, "check"), fp_of(CACHED_CELL, "check")
    assert first.digest == again.digest and not first.by_identity
    edited = CACHED_CELL.replace("{a.lower() for a", "{a.upper() for a")
    assert fp_of(edited, "check").digest != first.digest
