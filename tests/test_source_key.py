"""Answer-source keys (fingerprint_callable): code and immutable values, never mutable state.

A provider's answer function is part of every request key; a stub that counts its calls, logs
them or draws random numbers must keep one key across calls, or every call would orphan the
evidence of the one before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchjson._fingerprint.fingerprint import (
    describe_changes,
    fingerprint_callable,
    fingerprint_function,
)

SRC = Path(__file__).resolve().parents[1] / "src"

STUBS = '''
import dataclasses, itertools, random, threading

MODEL = "offline-v1"
CALLS = 0
LOG = []

@dataclasses.dataclass(frozen=True)
class Style:
    tone: str = "terse"

STYLE = Style()

def answer(call):
    global CALLS
    CALLS += 1
    LOG.append(call)
    return {"model": MODEL, "tone": STYLE.tone, "n": len(call)}

def make_counter():
    count = 0
    def counted(call):
        nonlocal count
        count += 1
        return MODEL
    return counted

class Stub:
    label = "stub"
    served = 0
    def __init__(self):
        self.calls = 0
        self.rng = random.Random(7)
        self.lock = threading.Lock()
        self.cache = {}
        self.ids = itertools.count()
    def __call__(self, call):
        with self.lock:
            self.calls += 1
            Stub.served += 1
            self.cache[next(self.ids)] = self.rng.random()
        return self.label
    def reply(self, call):
        self.calls += 1
        return self.label + MODEL
'''


def stubs(src: str = STUBS) -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(compile(src, "<cell>", "exec", dont_inherit=True), ns)
    stub = ns["Stub"]()
    return {"answer": ns["answer"], "counted": ns["make_counter"](), "stub": stub,
            "reply": stub.reply, "ns": ns}


SOURCES = ("answer", "counted", "stub", "reply")


@pytest.mark.parametrize("name", SOURCES)
def test_a_stub_that_counts_logs_and_draws_keeps_one_key_across_calls(name: str) -> None:
    made = stubs()
    source = made[name]
    before = fingerprint_callable(source)
    for i in range(5):
        source([i] * i)
    assert fingerprint_callable(source) == before
    assert before.stable and not before.partial


def test_a_bound_method_keeps_its_key_while_its_object_s_counter_changes() -> None:
    made = stubs()
    stub = made["stub"]
    key = fingerprint_callable(stub.reply)
    stub.calls = 1000
    stub.cache["x"] = 1
    assert fingerprint_callable(stub.reply) == key
    assert fingerprint_callable(stubs()["stub"].reply) == key  # another object, same source


@pytest.mark.parametrize("name", SOURCES)
def test_the_same_source_defined_again_has_the_same_key(name: str) -> None:
    assert fingerprint_callable(stubs()[name]) == fingerprint_callable(stubs()[name])


@pytest.mark.parametrize(
    ("old", "new", "keys_moved"),
    [('MODEL = "offline-v1"', 'MODEL = "offline-v2"', set(SOURCES)),
     ('tone: str = "terse"', 'tone: str = "chatty"', {"answer"}),
     ('label = "stub"', 'label = "robot"', {"stub", "reply"}),
     ('"n": len(call)', '"n": len(call) + 1', {"answer"}),
     ("count += 1", "count += 2", {"counted"})],
)
def test_code_and_immutable_values_move_the_key(old: str, new: str, keys_moved: set) -> None:
    assert old in STUBS
    before, after = stubs(), stubs(STUBS.replace(old, new))
    moved = {n for n in SOURCES
             if fingerprint_callable(before[n]) != fingerprint_callable(after[n])}
    assert moved == keys_moved


def test_a_changed_immutable_global_is_named() -> None:
    before, after = stubs(), stubs(STUBS.replace("offline-v1", "offline-v2"))
    assert describe_changes(fingerprint_callable(before["answer"]),
                            fingerprint_callable(after["answer"])) == ["global MODEL changed"]


def test_mutable_values_a_source_reads_are_keyed_by_type_only() -> None:
    src = "ANSWERS = {'a': 1}\ndef answer(call):\n    return ANSWERS.get(call)\n"
    ns: dict[str, Any] = {}
    exec(src, ns)
    key = fingerprint_callable(ns["answer"])
    ns["ANSWERS"]["a"] = 2  # a cache or a log looks just like this: never part of the key
    assert fingerprint_callable(ns["answer"]) == key
    ns["ANSWERS"] = ("a", 2)  # rebinding to an immutable value is a different source
    assert fingerprint_callable(ns["answer"]) != key


def test_source_keys_never_equal_validator_fingerprints() -> None:
    answer = stubs()["answer"]
    assert fingerprint_callable(answer).digest != fingerprint_function(answer).digest


CHILD = """
import json, sys
from batchjson._fingerprint.fingerprint import fingerprint_callable
ns = {}
exec(compile(sys.argv[1], "<cell>", "exec", dont_inherit=True), ns)
stub = ns["Stub"]()
stub(1)
print(json.dumps([fingerprint_callable(x).digest for x in
                  (ns["answer"], ns["make_counter"](), stub, stub.reply)]))
"""


def test_source_keys_are_the_same_in_another_process() -> None:
    made = stubs()
    here = [fingerprint_callable(made[n]).digest for n in SOURCES]
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": "99"}
    out = subprocess.run([sys.executable, "-c", CHILD, STUBS], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert json.loads(out) == here


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers() | st.text(max_size=5), max_size=8),
       st.dictionaries(st.text(max_size=3), st.integers(), max_size=4))
def test_any_mutation_of_a_source_s_state_keeps_its_key(calls: list[Any], cache: dict) -> None:
    made = stubs()
    stub = made["stub"]
    keys = {fingerprint_callable(stub), fingerprint_callable(stub.reply)}
    for call in calls:
        stub(call)
        made["answer"]([call])
    stub.cache.update(cache)
    stub.calls = len(calls)
    assert {fingerprint_callable(stub), fingerprint_callable(stub.reply)} == keys


SUBCALL = """
class Sub:
    def __init__(self, model, temperature=0.0):
        self.model = model
        self.temperature = temperature
        self.calls = 0
        self.history = []
    def ask(self, question):
        self.calls += 1
        self.history.append(question)
        return f"{self.model}: {question}"
"""


def test_a_source_object_is_keyed_by_its_configuration_not_by_what_it_mutates() -> None:
    ns: dict[str, Any] = {}
    exec(SUBCALL, ns)
    first, second = ns["Sub"]("gpt"), ns["Sub"]("gpt")
    for question in ("a", "b", "c"):
        second.ask(question)  # calls and history change: the key does not
    assert fingerprint_callable(first) == fingerprint_callable(second)
    assert fingerprint_callable(first.ask) == fingerprint_callable(second.ask)
    # another model or setting is another answer source
    assert fingerprint_callable(ns["Sub"]("llama")) != fingerprint_callable(first)
    assert fingerprint_callable(ns["Sub"]("gpt", 0.7).ask) != fingerprint_callable(first.ask)
    assert describe_changes(fingerprint_callable(first), fingerprint_callable(
        ns["Sub"]("llama"))) == ["configuration changed"]


def test_a_plain_value_is_keyed_by_its_content() -> None:
    assert fingerprint_callable(("gpt", 0.0)) == fingerprint_callable(("gpt", 0.0))
    assert fingerprint_callable(("gpt", 0.0)) != fingerprint_callable(("gpt", -0.0))
