"""The seed's ratchet: an inline validator in a re-executed cell must not orphan evidence."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from batchjson import FaultPlan, Session, SimulatedModel
from batchjson._fingerprint.fingerprint import fingerprint_function
from batchjson.rlm import bind

CELL = '''
def validate_labels(value, index):
    if value["label"] not in ("pos", "neg"):
        raise ValueError(f"label must be pos or neg, got {value['label']!r}")

result = llm_batch_json(prompts, schema, max_repair_attempts=1, validator=validate_labels)
history.append((validate_labels, batch_session.evidence.unresolved_batches))
if result["errors"]:
    raise RuntimeError(f"{len(result['errors'])} prompt(s) still failing")
'''

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}


def test_reexecuted_inline_validator_resumes_the_same_request():
    # Four failing attempts per request before the model behaves: the cell fails on runs 1-2.
    model = SimulatedModel(answer=lambda task: {"label": "pos"},
                           faults=FaultPlan(malformed_json=1.0, clean_after=4), seed=3)
    session = Session(model, replays=0, strict=True)
    namespace = {
        "llm_batch_json": session.llm_batch_json, "batch_session": session,
        "prompts": ["Label: great film", "Label: dull film"], "schema": SCHEMA, "history": [],
    }
    outcomes = []
    for _ in range(7):  # the RLM loop re-runs the cell after every error
        try:
            exec(compile(CELL, "<cell>", "exec"), namespace)
            outcomes.append("ok")
        except RuntimeError:
            outcomes.append("error")
        assert session.evidence.unresolved_batches <= 1
        assert session.evidence.minimum_exact_retry_calls <= 2
    assert outcomes[:2] == ["error", "error"] and outcomes[2:] == ["ok"] * 5
    assert len({id(fn) for fn, _ in namespace["history"]}) == 7  # seven distinct objects...
    assert [owed for _, owed in namespace["history"]] == [1, 1, 0, 0, 0, 0, 0]
    assert session.evidence.unresolved_batches == 0
    assert session.evidence.minimum_exact_retry_calls == 0
    calls_after_success = model.calls
    exec(compile(CELL, "<cell>", "exec"), namespace)
    assert model.calls == calls_after_success  # ...and a resolved request is never re-spent


def test_changed_validator_logic_is_a_different_request_in_strict_mode():
    model = SimulatedModel(answer=lambda task: {"label": "pos"})
    session = Session(model, strict=True)
    prompts = ["Label: great film"]

    def accept_all(value, index):
        return None

    def reject_all(value, index):
        raise ValueError("no")

    session.llm_batch_json(prompts, SCHEMA, validator=reject_all, max_repair_attempts=0)
    assert session.evidence.unresolved_batches == 1
    session.llm_batch_json(prompts, SCHEMA, validator=accept_all)
    # strict: a different validator cannot clear evidence recorded under the old one
    assert session.evidence.unresolved_batches == 1
    loose = Session(model)
    loose.llm_batch_json(prompts, SCHEMA, validator=reject_all, max_repair_attempts=0)
    loose.llm_batch_json(prompts, SCHEMA, validator=accept_all)
    assert loose.evidence.unresolved_batches == 0
    # the loose session moved on: revision 1 (reject_all) is superseded by revision 2
    [entry] = loose.evidence.superseded
    assert entry["batch"].startswith("llm_batch_json/")
    assert (entry["revision"], entry["superseded_by"]) == (1, 2)
    assert "validator" in entry["reason"]
    assert loose.evidence.summary()["superseded"] == [entry]


def test_adding_a_prompt_pays_only_for_the_new_prompt():
    model = SimulatedModel(answer=lambda task: {"label": "pos"})
    session = Session(model)
    prompts = ["Label: great film", "Label: dull film"]
    session.llm_batch_json(prompts, SCHEMA)
    assert model.calls == 2
    out = session.llm_batch_json(prompts + ["Label: fine film"], SCHEMA)  # the cell grew
    assert model.calls == 3 and out["errors"] == []
    assert out["attempts"] == [0, 0, 1]


def test_a_request_resolved_under_another_batch_name_clears_its_evidence():
    model = SimulatedModel(answer=lambda task: {"label": "pos"},
                           faults=FaultPlan(malformed_json=1.0, clean_after=2))
    session = Session(model, replays=0, strict=True)
    prompts = ["Label: great film"]
    session.llm_batch_json(prompts, SCHEMA, max_repair_attempts=0)
    assert session.evidence.minimum_exact_retry_calls == 1
    # the RLM cell now names its batch, same content: the old evidence is the same request
    session.llm_batch_json(prompts, SCHEMA, max_repair_attempts=1, name="labels")
    assert session.evidence.unresolved_batches == 0
    assert session.evidence.minimum_exact_retry_calls == 0


IMPORTING_CELL = '''
def validate_labels(value, index):
    import colorsys  # a module the validator only needs while judging
    import label_vocabulary
    colorsys.rgb_to_hsv(0.2, 0.4, 0.6)
    if value["label"] not in label_vocabulary.LABELS:
        raise ValueError(f"label must be one of {label_vocabulary.LABELS}")

result = llm_batch_json(prompts, schema, max_repair_attempts=1, validator=validate_labels)
if result["errors"]:
    raise RuntimeError(f"{len(result['errors'])} prompt(s) still failing")
'''


@pytest.fixture
def unimported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stdlib module and a user's module, neither imported yet when the cell first runs."""
    (tmp_path / "label_vocabulary.py").write_text('LABELS = ("pos", "neg")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("colorsys", "label_vocabulary"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path


def run_until_resolved(namespace: dict[str, Any], owed: Any) -> list[str]:
    outcomes = []
    for _ in range(5):  # the RLM loop re-runs the cell after every error
        try:
            exec(compile(IMPORTING_CELL, "<cell>", "exec"), namespace)
            outcomes.append("ok")
            break
        except RuntimeError:
            outcomes.append("error")
        assert owed() <= 2
    return outcomes


def test_a_validator_importing_inside_its_body_resumes_under_a_strict_session(unimported):
    """The module is imported by the first run; the re-run's fingerprint must not differ for
    that (a strict session would refuse it as changed, forever)."""
    model = SimulatedModel(answer=lambda task: {"label": "pos"},
                           faults=FaultPlan(malformed_json=1.0, clean_after=4), seed=3)
    session = Session(model, replays=0, strict=True)
    namespace = {"llm_batch_json": session.llm_batch_json, "prompts": ["great", "dull"],
                 "schema": SCHEMA}
    outcomes = run_until_resolved(
        namespace, lambda: session.evidence.minimum_exact_retry_calls)
    assert outcomes == ["error", "error", "ok"]
    assert session.evidence.minimum_exact_retry_calls == 0
    (version,) = session.validators.versions("validate_labels")
    assert {"import:colorsys.rgb_to_hsv", "import:label_vocabulary.LABELS"} <= {
        name for name, _ in version.fingerprint.parts}


def test_a_validator_importing_inside_its_body_resumes_under_rlm_bind(unimported, tmp_path):
    answers = iter([json.dumps({"label": "maybe"})] * 8)  # 3 attempts a prompt a run

    def subcalls(prompts: list[str]) -> list[str]:
        return [next(answers, json.dumps({"label": "pos"})) for _ in prompts]

    namespace: dict[str, Any] = {"prompts": ["great", "dull"], "schema": SCHEMA}
    session = bind(namespace, subcalls, ledger=tmp_path / "l.sqlite")
    outcomes = run_until_resolved(namespace, lambda: len(namespace["finalization_check"]()))
    assert outcomes == ["error", "ok"]
    assert namespace["finalization_check"]() == []
    session.close()


def test_an_imported_user_module_counts_by_its_content(unimported):
    """As a module global does: what the validator reads of it, not its name."""
    namespace: dict[str, Any] = {}
    exec(compile(IMPORTING_CELL.split("\nresult")[0], "<cell>", "exec"), namespace)
    before = fingerprint_function(namespace["validate_labels"])
    import label_vocabulary

    assert fingerprint_function(namespace["validate_labels"]) == before  # imported now: same
    label_vocabulary.LABELS = ("pos",)
    assert fingerprint_function(namespace["validate_labels"]) != before


def test_a_relative_import_inside_a_validator_reads_its_own_package(tmp_path, monkeypatch):
    """``from .vocab import LABELS`` is the package's vocab, not a top-level ``vocab``."""
    package = tmp_path / "reviewpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "vocab.py").write_text('LABELS = ("pos", "neg")\n')
    (package / "checks.py").write_text(
        "def check(value, index):\n    from .vocab import LABELS\n"
        "    if value['label'] not in LABELS:\n        raise ValueError('no')\n")
    (tmp_path / "vocab.py").write_text('LABELS = ("other",)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("reviewpkg", "reviewpkg.vocab", "reviewpkg.checks", "vocab"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    from reviewpkg.checks import check

    before = fingerprint_function(check)
    assert "vocab" not in sys.modules
    import reviewpkg.vocab

    assert fingerprint_function(check) == before
    reviewpkg.vocab.LABELS = ("pos",)
    assert fingerprint_function(check) != before
