"""Fingerprints see what decides acceptance: each change a user can make opens a new digest,
the change is named, and what cannot be seen is said."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchjson._content.schema import compile_schema
from batchjson._fingerprint.fingerprint import (
    Fingerprint,
    content_hash,
    describe_changes,
    fingerprint_function,
    model_fingerprint,
)

SRC = Path(__file__).resolve().parents[1] / "src"


def run_cell(src: str, ns: dict[str, Any] | None = None) -> dict[str, Any]:
    ns = {} if ns is None else ns
    exec(compile(src, "<cell>", "exec", dont_inherit=True), ns)  # no `annotations` future
    return ns


def fp_of(src: str, name: str = "check", ns: dict[str, Any] | None = None) -> Fingerprint:
    return fingerprint_function(run_cell(src, ns)[name])


# --- pydantic models by their whole class --------------------------------------------------

MODEL = '''
from typing import Annotated
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

class Evidence(BaseModel):
    quote: str = Field(min_length=1)

class Review(BaseModel):
    model_config = ConfigDict(extra="forbid")
    _threshold: float = PrivateAttr(default=0.5)
    verdict: str
    score: Annotated[float, Field(ge=0)]
    evidence: Evidence

    @field_validator("verdict")
    @classmethod
    def known(cls, v):
        if v not in ("match", "no_match"):
            raise ValueError("unknown verdict")
        return v

    @model_validator(mode="after")
    def confident(self):
        if self.score < 0.1:
            raise ValueError("too unsure")
        return self

def check(item, task):
    return Review.model_validate(item)
'''


@pytest.mark.parametrize(
    ("old", "new", "phrase", "same_json_schema"),
    [
        ('("match", "no_match")', '("match",)', "global Review: validator known: code changed",
         True),
        ("self.score < 0.1", "self.score < 0.2",
         "global Review: validator confident: code changed", True),
        ("ge=0", "ge=1", "global Review: model fields and constraints changed", False),
        ("min_length=1", "min_length=2",
         "global Review: model fields and constraints: class Evidence: model fields and "
         "constraints changed", False),
        ('extra="forbid"', 'extra="ignore"', "global Review: attribute model_config changed",
         False),
        ("default=0.5", "default=0.9", "global Review: private attribute _threshold changed",
         True),
    ],
)
def test_a_pydantic_edit_opens_a_new_fingerprint_and_schema(
        old: str, new: str, phrase: str, same_json_schema: bool) -> None:
    assert old in MODEL
    before, after = run_cell(MODEL), run_cell(MODEL.replace(old, new))
    fp_before, fp_after = fingerprint_function(before["check"]), fingerprint_function(
        after["check"])
    assert fp_before.stable and fp_after.digest != fp_before.digest
    assert phrase in describe_changes(fp_before, fp_after)
    # the answer schema's fingerprint (part of every request key) moves too, even when the JSON
    # schema the model is shown is the same: a field_validator edit is a new schema
    js_before = before["Review"].model_json_schema()
    assert (js_before == after["Review"].model_json_schema()) is same_json_schema
    assert (compile_schema(before["Review"]).fingerprint
            != compile_schema(after["Review"]).fingerprint)


def test_an_unchanged_model_keeps_its_schema_fingerprint_across_definitions() -> None:
    first, second = run_cell(MODEL)["Review"], run_cell(MODEL)["Review"]
    assert first is not second
    js = first.model_json_schema()
    assert model_fingerprint(first, js) == model_fingerprint(second, js)
    assert compile_schema(first).fingerprint == compile_schema(second).fingerprint


def test_a_model_class_referenced_by_a_validator_is_seen_through_an_annotated_validator() -> None:
    src = ("from typing import Annotated\nfrom pydantic import AfterValidator, BaseModel\n"
           "def short(v):\n    assert len(v) < 10\n    return v\n"
           "class Item(BaseModel):\n    label: Annotated[str, AfterValidator(short)]\n"
           "def check(item, task):\n    Item.model_validate(item)\n")
    before = fp_of(src)
    after = fp_of(src.replace("< 10", "< 5"))
    assert after.digest != before.digest
    assert any("global Item" in c for c in describe_changes(before, after))


# --- module attributes, class attributes, mutable objects, reloaded helpers ------------------


def test_a_module_attribute_the_code_reads_is_seen() -> None:
    cfg = types.ModuleType("review_cfg")
    cfg.THRESHOLD = 0.5
    src = "def check(item, task):\n    assert item['score'] >= cfg.THRESHOLD\n"
    before = fp_of(src, ns={"cfg": cfg})
    cfg.THRESHOLD = 0.9
    after = fp_of(src, ns={"cfg": cfg})
    assert after.digest != before.digest and before.stable and not before.partial
    assert describe_changes(before, after) == ["global cfg.THRESHOLD changed"]
    cfg.THRESHOLD = 0.5
    assert fp_of(src, ns={"cfg": cfg}) == before


def test_a_module_imported_inside_the_function_is_read_by_attribute(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("inner_cfg")
    module.LIMIT = 3
    monkeypatch.setitem(sys.modules, "inner_cfg", module)
    src = "def check(item, task):\n    import inner_cfg\n    assert item['n'] < inner_cfg.LIMIT\n"
    before = fp_of(src)
    module.LIMIT = 4
    assert describe_changes(before, fp_of(src)) == ["imported inner_cfg.LIMIT changed"]


def test_an_underscore_class_attribute_is_seen() -> None:
    src = ("class Check:\n    _limit = 0.5\n    def ok(self, x):\n"
           "        return x >= self._limit\n"
           "def check(item, task):\n    assert Check().ok(item['score'])\n")
    before, after = fp_of(src), fp_of(src.replace("0.5", "0.9"))
    assert after.digest != before.digest
    assert describe_changes(before, after) == ["global Check: attribute _limit changed"]


def test_a_mutated_simple_namespace_is_seen() -> None:
    src = "def check(item, task):\n    assert item['label'] in cfg.labels\n"
    cfg = types.SimpleNamespace(labels=["a", "b"])
    before = fp_of(src, ns={"cfg": cfg})
    cfg.labels.append("c")
    after = fp_of(src, ns={"cfg": cfg})
    assert after.digest != before.digest and after.stable
    assert describe_changes(before, after) == ["global cfg: instance state changed"]


HELPER = "LIMIT = {limit}\n\ndef ok(score):\n    return score >= LIMIT\n"


def test_a_reloaded_helper_module_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (tmp_path / "review_helpers.py").write_text(HELPER.format(limit=0.5))
    import review_helpers  # type: ignore[import-not-found]

    try:
        src = "def check(item, task):\n    assert review_helpers.ok(item['score'])\n"
        from_src = "from review_helpers import ok\ndef check(item, task):\n    assert ok(1)\n"
        ns = {"review_helpers": review_helpers}
        before, before_from = fp_of(src, ns=dict(ns)), fp_of(from_src)
        (tmp_path / "review_helpers.py").write_text(HELPER.format(limit=0.95))
        importlib.reload(review_helpers)
        after = fp_of(src, ns=dict(ns))
        assert after.digest != before.digest
        assert describe_changes(before, after) == [
            "global review_helpers.ok: global LIMIT changed"]
        assert fp_of(from_src).digest != before_from.digest  # re-imported after the reload
    finally:
        sys.modules.pop("review_helpers", None)


@pytest.mark.parametrize(
    ("body", "unseen"),
    [("assert item['n'] < globals()['LIMIT']", ("globals()",)),
     ("assert item['n'] < eval('LIMIT')", ("eval()",)),
     ("assert item['n'] < helper()", ("global:helper: vars()",))],
)
def test_what_no_fingerprint_can_see_is_said(body: str, unseen: tuple[str, ...]) -> None:
    src = f"LIMIT = 3\ndef helper():\n    return vars()\ndef check(item, task):\n    {body}\n"
    fp = fp_of(src)
    assert fp.partial and fp.unseen == unseen
    assert fp.stable  # the digest still means the same code everywhere
    assert not fp_of("def check(item, task):\n    return item\n").partial


# --- library objects by content, in every process ---------------------------------------------

LIB = '''
import dataclasses, enum, functools, logging, operator, re, string, threading, types
import jsonschema
from typing import Annotated
from pydantic import AfterValidator, TypeAdapter

def positive(v):
    if v <= 0:
        raise ValueError("not positive")
    return v

class Mode(enum.Enum):
    STRICT = "strict"

@dataclasses.dataclass
class Limits:
    low: int
    high: int

ints = TypeAdapter(list[Annotated[int, AfterValidator(positive)]])
checker = jsonschema.Draft202012Validator({"type": "object", "required": ["label"]})
get_label = operator.itemgetter("label")
get_real = operator.attrgetter("real")
log = logging.getLogger("batchjson.review")
cfg = types.SimpleNamespace(labels=("a", "b"), cutoff=0.5)
lock = threading.Lock()
rlock = threading.RLock()
note = string.Template("item $i: $why")
pat = re.compile(r"^[a-z]+$")
floor = functools.partial(max, 0)
limits = Limits(0, 10)
mode = Mode.STRICT

def check(item, task):
    with lock, rlock:
        ints.validate_python([item["n"]])
        checker.validate(item)
        log.debug(note.substitute(i=task["task_id"], why="checked"))
        assert get_label(item) in cfg.labels and pat.match(get_label(item))
        assert limits.low <= floor(get_real(item["score"])) <= limits.high
        assert mode is Mode.STRICT and item["score"] >= cfg.cutoff
'''

CHILD = """
import json, sys
from batchjson._fingerprint.fingerprint import fingerprint_function
ns = {}
exec(compile(sys.argv[1], "<cell>", "exec"), ns)
fp = fingerprint_function(ns["check"])
print(json.dumps([fp.digest, list(fp.by_identity), list(fp.unseen)]))
"""


def test_library_objects_fingerprint_identically_in_another_process() -> None:
    fp = fp_of(LIB)
    assert fp.stable and not fp.partial, (fp.by_identity, fp.unseen)
    assert fp_of(LIB) == fp  # a re-executed cell: every object new, the same digest
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", CHILD, LIB], env=env, check=True,
                             capture_output=True, text=True).stdout
        assert json.loads(out) == [fp.digest, [], []]


@pytest.mark.parametrize(
    ("old", "new"),
    [("v <= 0", "v <= 1"),  # the function inside a TypeAdapter's Annotated type
     ("list[Annotated", "tuple[Annotated"), ('"required": ["label"]', '"required": []'),
     ('itemgetter("label")', 'itemgetter("name")'), ('attrgetter("real")', 'attrgetter("imag")'),
     ('getLogger("batchjson.review")', 'getLogger("batchjson.other")'),
     ('cutoff=0.5', 'cutoff=0.6'), ("lock = threading.Lock()", "lock = threading.RLock()"),
     ('"item $i: $why"', '"$i: $why"'), ("[a-z]", "[a-c]"), ("partial(max, 0)", "partial(max, 1)"),
     ("Limits(0, 10)", "Limits(0, 11)"), ('STRICT = "strict"', 'STRICT = "lenient"')],
)
def test_each_library_object_is_seen_by_content(old: str, new: str) -> None:
    assert old in LIB
    assert fp_of(LIB.replace(old, new)).digest != fp_of(LIB).digest


def test_an_incomplete_model_is_compared_by_identity_never_as_equal() -> None:
    src = "from pydantic import BaseModel\nclass Item(BaseModel):\n    child: 'Missing'\n"
    first, second = run_cell(src)["Item"], run_cell(src)["Item"]
    fp = fingerprint_function(first)
    assert fp.by_identity == ("core",) and not fp.stable
    assert fingerprint_function(second).digest != fp.digest


def test_dataclass_fields_and_library_subclasses_are_seen_by_content() -> None:
    src = ("import collections, dataclasses\n"
           "@dataclasses.dataclass\nclass Limits:\n    low: int = 0\n"
           "    tags: list = dataclasses.field(default_factory=list, metadata={'unit': 'pt'})\n"
           "class Recent(collections.deque):\n    pass\n"
           "recent = Recent([1, 2])\n"
           "def check(item, task):\n    assert item['n'] not in recent and Limits().low == 0\n")
    fp = fp_of(src)
    assert fp.stable and fp_of(src) == fp  # field metadata is a read-only mapping: content
    assert fp_of(src.replace("low: int = 0", "low: int = 1")).digest != fp.digest
    assert fp_of(src.replace("Recent([1, 2])", "Recent([1, 3])")).digest != fp.digest


# --- properties ------------------------------------------------------------------------------

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(VALUES, VALUES)
def test_a_module_attribute_or_namespace_changes_the_digest_exactly_when_its_content_does(
        a: Any, b: Any) -> None:
    src = "def check(item, task):\n    return cfg.LIMIT, ns.limit\n"
    cfg_a, cfg_b = types.ModuleType("cfg"), types.ModuleType("cfg")
    cfg_a.LIMIT, cfg_b.LIMIT = a, b
    fa = fp_of(src, ns={"cfg": cfg_a, "ns": types.SimpleNamespace(limit=a)})
    fb = fp_of(src, ns={"cfg": cfg_b, "ns": types.SimpleNamespace(limit=b)})
    assert (fa.digest == fb.digest) == (content_hash(a) == content_hash(b))


def test_a_library_object_with_opaque_state_is_compared_as_itself_and_never_churns() -> None:
    import http.cookiejar

    jar = http.cookiejar.CookieJar()  # pools, caches, locks inside: walking them would churn
    src = "def check(item, task):\n    return len(jar)\n"
    fp = fp_of(src, ns={"jar": jar})
    assert fp.by_identity == ("global:jar",) and not fp.partial
    jar.clear()
    assert fp_of(src, ns={"jar": jar}) == fp


def test_getattr_with_a_constant_name_is_seen_and_with_a_variable_name_is_said() -> None:
    cfg = types.ModuleType("review_cfg")
    cfg.THRESHOLD = 0.5
    src = ("def check(item, task):\n    key = task['key']\n"
           "    return getattr(cfg, 'THRESHOLD') + getattr(cfg, key)\n")
    before = fp_of(src, ns={"cfg": cfg})
    assert before.unseen == ("getattr(cfg, <name>)",)
    cfg.THRESHOLD = 0.9
    assert describe_changes(before, fp_of(src, ns={"cfg": cfg})) == [
        "global cfg.THRESHOLD changed"]


def test_an_object_that_raises_when_read_is_compared_as_itself() -> None:
    class Hostile:
        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError("no peeking")

        def __call__(self, item: Any, task: Any) -> None:
            return None

    hostile = Hostile()
    fp = fingerprint_function(hostile)
    assert fp.by_identity == ("",) and not fp.stable
    assert fingerprint_function(hostile) == fp and fingerprint_function(Hostile()) != fp
    wrapped = fp_of("def check(item, task):\n    return hostile(item, task)\n",
                    ns={"hostile": hostile})
    assert wrapped.by_identity == ("global:hostile",)


def test_a_dispatch_table_whose_functions_read_it_is_seen_by_content() -> None:
    src = ("def a(x):\n    return HANDLERS['b'](x) if x else 0\n"
           "def b(x):\n    return HANDLERS['a'](x - 1)\n"
           "HANDLERS = {'a': a, 'b': b}\n"
           "TREE = {'n': 1}\nTREE['parent'] = TREE\n"
           "def check(item, task):\n    return HANDLERS['a'](item), TREE\n")
    fp = fp_of(src)
    assert fp.stable and fp_of(src) == fp  # cycles through code and data: no identity
    assert fp_of(src.replace("else 0", "else 1")).digest != fp.digest
    assert fp_of(src.replace("{'n': 1}", "{'n': 2}")).digest != fp.digest


def test_a_cached_function_is_seen_by_its_code_never_by_its_cache() -> None:
    src = ("import functools\n@functools.lru_cache(maxsize=None)\n"
           "def known(label):\n    return label in ('a', 'b')\n"
           "def check(item, task):\n    assert known(item['label'])\n")
    ns = run_cell(src)
    fp = fingerprint_function(ns["check"])
    ns["known"]("a"), ns["known"]("z")  # the cache fills
    assert fingerprint_function(ns["check"]) == fp and fp.stable
    changed = fp_of(src.replace("('a', 'b')", "('a',)"))
    assert describe_changes(fp, changed) == ["global known: code changed"]
