"""The public face: every documented name imports, and bad input meets only batchjson's errors.

docs/api.md is the contract; this holds the code to it. The bad inputs are tried through the
public API only, and each must raise the documented type from the one exception tree, before
any provider call.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import batchjson
from batchjson import (
    BatchJsonError,
    Budget,
    BudgetExceeded,
    CallableProvider,
    ConfigError,
    InvalidBatch,
    LedgerError,
    ProviderSetupError,
    RunSpec,
    Session,
)
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
DOCUMENTED = sorted(set(re.findall(r"`(batchjson(?:\.[A-Za-z][A-Za-z0-9_]*)+)`",
                                   API.read_text())))


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", DOCUMENTED)
def test_every_documented_name_imports(dotted: str) -> None:
    assert not any(part.startswith("_") for part in dotted.split(".")), "a private name"
    assert _resolve(dotted) is not None


def test_the_reference_and_all_list_the_same_top_level_names() -> None:
    top = {d.split(".")[1] for d in DOCUMENTED if d.count(".") == 1}
    assert top - {"rlm", "testing", "core"} == set(batchjson.__all__)  # public submodules


def test_every_name_the_faces_surface_lists_is_there() -> None:
    import batchjson.core

    assert all(hasattr(batchjson.core, name) for name in batchjson.core.__all__)
    public = {n for n in dir(batchjson.core) if not n.startswith("_")}
    assert public == set(batchjson.core.__all__)  # nothing reachable there goes unlisted


def test_every_public_error_is_in_the_one_tree() -> None:
    errors = [getattr(batchjson, n) for n in batchjson.__all__
              if isinstance(getattr(batchjson, n), type)
              and issubclass(getattr(batchjson, n), Exception)]
    assert len(errors) == 13
    assert all(issubclass(e, BatchJsonError) for e in errors)


def test_the_exception_tree_drawn_in_the_errors_docstring_is_the_real_one() -> None:
    """``_errors.py``'s docstring draws every class it defines under its real parent, with the
    builtin it also is: a new or moved exception must be drawn where it is."""
    from batchjson import _errors

    drawn: dict[str, tuple[str | None, str | None]] = {}
    parents: list[str] = []
    for line in (_errors.__doc__ or "").splitlines():
        match = re.match(r"( *)([A-Z]\w+)(?: \((\w+)\))?\s{2,}\S", line)
        if match:
            depth = len(match[1]) // 4
            parents[depth:] = [match[2]]
            drawn[match[2]] = (parents[depth - 1] if depth else None, match[3])
    defined = {n: c for n, c in vars(_errors).items()
               if isinstance(c, type) and issubclass(c, BatchJsonError)}
    real = {n: (next((b.__name__ for b in c.__bases__ if b in defined.values()), None),
                next((b.__name__ for b in c.__bases__
                      if b not in defined.values() and b is not Exception), None))
            for n, c in defined.items()}
    assert len(drawn) == 13 and drawn == real


@pytest.mark.parametrize("module", ["batchjson", "batchjson.rlm", "batchjson.testing"])
def test_public_classes_print_as_the_name_users_import(module: str) -> None:
    """``batchjson.Session``, not ``batchjson._session.session.Session``: a repr, a traceback
    and help() name where a user imports the class from, and that name resolves to it."""
    public = importlib.import_module(module)
    classes = [getattr(public, n) for n in public.__all__ if isinstance(getattr(public, n), type)]
    assert len(classes) >= {"batchjson": 20, "batchjson.rlm": 0, "batchjson.testing": 4}[module]
    for cls in classes:
        assert repr(cls) == f"<class '{module}.{cls.__qualname__}'>"
        assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
    assert repr(batchjson.Session) == "<class 'batchjson.Session'>"


def test_keys_name_public_classes_as_users_import_them_so_no_move_orphans_evidence() -> None:
    """The answer source of a built-in provider names it as users import it
    (``batchjson.SimulatedModel``), never the private module that defines it today: moving
    that module would otherwise change every request key and orphan every stored answer."""
    from batchjson._content.keys import answer_source

    source = answer_source(batchjson.SimulatedModel())
    assert source.startswith("batchjson.SimulatedModel:")
    assert "testing" not in source and "_providers" not in source


class Counting:
    """A provider that records whether anything was ever sent."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, call: Any) -> str:
        self.calls += 1
        return items_reply(call)


def _run(**overrides: Any) -> Any:
    def go(model: Counting) -> Any:
        session = Session(CallableProvider(model))
        args = {"name": "r", "tasks": review_tasks(2), "schema": LABEL_SCHEMA, **overrides}
        return session.run_batch(args.pop("name"), args.pop("tasks"), args.pop("schema"),
                                 **args)
    return go


def _session(**kwargs: Any) -> Any:
    return lambda model: Session(CallableProvider(model), **kwargs)


def _spec(**kwargs: Any) -> Any:
    def go(model: Counting) -> Any:
        return Session(CallableProvider(model)).run(RunSpec(
            **{"name": "r", "tasks": review_tasks(2), "schema": LABEL_SCHEMA, **kwargs}))
    return go


BAD_INPUTS = [
    ("empty batch name", _run(name=" "), InvalidBatch),
    ("tasks as a string", _run(tasks="abc"), InvalidBatch),
    ("no tasks", _run(tasks=[]), InvalidBatch),
    ("a task without task_id", _run(tasks=[{"prompt": "p"}]), InvalidBatch),
    ("duplicate task ids", _run(tasks=review_tasks(1) * 2), InvalidBatch),
    ("a task that is not JSON", _run(tasks=[{"task_id": "a", "prompt": "p", "x": object()}]),
     InvalidBatch),
    ("pack 0", _run(pack=0), InvalidBatch),
    ("pack 1.5", _run(pack=1.5), InvalidBatch),
    ("repairs -1", _run(repairs=-1), InvalidBatch),
    ("max_calls as text", _run(max_calls="10"), InvalidBatch),
    ("identity naming a missing field", _run(identity="task_id,nope"), InvalidBatch),
    ("identity with an empty name", _run(identity="task_id,,case_id"), InvalidBatch),
    ("a schema that is not a schema", _run(schema=42), InvalidBatch),
    ("an unsatisfiable schema", _run(schema={"not": {}}), InvalidBatch),
    ("a validator that is not callable", _run(validator=3), InvalidBatch),
    ("a validator taking no arguments", _run(validator=lambda: None), InvalidBatch),
    ("on_exhausted unknown", _run(on_exhausted="ignore"), InvalidBatch),
    ("a spec with an unknown mode", _spec(mode="stream"), InvalidBatch),
    ("concurrency 0", _session(concurrency=0), ConfigError),
    ("timeout 0", _session(timeout=0), ConfigError),
    ("timeout NaN", _session(timeout=float("nan")), ConfigError),
    ("budget calls 1.5", _session(budget={"calls": 1.5}), InvalidBatch),
    ("Budget(calls=-1)", lambda model: Budget(calls=-1), InvalidBatch),
    ("budget calls as text", _session(budget={"calls": "10"}), InvalidBatch),
    ("budget cost NaN", _session(budget={"cost": float("nan")}), InvalidBatch),
    ("budget with an unknown key", _session(budget={"dollars": 1}), InvalidBatch),
    ("an unknown provider name", lambda model: Session("no-such-provider").provider,
     ConfigError),
    ("a provider without async complete",
     lambda model: Session(object()).run_batch("r", review_tasks(1), LABEL_SCHEMA),
     ConfigError),
    ("a callable provider that is not callable", lambda model: CallableProvider(5),
     ProviderSetupError),
    ("a key pasted as the model", lambda model: CallableProvider(
        model, model="sk-proj-" + "a1B2" * 12), ProviderSetupError),
    ("a cost budget on an unpriced model",
     lambda model: Session(CallableProvider(model), budget={"cost": 1.0}).run_batch(
         "r", review_tasks(2), LABEL_SCHEMA), ConfigError),
    ("a budget too small for what is owed",
     lambda model: Session(CallableProvider(model), budget=1).run_batch(
         "r", review_tasks(3), LABEL_SCHEMA), BudgetExceeded),
]


@pytest.mark.parametrize("what, attempt, expected", BAD_INPUTS,
                         ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_raises_the_documented_batchjson_error_before_any_call(
        what: str, attempt: Any, expected: type[BatchJsonError]) -> None:
    model = Counting()
    with pytest.raises(expected) as raised:
        attempt(model)
    assert isinstance(raised.value, BatchJsonError)
    assert model.calls == 0, f"{what}: a call was paid before the refusal"


@pytest.mark.parametrize(("identity", "fixed"), [
    ("task_id case_id", "task_id,case_id"),
    ("case_id  gold\tset", "case_id,gold,set"),
    ("task_id, case_id gold", "task_id,case_id,gold"),
])
def test_identity_written_with_spaces_says_fields_are_separated_by_commas(
        identity: str, fixed: str) -> None:
    model = Counting()
    session = Session(CallableProvider(model))
    with pytest.raises(InvalidBatch) as raised:
        session.run_batch("r", review_tasks(2), LABEL_SCHEMA, identity=identity)
    assert str(raised.value) == (
        f"identity {identity!r}: the fields are separated by commas, not spaces (a field whose "
        f"name holds a space goes in a list: identity=[...]); write identity={fixed!r}")
    assert model.calls == 0 and session.ledger.spend()["calls"] == 0


def test_identity_listed_as_one_spaced_name_shows_the_list_to_write() -> None:
    """identity=["task_id case_id"]: no task has that field, but each has both words."""
    model = Counting()
    session = Session(CallableProvider(model))
    tasks = [{**t, "case_id": f"c{i}"} for i, t in enumerate(review_tasks(2))]
    with pytest.raises(InvalidBatch) as raised:
        session.run_batch("r", tasks, LABEL_SCHEMA, identity=["task_id case_id"])
    assert "list each field on its own, e.g. identity=['task_id', 'case_id']" in str(raised.value)
    assert model.calls == 0 and session.ledger.spend()["calls"] == 0


def test_a_ledger_path_that_is_a_directory_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=str(tmp_path)):
        Session(CallableProvider(items_reply), ledger=tmp_path)


def test_a_file_that_is_not_a_ledger_is_a_ledger_error_and_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_bytes(b"these are my notes, not a database" * 200)
    before = path.read_bytes()
    with pytest.raises(LedgerError):
        Session(CallableProvider(items_reply), ledger=path)
    assert path.read_bytes() == before


def test_reading_a_closed_ledger_is_a_ledger_error_naming_it(tmp_path: Path) -> None:
    session = Session(CallableProvider(items_reply), ledger=tmp_path / "l.sqlite")
    session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    session.close()
    with pytest.raises(LedgerError, match="l.sqlite"):
        session.ledger.checkpoint("r")
    with pytest.raises(LedgerError):
        session.evidence.summary()


def test_options_that_take_a_fixed_set_of_strings_are_typed_as_literals():
    """A type checker or an editor tells a user the allowed values before anything runs; the
    run's own check refuses exactly the same values."""
    import typing

    from batchjson import BatchResult, RunSpec, Session
    from batchjson._session import spec

    hints = typing.get_type_hints(RunSpec)
    for option, allowed in (("mode", spec.Mode), ("validator_args", spec.ValidatorArgs),
                            ("on_exhausted", spec.OnExhausted)):
        assert typing.get_origin(hints[option]) is typing.Literal
        assert typing.get_args(hints[option]) == typing.get_args(allowed)
        with pytest.raises(InvalidBatch, match=f"{option} must be .*, got 'nope'"):
            RunSpec("r", [], {}, **{option: "nope"})
    assert typing.get_args(typing.get_type_hints(Session.run_batch)["on_exhausted"]) == (
        "raise", "return")
    assert typing.get_args(typing.get_type_hints(BatchResult)["status"]) == (
        "resolved", "unresolved", "pending")
    assert typing.get_args(hints["transport"]) == ("live", "batch")


def test_provider_options_that_take_a_fixed_set_of_strings_are_literals_the_check_enforces():
    """The provider's own refusal names exactly the values its type admits."""
    import typing

    from batchjson import AnthropicProvider, Call, OpenAIProvider, ProviderSetupError
    from batchjson._providers.base import CallKind

    cases = ((OpenAIProvider, "response_format", ("auto", "json_schema", "json_object", "text")),
             (AnthropicProvider, "mode", ("tool", "text")))
    for provider, option, allowed in cases:
        hint = typing.get_type_hints(provider.__init__)[option]
        assert typing.get_args(hint) == allowed
        with pytest.raises(ProviderSetupError) as refused:
            provider(model="m", base_url="http://127.0.0.1:9", api_key="k", **{option: "jsn"})
        assert all(value in str(refused.value) for value in allowed)
    call_hints = typing.get_type_hints(Call)
    assert typing.get_args(call_hints["kind"]) == typing.get_args(CallKind) == (
        "initial", "repair", "replay")
    assert typing.get_args(call_hints["mode"]) == ("items", "value")
