"""The seed's ratchet: an inline validator in a re-executed cell must not orphan evidence."""

from __future__ import annotations

from batchjson import FaultPlan, Session, SimulatedModel

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
