"""The IPython face, in process: a real InteractiveShell running the magics as a user would."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("IPython")

from IPython.core.error import UsageError  # noqa: E402

import batchjson  # noqa: E402
from batchjson import BatchUnresolved, Session, default_session  # noqa: E402
from batchjson._ipython.display import StatusView, Table  # noqa: E402
from batchjson._ipython.magics import (  # noqa: E402
    ATTRIBUTE,
    INJECTED,
    BatchJson,
    allow_empty_body,
)
from tests.helpers import cell_ok  # noqa: E402

MODEL = """
import json
from batchjson import CallableProvider, FaultPlan, SimulatedModel
model = SimulatedModel(answer=lambda task: {"verdict": "match"})
"""

BODY = """
tasks = [{"task_id": f"t{i}", "prompt": f"question {i}"} for i in range(4)]
schema = {"type": "object", "properties": {"verdict": {"type": "string"}},
          "required": ["verdict"]}
def check(item, task):
    if item["verdict"] not in ("match", "no_match"):
        raise ValueError("verdict must be match or no_match")
"""


def run(ip: Any, source: str) -> Any:
    return ip.run_cell(source)


ok = cell_ok  # a cell that must succeed


def usage_error(ip: Any, source: str, capsys: Any) -> str:
    """Run a cell that must fail with a one-line UsageError; return that line."""
    capsys.readouterr()
    result = ip.run_cell(source)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("UsageError: "), err
    assert "Traceback" not in err[0]
    return err[0]


def refused(ip: Any, source: str, caplog: Any) -> str:
    """Run a ``%config`` cell whose setting must be refused IPython's way: the cell runs on and
    IPython logs one error (a line on stderr in a notebook); return that error."""
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        ok(ip, source)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    return errors[0]


def calls_recorded(ip: Any) -> int:
    return ip.user_ns["batch_session"].ledger.spend()["calls"]


@pytest.fixture
def loaded(ip: Any) -> Any:
    """Extension loaded, simulated provider configured from a namespace object."""
    ok(ip, "%load_ext batchjson")
    ok(ip, MODEL)
    ok(ip, "%config BatchJson.provider = model")
    return ip


def state(ip: Any) -> Any:
    return getattr(ip, ATTRIBUTE)


# -- loading ---------------------------------------------------------------------------------
def test_load_registers_magics_names_and_default_session(ip: Any, tmp_path: Path) -> None:
    ok(ip, "%load_ext batchjson")
    assert ip.find_cell_magic("batch_json") is not None
    for name in ("batch_status", "validators", "batch_receipts"):
        assert ip.find_line_magic(name) is not None
    for name in INJECTED:
        assert name in ip.user_ns
    session = ip.user_ns["batch_session"]
    assert isinstance(session, Session)
    assert default_session() is session
    assert session.ledger.path == tmp_path / ".batchjson" / "ledger.sqlite"
    assert ip.user_ns["validator"] == session.validators.define
    assert ip.user_ns["run_batch"] == session.run_batch
    assert any(isinstance(c, BatchJson) for c in ip.configurables)


def test_double_load_is_harmless(ip: Any) -> None:
    ok(ip, "%load_ext batchjson")
    session = ip.user_ns["batch_session"]
    ok(ip, "%load_ext batchjson")
    batchjson.load_ipython_extension(ip)
    assert ip.user_ns["batch_session"] is session
    assert sum(isinstance(c, BatchJson) for c in ip.configurables) == 1
    assert ip.events.callbacks["pre_run_cell"].count(state(ip).pre_run_cell) == 1
    assert ip.input_transformers_cleanup.count(allow_empty_body) == 1


def test_unload_removes_what_load_added(ip: Any) -> None:
    before = batchjson._session.session._default
    ok(ip, "%load_ext batchjson")
    session = ip.user_ns["batch_session"]
    ok(ip, "validator = 'mine now'")
    ok(ip, "%unload_ext batchjson")
    assert ip.find_cell_magic("batch_json") is None
    assert ip.find_line_magic("batch_status") is None
    assert ip.find_line_magic("validators") is None
    assert ip.find_line_magic("batch_receipts") is None
    assert "BatchJson" not in ip.magics_manager.registry
    assert not any(isinstance(c, BatchJson) for c in ip.configurables)
    assert state(ip).pre_run_cell not in ip.events.callbacks["pre_run_cell"]
    assert allow_empty_body not in ip.input_transformers_cleanup
    for name in ("run_batch", "llm_batch_json", "batch_session"):
        assert name not in ip.user_ns
    assert ip.user_ns["validator"] == "mine now"  # the user's own binding is kept
    assert batchjson._session.session._default is before
    ok(ip, "%load_ext batchjson")  # loading again reattaches the same session
    assert ip.user_ns["batch_session"] is session


def test_reset_reinjects_names_and_keeps_session_and_validators(loaded: Any) -> None:
    ip = loaded
    session = ip.user_ns["batch_session"]
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    first = ok(ip, "id(check)")
    ok(ip, "%reset -f")
    assert ok(ip, "batch_session") is session
    assert set(INJECTED) <= set(ip.user_ns)
    ok(ip, MODEL)
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    assert ok(ip, "id(check)") == first
    assert ok(ip, "labels.calls") == 0  # resumed from the ledger


def test_reset_never_overwrites_a_users_name(loaded: Any) -> None:
    ok(loaded, "run_batch = 'user value'")
    ok(loaded, "pass")
    assert loaded.user_ns["run_batch"] == "user value"


def test_reload_ext_keeps_session_config_and_validator_identity(loaded: Any) -> None:
    ip = loaded
    session = ip.user_ns["batch_session"]
    ok(ip, "%config BatchJson.repairs = 3")
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    first = ok(ip, "id(check)")
    ok(ip, "%reload_ext batchjson")
    assert ip.user_ns["batch_session"] is session
    assert default_session() is session
    magics = ip.magics_manager.registry["BatchJson"]
    assert magics.repairs == 3 and session.repairs == 3
    assert magics.provider is ip.user_ns["model"]
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    assert ok(ip, "id(check)") == first
    assert sum(isinstance(c, BatchJson) for c in ip.configurables) == 1
    assert len(ip.events.callbacks["pre_run_cell"]) == len(set(
        map(id, ip.events.callbacks["pre_run_cell"])))


# -- configuration ---------------------------------------------------------------------------
def test_config_provider_by_name(ip: Any) -> None:
    ok(ip, "%load_ext batchjson")
    ok(ip, "%config BatchJson.provider = 'Simulated'")
    assert ip.magics_manager.registry["BatchJson"].provider == "simulated"
    assert isinstance(ok(ip, "batch_session.provider"), batchjson.SimulatedModel)


def test_config_provider_object_from_namespace(loaded: Any) -> None:
    assert ok(loaded, "batch_session.provider is model") is True


def test_config_refuses_bad_provider(loaded: Any, caplog: Any) -> None:
    lines = [refused(loaded, f"%config BatchJson.provider = {bad}", caplog)
             for bad in ("'nope'", "42", "print")]
    assert lines[0].startswith("BatchJson.provider: unknown provider name 'nope';")
    assert "openai, anthropic, simulated" in lines[0]
    assert all("CallableProvider(fn)" in line for line in lines[1:])
    assert ok(loaded, "batch_session.provider is model") is True
    assert ok(loaded, "%config BatchJson.provider") is loaded.user_ns["model"]


OWN_PROVIDERS = """
class MyProvider:
    name = "mine"
    def __init__(self):
        import threading
        self.lock = threading.Lock()  # cannot be deep-copied, as a client's pool cannot
    async def complete(self, call):
        raise RuntimeError("not called here")
    def __deepcopy__(self, memo):
        raise TypeError("a MyProvider is one client")
mine = MyProvider()
class Plain:
    name = "plain"
    async def complete(self, call):
        raise RuntimeError("not called here")
plain = Plain()
"""


def test_a_provider_object_of_ones_own_is_held_by_a_handle_and_stays_itself(
        loaded: Any, capsys: Any, caplog: Any) -> None:
    """traitlets sets a deep copy of each config value, again at every %config line:
    batchjson's providers come back as themselves, another object is refused (a copy would be
    another provider) until held by a handle, and later lines never swap it for a copy."""
    ok(loaded, OWN_PROVIDERS)
    said = refused(loaded, "%config BatchJson.provider = plain", caplog)
    assert "a copy of a Plain would be another provider" in said
    assert "batchjson.ProviderHandle(obj)" in said
    assert refused(loaded, "%config BatchJson.provider = mine", caplog) == (
        "a MyProvider is one client")  # the copy itself failed, before batchjson saw it
    assert ok(loaded, "batch_session.provider is model") is True
    line = usage_error(loaded, "%reload_ext batchjson", capsys)  # IPython kept it: named
    assert "c.BatchJson.provider = <__main__.MyProvider object" in line
    assert "which is refused (TypeError: a MyProvider is one client)" in line
    ok(loaded, "from batchjson import ProviderHandle")
    caplog.clear()
    for name in ("mine", "plain"):
        ok(loaded, f"%config BatchJson.provider = ProviderHandle({name})")
        if name == "mine":
            ok(loaded, "%load_ext batchjson")
        ok(loaded, "%config BatchJson.repairs = 2")  # another line: nothing is copied again
        assert ok(loaded, f"batch_session.provider is {name}") is True
        assert ok(loaded, "%config BatchJson.provider") is loaded.user_ns[name]
    ok(loaded, "%config BatchJson.provider = model")
    ok(loaded, "%config BatchJson.concurrency = 3")
    assert ok(loaded, "batch_session.provider is model") is True
    assert loaded.config.BatchJson.provider is loaded.user_ns["model"]  # as IPython keeps it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no copy was tried


def test_ipython_config_style(ip: Any, tmp_path: Path) -> None:
    ip.config.BatchJson.provider = "simulated"
    ip.config.BatchJson.ledger = str(tmp_path / "configured.sqlite")
    ip.config.BatchJson.concurrency = 3
    ip.config.BatchJson.repairs = 2
    ip.config.BatchJson.replays = 0
    ip.config.BatchJson.strict = True
    ip.config.BatchJson.model = "sim-x"
    ok(ip, "%load_ext batchjson")
    session = ip.user_ns["batch_session"]
    assert session.ledger.path == tmp_path / "configured.sqlite"
    assert (session.concurrency, session.repairs, session.replays) == (3, 2, 0)
    assert session.strict and session.validators.strict
    assert session.provider.model == "sim-x"


def test_load_with_a_ledger_that_cannot_open_leaves_nothing(ip: Any, tmp_path: Path) -> None:
    (tmp_path / "a_directory").mkdir()
    ip.config.BatchJson.ledger = "a_directory"
    r = run(ip, "%load_ext batchjson")
    assert r.error_in_exec is not None
    assert not any(isinstance(c, BatchJson) for c in ip.configurables)
    assert ip.find_cell_magic("batch_json") is None and "batch_session" not in ip.user_ns
    ip.config.BatchJson.ledger = "fine.sqlite"
    ok(ip, "%load_ext batchjson")
    assert ip.user_ns["batch_session"].ledger.path == tmp_path / "fine.sqlite"


def test_config_ledger_opens_new_session(loaded: Any, tmp_path: Path) -> None:
    ip = loaded
    old = ip.user_ns["batch_session"]
    ok(ip, "%config BatchJson.ledger = 'runs/other.sqlite'")
    new = ip.user_ns["batch_session"]
    assert new is not old and default_session() is new
    assert new.ledger.path == tmp_path / "runs" / "other.sqlite"
    assert ip.user_ns["validator"] == new.validators.define
    assert new.provider is ip.user_ns["model"]
    ok(ip, "%config BatchJson.ledger = ':memory:'")
    assert ip.user_ns["batch_session"].ledger.path is None


def test_config_strict_opens_new_session_on_same_ledger(loaded: Any) -> None:
    ip = loaded
    old = ip.user_ns["batch_session"]
    ok(ip, "%config BatchJson.strict = True")
    new = ip.user_ns["batch_session"]
    assert new is not old and new.strict and new.validators.strict
    assert new.ledger.path == old.ledger.path


def test_config_ledger_that_cannot_open_changes_nothing(loaded: Any, tmp_path: Path,
                                                        caplog: Any) -> None:
    ip = loaded
    session = ip.user_ns["batch_session"]
    (tmp_path / "a_directory").mkdir()
    line = refused(ip, "%config BatchJson.ledger = 'a_directory'", caplog)
    assert line.startswith("BatchJson.ledger = 'a_directory' was not applied: LedgerError")
    assert ip.magics_manager.registry["BatchJson"].ledger == ".batchjson/ledger.sqlite"
    assert ip.user_ns["batch_session"] is session and default_session() is session
    ok(ip, "%%batch_json labels\n" + BODY)  # the session still works


def test_config_provider_reads_back_the_object(loaded: Any) -> None:
    assert ok(loaded, "%config BatchJson.provider") is loaded.user_ns["model"]


def test_config_updates_live_session(loaded: Any) -> None:
    ip = loaded
    session = ip.user_ns["batch_session"]
    ok(ip, "%config BatchJson.concurrency = 4")
    ok(ip, "%config BatchJson.repairs = 0")
    ok(ip, "%config BatchJson.replays = 2")
    assert (session.concurrency, session.repairs, session.replays) == (4, 0, 2)
    ok(ip, "%config BatchJson.provider = 'simulated'")
    ok(ip, "%config BatchJson.model = 'sim-2'")
    assert session.model == "sim-2" and session.provider.model == "sim-2"
    assert ip.user_ns["batch_session"] is session


def test_rate_limits_set_by_config_pace_the_live_session(loaded: Any) -> None:
    from batchjson import RateLimits

    session = loaded.user_ns["batch_session"]
    ok(loaded, "%config BatchJson.rate_limits = {'rpm': 600, 'tpm': 90_000}")
    assert session.rate_limits == RateLimits(600, 90_000)
    assert session.pacer.requests_per_minute == 600
    ok(loaded, "%config BatchJson.rate_limits = None")
    assert session.rate_limits == RateLimits()


def test_max_rate_wait_set_by_config_bounds_the_live_sessions_runs(loaded: Any,
                                                                  caplog: Any) -> None:
    """A notebook bounds how long a run waits on a refusing rate limit as Session() does:
    the live session's next run reads it; a value that is no finite number of seconds > 0 is
    refused with the fix, the setting left as it was."""
    session = loaded.user_ns["batch_session"]
    assert session.transport.max_rate_wait == 60.0
    ok(loaded, "%config BatchJson.max_rate_wait = 5")
    assert session.transport.max_rate_wait == 5.0
    for bad in ("0", "float('inf')", "-3"):
        line = refused(loaded, f"%config BatchJson.max_rate_wait = {bad}", caplog)
        assert "finite number of seconds > 0" in line and "max_rate_wait = 120" in line
    assert session.transport.max_rate_wait == 5.0


@pytest.mark.parametrize(("line", "said"), [
    ("concurrency = 0", "'concurrency' trait of a BatchJson instance should not be less than 1"),
    ("concurrency = 'four'", "'concurrency' trait of a BatchJson instance expected an int"),
    ("max_calls = -1", "'max_calls' trait of a BatchJson instance should not be less than 0"),
    ("repairs = True", "'repairs' trait of a BatchJson instance expected an int, not the bool"),
    ("max_calls = 2.5", "'max_calls' trait of a BatchJson instance expected an int"),
    ("strict = 'yes'", "'strict' trait of a BatchJson instance expected a boolean"),
    ("ledger = 3", "'ledger' trait of a BatchJson instance expected a unicode string"),
])
def test_a_bad_config_value_is_refused_naming_the_setting_and_the_old_value_stays(
        loaded: Any, caplog: Any, line: str, said: str) -> None:
    session = loaded.user_ns["batch_session"]
    name = line.split()[0]
    before = getattr(loaded.magics_manager.registry["BatchJson"], name)
    assert said in refused(loaded, f"%config BatchJson.{line}", caplog)
    assert getattr(loaded.magics_manager.registry["BatchJson"], name) == before
    assert loaded.user_ns["batch_session"] is session
    assert (session.concurrency, session.repairs, session.strict) == (16, 1, False)
    ok(loaded, "%config BatchJson.concurrency = 3")  # %config itself still works
    assert loaded.user_ns["batch_session"].concurrency == 3


def test_a_refused_value_left_in_ipythons_config_is_named_when_batchjson_loads_again(
        loaded: Any, capsys: Any, caplog: Any) -> None:
    """IPython keeps what %config was given in its own configuration, refused or not: a later
    load names it and the fix, and loads nothing until it is gone; the session is kept."""
    session = loaded.user_ns["batch_session"]
    refused(loaded, "%config BatchJson.concurrency = 0", caplog)
    line = usage_error(loaded, "%reload_ext batchjson", capsys)
    assert "sets c.BatchJson.concurrency = 0, which is refused" in line
    assert "get_ipython().config.BatchJson.pop('concurrency')" in line
    assert loaded.find_cell_magic("batch_json") is None
    ok(loaded, "get_ipython().config.BatchJson.pop('concurrency')")
    ok(loaded, "%load_ext batchjson")
    assert loaded.user_ns["batch_session"] is session and session.concurrency == 16
    assert ok(loaded, "batch_session.provider is model") is True


@pytest.mark.parametrize(("name", "value"), [("concurrency", 0), ("strict", "yes"),
                                             ("provider", 5), ("rate_limits", {"rpm": 0})])
def test_a_bad_value_in_the_ipython_config_fails_the_load_naming_it_and_the_fix(
        ip: Any, capsys: Any, name: str, value: Any) -> None:
    from batchjson._ipython.magics import BatchJson

    ip.config.BatchJson.concurrency = 4  # a good setting beside the bad one
    ip.config.BatchJson[name] = value  # as ipython_config.py would set it
    line = usage_error(ip, "%load_ext batchjson", capsys)
    assert line.startswith("UsageError: batchjson was not loaded: the IPython configuration "
                           f"sets c.BatchJson.{name} = {value!r}, which is refused"), line
    assert f"get_ipython().config.BatchJson.pop({name!r})" in line
    assert ip.find_cell_magic("batch_json") is None  # nothing half-loaded
    assert not any(isinstance(c, BatchJson) for c in ip.configurables)
    ip.config.BatchJson.pop(name)
    ok(ip, "%load_ext batchjson")
    assert ip.find_cell_magic("batch_json") is not None


def test_config_lists_batchjson_only_while_it_is_loaded(loaded: Any, capsys: Any,
                                                        caplog: Any) -> None:
    capsys.readouterr()
    ok(loaded, "%config")
    assert "    BatchJson\n" in capsys.readouterr().out
    ok(loaded, "%unload_ext batchjson")
    ok(loaded, "%config")
    listed = capsys.readouterr().out
    assert "Available objects for config" in listed and "BatchJson" not in listed
    caplog.clear()
    ok(loaded, "%config BatchJson.concurrency = 0")  # nothing of ours is left to refuse it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_config_max_calls_is_the_default_ceiling(loaded: Any, capsys: Any) -> None:
    ok(loaded, "%config BatchJson.max_calls = 2")
    line = usage_error(loaded, "%%batch_json labels\n" + BODY, capsys)
    assert "budget refused" in line and "nothing was spent" in line
    assert calls_recorded(loaded) == 0
    ok(loaded, "%%batch_json labels --max-calls 4\n" + BODY)
    assert ok(loaded, "labels.status") == "resolved"


def test_api_keys_are_never_shown(ip: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    secret = "sk-test-do-not-show-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    ok(ip, "%load_ext batchjson")
    ok(ip, "%config BatchJson.provider = 'openai'")
    shown = [repr(ok(ip, "%batch_status")), ok(ip, "%batch_status")._repr_html_(),
             repr(ok(ip, "batch_session"))]
    run(ip, "%config BatchJson")
    shown.append(capsys.readouterr().out)
    assert all(secret not in text for text in shown)


# -- %%batch_json ----------------------------------------------------------------------------
def test_batch_json_defaults_bind_and_display(loaded: Any, capsys: Any) -> None:
    run(loaded, "%%batch_json labels\n" + BODY)
    out = capsys.readouterr().out
    result = loaded.user_ns["labels"]
    assert isinstance(result, batchjson.BatchResult)
    assert result.status == "resolved" and result.calls == 4
    assert result.values["t0"] == {"verdict": "match"}
    assert "<BatchResult 'labels' rev 1: resolved" in out


def test_batch_json_displays_html_in_jupyter(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    published: list[dict] = []
    monkeypatch.setattr(loaded.display_formatter, "active_types", ["text/plain", "text/html"])
    monkeypatch.setattr(loaded.display_pub, "publish",
                        lambda data, *a, **k: published.append(data))
    ok(loaded, "%%batch_json labels\n" + BODY)
    assert any("text/html" in d and "labels" in d["text/html"] for d in published)


def test_options_tasks_schema_validator_out(loaded: Any) -> None:
    ip = loaded
    ok(ip, BODY.replace("tasks =", "my_tasks =").replace("schema =", "my_schema ="))
    ok(ip, "def picky(item, task):\n    if task['task_id'] == 't1':\n"
           "        raise ValueError('t1 is never right')")
    r = run(ip, "%%batch_json labels --tasks my_tasks[:3] --schema my_schema "
                "--validator picky --out res --repairs 0 --replays 0\n")
    assert isinstance(r.error_in_exec, BatchUnresolved)
    res = ip.user_ns["res"]
    assert "labels" not in ip.user_ns
    assert res.total_tasks == 3 and set(res.values) == {"t0", "t2"}
    assert res.unresolved == ["t1"]
    table = ok(ip, "%validators")
    assert any(row[0] == "picky" and "labels" in row[4] for row in table.rows)


def test_option_pack(loaded: Any) -> None:
    ok(loaded, "%%batch_json labels --pack 3\n" + BODY)
    assert ok(loaded, "labels.calls") == 2


def test_option_identity(loaded: Any) -> None:
    ip = loaded
    ok(ip, "def swap(call):\n"
           "    items = [{'task_id': t['task_id'], 'case_id': t['case_id'], 'verdict': 'match'}"
           " for t in call.tasks]\n"
           "    items[0]['case_id'] = items[-1]['case_id']\n"
           "    return json.dumps({'items': items})\n"
           "model = CallableProvider(swap)")
    ok(ip, "%config BatchJson.provider = model")
    body = ("tasks = [{'task_id': f't{i}', 'case_id': f'c{i}', 'prompt': 'p'} for i in "
            "range(2)]\nschema = {'type': 'object'}\n")
    # without --identity every echoed task field is compared: the swapped case_id is refused
    r = run(ip, "%%batch_json echoed --pack 2 --repairs 0 --replays 0\n" + body)
    assert isinstance(r.error_in_exec, BatchUnresolved)
    assert ip.user_ns["echoed"].errors[0]["field"] == "case_id"
    # an explicit identity lists exactly what is compared: here case_id is an answer field
    ok(ip, "%%batch_json loose --pack 2 --identity task_id --repairs 0 --replays 0\n" + body)
    assert ok(ip, "loose.values['t0']['case_id']") == "c1"
    r = run(ip, "%%batch_json checked --pack 2 --identity task_id,case_id --repairs 0 "
                "--replays 0\n" + body)
    assert isinstance(r.error_in_exec, BatchUnresolved)
    errors = ip.user_ns["checked"].errors
    assert errors[0]["type"] == "identity" and "case_id is 'c1'" in errors[0]["message"]


def test_options_repairs_and_replays(loaded: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(malformed_json=1.0)")
    r = run(ip, "%%batch_json labels --repairs 2 --replays 1 --tasks tasks[:1]\n" + BODY)
    assert isinstance(r.error_in_exec, BatchUnresolved)
    kinds = [a.kind for a in ip.user_ns["batch_session"].ledger.attempts("labels")]
    assert kinds == ["initial", "repair", "repair", "replay"]


def test_a_run_that_threw_away_valid_pack_mates_suggests_the_magics_options(
        loaded: Any, capsys: Any) -> None:
    strict = BODY + "\ndef first_only(item, task):\n    if task['task_id'] != 't0':\n" + (
        "        raise ValueError('too vague')\n")
    capsys.readouterr()
    run(loaded, "%%batch_json strict --pack 4 --validator first_only\n" + strict)
    [said] = [ln for ln in capsys.readouterr().out.splitlines() if "threw away" in ln]
    assert said.startswith("batchjson: this run threw away 3 valid answer(s) with a rejected "
                           "pack-mate: --accept items would have kept them, accepting 1 more")
    assert said.endswith("(or --split, which asks the halves apart)")


def test_option_split(loaded: Any) -> None:
    ip = loaded
    ok(ip, "def halves(call):\n"
           "    items = [{'task_id': t['task_id'], 'verdict': 'match'} for t in call.tasks]\n"
           "    return json.dumps({'items': items[:-1] if len(items) > 1 else items})\n"
           "model = CallableProvider(halves)")
    ok(ip, "%config BatchJson.provider = model")
    r = run(ip, "%%batch_json nosplit --pack 4 --repairs 0 --replays 0\n" + BODY)
    assert isinstance(r.error_in_exec, BatchUnresolved)
    ok(ip, "%%batch_json labels --pack 4 --repairs 0 --replays 0 --split\n" + BODY)
    kinds = [a.kind for a in ip.user_ns["batch_session"].ledger.attempts("labels")]
    # evidence is content: this exact request was already tried under 'nosplit', so the first
    # call here is a replay of it, then the halves follow
    assert kinds[0] == "replay" and "split" in kinds
    assert ok(ip, "labels.status") == "resolved"


def test_option_max_calls(loaded: Any, capsys: Any) -> None:
    line = usage_error(loaded, "%%batch_json labels --max-calls 3\n" + BODY, capsys)
    assert "at least 4 calls" in line
    assert calls_recorded(loaded) == 0


def test_option_instructions(loaded: Any) -> None:
    ip = loaded
    ok(ip, "seen = []\n"
           "def record(call):\n"
           "    seen.append(call.prompt)\n"
           "    return json.dumps({'items': [{'task_id': t['task_id'], 'verdict': 'match'}"
           " for t in call.tasks]})\n"
           "model = CallableProvider(record)")
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, "note = 'Answer in one word.'")
    ok(ip, '%%batch_json labels --instructions "Be brief." --tasks tasks[:1]\n' + BODY)
    ok(ip, "%%batch_json other --instructions note --tasks tasks[:1]\n" + BODY)
    seen = ip.user_ns["seen"]
    assert seen[0].startswith("Be brief.") and seen[1].startswith("Answer in one word.")


def test_empty_body_with_tasks_runs(loaded: Any) -> None:
    ok(loaded, BODY)
    ok(loaded, "%%batch_json labels --tasks tasks --schema schema")
    assert ok(loaded, "labels.status") == "resolved"


def test_nested_magics_in_body(loaded: Any) -> None:
    ok(loaded, "%%batch_json labels\n%config BatchJson.replays = 0\n" + BODY)
    assert loaded.user_ns["batch_session"].replays == 0


# -- errors before spending ------------------------------------------------------------------
@pytest.mark.parametrize("header", [
    "%%batch_json labels --identity 'task_id case_id'",
    '%%batch_json labels --identity "task_id case_id" --pack 2',
    "%%batch_json labels --identity task_id case_id",
    "%%batch_json labels --pack 2 --identity task_id case_id --repairs 0",
])
def test_identity_written_with_spaces_says_fields_are_separated_by_commas(
        loaded: Any, capsys: Any, header: str) -> None:
    line = usage_error(loaded, header + "\nran = True\n" + BODY, capsys)
    assert "the fields are separated by commas, not spaces" in line, line
    assert line.endswith("write --identity task_id,case_id"), line
    assert "EXPR" not in line
    assert "ran" not in loaded.user_ns and calls_recorded(loaded) == 0  # refused before the body


def test_a_quoted_identity_names_the_fields_inside_the_quotes(loaded: Any) -> None:
    ok(loaded, "%%batch_json labels --identity 'task_id,case_id'\n" + BODY.replace(
        '"prompt"', '"case_id": "c", "prompt"'))
    assert ok(loaded, "labels.identity_compared") == ("task_id", "case_id")


@pytest.mark.parametrize(("header", "expected"), [
    ("%%batch_json labels --bogus 1", "unknown option --bogus; the options are --tasks"),
    ("%%batch_json labels --pack 0", "argument --pack: must be a whole number >= 1, got '0'"),
    ("%%batch_json labels --pack two", "must be a whole number >= 1, got 'two'"),
    ("%%batch_json labels --repairs -1", "argument --repairs"),
    ("%%batch_json labels --replays x", "argument --replays"),
    ("%%batch_json labels --max-calls 1.5", "argument --max-calls"),
    ("%%batch_json labels --identity ,", "--identity"),
    ("%%batch_json labels/v2", "not a valid Python variable name for the result; pass --out"),
    ("%%batch_json labels --out 1x", "not a valid Python variable name"),
    ("%%batch_json labels --out class", "not a valid Python variable name"),
    ("%%batch_json", "the following arguments are required: name"),
    ("%%batch_json labels --tasks [{'task_id': 'a'}]",
     "An option's EXPR may not contain spaces: build the value in the cell body"),
])
def test_bad_options_are_usage_errors(loaded: Any, capsys: Any, header: str,
                                      expected: str) -> None:
    assert expected in usage_error(loaded, header + "\n" + BODY, capsys)
    assert calls_recorded(loaded) == 0


def test_empty_body_without_tasks_names_the_fix(loaded: Any, capsys: Any) -> None:
    for cell in ("%%batch_json labels", "%%batch_json labels\n", "%%batch_json labels\n  \n"):
        line = usage_error(loaded, cell, capsys)
        assert "cell body is empty and no --tasks" in line and "--tasks EXPR" in line


def test_missing_variables(loaded: Any, capsys: Any) -> None:
    line = usage_error(loaded, "%%batch_json labels\nschema = {'type': 'object'}", capsys)
    assert line == ("UsageError: name 'tasks' is not defined: build `tasks` in the cell body "
                    "or pass --tasks EXPR")
    line = usage_error(loaded, "%%batch_json labels\ndel schema\ntasks = []", capsys)
    assert "build `schema` in the cell body or pass --schema EXPR" in line
    line = usage_error(loaded, "%%batch_json labels --validator nope\n" + BODY, capsys)
    assert line == "UsageError: --validator nope: name 'nope' is not defined"
    line = usage_error(loaded, "%%batch_json labels --tasks 1/0\n" + BODY, capsys)
    assert "--tasks 1/0 failed: ZeroDivisionError" in line
    assert "labels" not in loaded.user_ns and calls_recorded(loaded) == 0


def test_invalid_batch_is_a_usage_error(loaded: Any, capsys: Any) -> None:
    line = usage_error(loaded, "%%batch_json labels\n" + BODY + "tasks.append(tasks[0])", capsys)
    assert "duplicate task_id 't0'" in line
    line = usage_error(loaded, "%%batch_json labels --validator 42\n" + BODY, capsys)
    assert "validator must be callable" in line
    assert calls_recorded(loaded) == 0


def test_provider_not_configured(ip: Any, capsys: Any) -> None:
    ok(ip, "%load_ext batchjson")
    line = usage_error(ip, "%%batch_json labels\n" + BODY, capsys)
    assert "No model provider is configured" in line and "%config BatchJson.provider" in line
    assert calls_recorded(ip) == 0


def test_validator_changed_in_strict_session(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "%config BatchJson.strict = True")
    reject = BODY.replace('if item["verdict"] not in ("match", "no_match"):', "if True:")
    r = run(ip, "%%batch_json labels --validator check --repairs 0 --replays 0\n" + reject)
    assert isinstance(r.error_in_exec, BatchUnresolved)
    spent = calls_recorded(ip)
    line = usage_error(ip, "%%batch_json labels --validator check\n" + BODY, capsys)
    assert "validator 'check' changed" in line and "strict" in line
    assert calls_recorded(ip) == spent


def test_error_in_body_is_the_users_traceback(loaded: Any, capsys: Any) -> None:
    capsys.readouterr()
    r = run(loaded, "%%batch_json labels\nx = 1\ny = 1 / 0\n")
    assert isinstance(r.error_in_exec, ZeroDivisionError)
    out = capsys.readouterr().out
    assert "y = 1 / 0" in out and "3" in out  # the cell's own line 3
    assert "labels" not in loaded.user_ns


# -- define once -----------------------------------------------------------------------------
def test_define_once_keeps_identity_across_seven_reruns(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ids = set()
    for _ in range(7):
        ok(ip, "%%batch_json labels --validator check\n" + BODY + "def helper():\n    pass\n")
        ids.add(ok(ip, "id(check)"))
    assert len(ids) == 1
    assert "changed" not in capsys.readouterr().out
    registry = ip.user_ns["batch_session"].validators
    assert [v.version for v in registry.versions("check")] == [1]
    assert [v.name for v in registry] == ["check"]  # the helper is no validator
    assert ok(ip, "batch_session.evidence.unresolved_batches") == 0


def test_changed_definition_prints_one_line(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    first = ok(ip, "id(check)")
    capsys.readouterr()
    changed = BODY.replace("verdict must be", "the verdict has to be")
    ok(ip, "%%batch_json labels --validator check\n" + changed)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "validator 'check'" in ln]
    assert lines == ["batchjson: validator 'check' changed (code changed): now version 2"]
    assert ok(ip, "id(check)") != first
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    out = capsys.readouterr().out
    assert "batchjson: validator 'check' matches version 1: reusing it (was version 2)" in out
    assert ok(ip, "id(check)") == first


def test_superseded_revision_is_reported(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(malformed_json=1.0)")
    run(ip, "%%batch_json labels --repairs 0 --replays 0\n" + BODY)
    ok(ip, "model.faults = FaultPlan()")
    capsys.readouterr()
    ok(ip, "%%batch_json labels\n" + BODY + "tasks = tasks[:2]")
    out = capsys.readouterr().out
    assert out.count("batchjson: labels: revision 1 superseded (changed: tasks)") == 1
    status = ok(ip, "%batch_status labels")
    assert len(status["superseded"]) == 1 and "superseded" in repr(status)


# -- unresolved and interrupted ----------------------------------------------------------------
def test_unresolved_shows_short_report_and_binds_result(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(script={0: 'malformed_json'}, clean_after=1)")
    capsys.readouterr()
    r = run(ip, "%%batch_json labels --repairs 0 --replays 0\n" + BODY)
    out = capsys.readouterr().out
    assert isinstance(r.error_in_exec, BatchUnresolved)
    result = ip.user_ns["labels"]
    assert result.status == "unresolved" and result.calls == 4
    assert "BatchUnresolved: batch 'labels' (revision 1) is unresolved: 4 of 4" in out
    assert "re-running the same batch resumes" in out
    assert "Traceback" not in out and "site-packages" not in out
    assert len(out.splitlines()) < 15
    ok(ip, "%%batch_json labels --repairs 0 --replays 0\n" + BODY)
    assert ok(ip, "labels.status") == "resolved"


def test_interrupt_keeps_receipts_and_rerun_resumes(loaded: Any, capsys: Any) -> None:
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs Python's default SIGINT handler")
    ip = loaded
    ok(ip, "import signal\n"
           "class Interrupting(SimulatedModel):\n"
           "    async def complete(self, call):\n"
           "        if self.calls == 5:\n"
           "            signal.raise_signal(signal.SIGINT)\n"
           "        return await super().complete(call)\n"
           "model = Interrupting(answer=lambda task: {'verdict': 'match'}, latency=0.02)")
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, "%config BatchJson.concurrency = 2")
    body = BODY.replace("range(4)", "range(12)")
    capsys.readouterr()
    r = run(ip, "%%batch_json labels\n" + body)
    assert isinstance(r.error_in_exec, KeyboardInterrupt)
    captured = capsys.readouterr()
    assert "batch 'labels' interrupted. Receipts are kept" in captured.err
    assert "nothing partial was committed; re-run the cell to resume" in captured.err
    assert "Traceback" not in captured.out
    assert "labels" not in ip.user_ns
    ledger = ip.user_ns["batch_session"].ledger
    receipts = ledger.attempts("labels")
    assert receipts and all(a.status != "in_flight" for a in receipts)
    accepted = {t for a in receipts if a.status == "accepted" for t in a.task_ids}
    assert set(ledger.checkpoint("labels")) == accepted and 0 < len(accepted) < 12
    ok(ip, "model.calls = 100")
    ok(ip, "%%batch_json labels\n" + body)
    assert ok(ip, "labels.status") == "resolved"
    assert ok(ip, "labels.calls") == 12 - len(accepted)


# -- inspection magics -----------------------------------------------------------------------
def test_batch_status(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(malformed_json=1.0)")
    run(ip, "%%batch_json labels --repairs 0 --replays 0 --pack 2\n" + BODY)
    ok(ip, "model.faults = FaultPlan()")
    ok(ip, "%%batch_json other\n" + BODY)
    status = ok(ip, "%batch_status")
    assert isinstance(status, StatusView)
    assert status["unresolved_requests"] == 2 and status["minimum_exact_retry_calls"] == 2
    assert status["calls"] == 6 and status["usable_results"] == 4
    text = repr(status)
    for phrase in ("all batches", "unresolved", "minimum exact retry calls  2", "superseded",
                   "calls                      6", "cost so far", "cost per usable result",
                   "owed", "labels rev 1"):
        assert phrase in text
    html = status._repr_html_()
    assert "<table>" in html and "minimum exact retry calls" in html
    one = ok(ip, "%batch_status other")
    assert one["unresolved_requests"] == 0 and one["calls"] == 4
    assert "batch 'other'" in repr(one)
    assert "no batch named 'nope'" in usage_error(ip, "%batch_status nope", capsys)
    assert "labels, other" in usage_error(ip, "%batch_status nope", capsys)


def test_validators_magic(loaded: Any, capsys: Any) -> None:
    ip = loaded
    empty = ok(ip, "%validators")
    assert isinstance(empty, Table) and len(empty) == 0 and "no validators yet" in repr(empty)
    ok(ip, "%%batch_json labels --validator check\n" + BODY)
    table = ok(ip, "%validators")
    (row,) = [r for r in table.rows if r[0] == "check"]
    version = ip.user_ns["batch_session"].validators.current("check")
    assert row[1] == "1" and row[2] == version.fingerprint.short
    assert row[3].startswith("In[") and row[3].endswith(f"line {version.where.split(':')[-1]}")
    assert row[4] == "labels" and row[5] == "yes"
    assert "check" in repr(table) and "check" in table._repr_html_()
    assert "takes no arguments" in usage_error(ip, "%validators extra", capsys)


def test_only_the_validator_the_body_defines_is_registered_and_once(loaded: Any) -> None:
    ip = loaded
    ok(ip, "def shared(x):\n    return x\n")  # an earlier cell's function
    body = BODY.replace("def check(item, task):", "def make(limit):\n  def check(item, task):")
    body = body.replace("\n    if item", "\n    if len(item) > limit or item").replace(
        "\n        raise", "\n      raise") + "  return check\ncheck = make(5)\n"
    source = ("%%batch_json labels --validator check\nfrom os.path import join\n"
              "alias = shared\n" + body)
    for _ in range(2):
        ok(ip, source)
    names = sorted(v.name for v in ip.user_ns["batch_session"].validators)
    assert names == ["check"]  # not make, join, alias, nor make.<locals>.check
    assert ok(ip, "batch_session.evidence.unresolved_batches") == 0


def test_validators_lists_batches_by_fingerprint_across_sessions(loaded: Any) -> None:
    ip = loaded
    ok(ip, "%%batch_json first --validator check\n" + BODY)
    ok(ip, "%config BatchJson.strict = True")  # a new session on the same ledger, new registry
    changed = BODY.replace("verdict must be", "the verdict has to be")
    ok(ip, "%%batch_json second --validator check\n" + changed)
    rows = sorted((r for r in ok(ip, "%validators").rows if r[0] == "check"),
                  key=lambda r: r[4])
    assert [(r[4], r[5]) for r in rows] == [("first", ""), ("second", "yes")]
    assert rows[0][2] != rows[1][2]


def test_batch_receipts_numbers_1_to_n_and_keeps_numbers_when_filtered(loaded: Any,
                                                                        capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(script={0: 'malformed_json'}, clean_after=1)")
    ok(ip, "%%batch_json labels --tasks tasks[:2] --repairs 1 --replays 0\n" + BODY)
    view = ok(ip, "%batch_receipts labels")
    assert [(r["number"], r["kind"], r["status"]) for r in view.rows] == [
        (1, "initial", "rejected"), (2, "initial", "rejected"), (3, "repair", "accepted"),
        (4, "repair", "accepted")]
    assert any(e["type"] == "json" and e["message"].startswith("return is not valid JSON")
               for r in view.rows for e in r["errors"])
    assert '"items"' not in repr(view) and "page 1 of 1" in repr(view)
    failed = ok(ip, "%batch_receipts labels --failed")
    assert [r["number"] for r in failed.rows] == [1, 2]
    assert {r["status"] for r in failed.rows} == {"rejected"}
    raw = ok(ip, "%batch_receipts labels --failed --raw")
    assert '{"items"' in repr(raw) and "<details>" in raw._repr_html_()
    assert "no batch named 'nope'" in usage_error(ip, "%batch_receipts nope", capsys)
    assert "required: name" in usage_error(ip, "%batch_receipts", capsys)
    assert "unknown option --bogus" in usage_error(ip, "%batch_receipts labels --bogus", capsys)
    assert "--page" in usage_error(ip, "%batch_receipts labels --page 0", capsys)


def test_batch_receipts_pages_and_wraps_errors_whole(loaded: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(malformed_json=1.0)")
    run(ip, "%%batch_json labels --repairs 1 --replays 1\n" + BODY)  # 4 requests x 3 attempts
    first = ok(ip, "%batch_receipts labels --failed --per-page 5")
    assert [r["number"] for r in first.rows] == [1, 2, 3, 4, 5]
    text = repr(first)
    assert "page 1 of 3" in text
    assert "next page: %batch_receipts labels --failed --per-page 5 --page 2" in text
    last = ok(ip, "%batch_receipts labels --failed --per-page 5 --page 3")
    assert [r["number"] for r in last.rows] == [11, 12] and "next page" not in repr(last)
    for line in text.splitlines():
        assert len(line) <= 110, line  # long errors are wrapped, not cut mid-word
    message = first.rows[0]["errors"][0]["message"]
    assert " ".join(message.split()) in " ".join(text.split())  # the whole message is shown


def test_supersession_is_announced_before_the_new_revision_spends(loaded: Any,
                                                                   capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(malformed_json=1.0)")
    run(ip, "%%batch_json labels --repairs 0 --replays 0\n" + BODY)
    ok(ip, "import json\n"
           "def loud(call):\n"
           "    print('CALL MADE')\n"
           "    items = [{'task_id': t['task_id'], 'verdict': 'match'} for t in call.tasks]\n"
           "    return json.dumps({'items': items})\n"
           "%config BatchJson.provider = CallableProvider(loud)")
    capsys.readouterr()
    ok(ip, "%%batch_json labels\n" + BODY + "tasks = tasks[:2]")
    out = capsys.readouterr().out
    note = "batchjson: labels: revision 1 superseded (changed: tasks)"
    assert note in out and out.index(note) < out.index("CALL MADE")
    assert out.count("superseded") == 1


def test_failed_request_is_reported_once_not_per_bystander(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(wrong_type=1.0)")
    run(ip, "%%batch_json labels --pack 4 --repairs 0 --replays 0\n" + BODY)
    result = ip.user_ns["labels"]
    (failure,) = result.failures
    assert len(failure["tasks"]) == 4 and failure["bystanders"] == 3
    assert len(failure["errors"]) == 1 and failure["errors"][0]["type"] == "schema"
    assert failure["raw"].startswith('{"items"')
    assert all("raw" not in e for e in result.errors)  # the raw return is kept once
    report = result.failure_report()
    assert report.count("schema:") == 1 and "3 other task(s)" in report


def test_injected_helpers_work(loaded: Any) -> None:
    ip = loaded
    out = ok(ip, "llm_batch_json(['a', 'b'], {'type': 'object'})")
    assert out["values"] == [{"verdict": "match"}, {"verdict": "match"}] and not out["errors"]
    ok(ip, BODY)
    result = ok(ip, "run_batch('direct', tasks, schema, validator=validator(check))")
    assert result.status == "resolved"
    assert ok(ip, "validator(check) is check") is True


def test_display_objects_escape_html() -> None:
    table = Table("<title>", ["a<b"], [["<script>", "n&m"]])
    html = table._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html and "&amp;" in html
    assert "&lt;title&gt;" in html and "a&lt;b" in html


def test_a_cell_shows_its_progress_with_counts_and_config_progress_false_silences_it(
        loaded: Any, capsys: Any) -> None:
    ok(loaded, "%%batch_json labels --pack 2\n" + BODY)
    err = capsys.readouterr().err
    assert "labels resolved: 100%" in err and "4/4 [" in err, err
    assert "returns: 2 accepted, 0 rejected" in err, err
    ok(loaded, "%config BatchJson.progress = False")
    ok(loaded, "%%batch_json quiet --pack 2\n" + BODY)
    assert capsys.readouterr().err == ""


def test_batch_status_counts_calls_that_never_completed_with_a_lower_bound(
        loaded: Any) -> None:
    ip = loaded
    ok(ip, "%%batch_json labels\n" + BODY)
    ledger = ip.user_ns["batch_session"].ledger
    with ledger.store.transaction() as db:
        row = db.execute("SELECT batch_id, revision_id, request_key, task_ids FROM attempts "
                         "LIMIT 1").fetchone()
        db.execute("INSERT INTO attempts(batch_id, revision_id, request_key, task_ids, kind, "
                   "status, model, started_at, uid, estimated_input_tokens) VALUES "
                   "(?,?,?,?, 'replay', 'abandoned', 'gpt-4o-mini', 'x', 'u1', 2000)",
                   tuple(row))
    text = repr(ok(ip, "%batch_status labels"))
    assert "1 abandoned, 0 in flight" in text
    assert "cost unknown" in text and "an estimated $0.000300 more" in text


def test_validators_where_names_the_cell_that_defined_it(loaded: Any) -> None:
    ip = loaded
    ip.run_cell("1 + 1", store_history=True)  # an earlier cell, so counts are not all 1
    defining = ip.run_cell("%%batch_json labels --validator check\n" + BODY,
                           store_history=True)
    assert defining.success, defining.error_in_exec
    ip.run_cell("2 + 2", store_history=True)
    (row,) = [r for r in ok(ip, "%validators").rows if r[0] == "check"]
    assert row[3].startswith(f"In[{defining.execution_count}], ")


def test_an_unresolved_cell_lists_its_failed_requests_once(loaded: Any, capsys: Any) -> None:
    ip = loaded
    ok(ip, "model.faults = FaultPlan(script={0: 'malformed_json'}, clean_after=1)")
    capsys.readouterr()
    r = run(ip, "%%batch_json labels --repairs 0 --replays 0\n" + BODY)
    error = "\n".join(r.error_in_exec._render_traceback_())
    shown = ip.user_ns["labels"]._repr_html_()
    assert "return is not valid JSON" in shown  # the display lists the failed requests
    assert "not valid JSON" not in error and "request of" not in error
    assert "labels.failure_report()" in error and "%batch_receipts labels --failed" in error
    assert "re-running the same batch resumes" in error


def test_a_key_pasted_as_the_provider_in_config_is_never_echoed(loaded: Any, capsys: Any,
                                                                caplog: Any) -> None:
    key = "sk-proj-" + "Zq9x" * 12
    line = refused(loaded, f"%config BatchJson.provider = {key!r}", caplog)
    shown = line + caplog.text + "".join(capsys.readouterr())
    assert key not in shown and key[8:] not in shown
    assert "'sk-p'..." in line  # its first four characters, to recognise it by
    assert ok(loaded, "batch_session.provider is model") is True


def test_raw_returns_in_receipts_show_terminal_escapes_instead_of_obeying_them(
        loaded: Any) -> None:
    ok(loaded, "from batchjson import CallableProvider\n"
               "evil = CallableProvider(lambda call: '\\x1b[2J\\x1b[31mEVIL\\nsecond line')\n")
    ok(loaded, "%config BatchJson.provider = evil")
    run(loaded, "%%batch_json esc --repairs 0 --replays 0\n"
                "schema = {'type': 'object', 'properties': {'verdict': {'type': 'string'}}}\n"
                "tasks = [{'task_id': 't1', 'prompt': 'p'}]\n")
    text = ok(loaded, "%batch_receipts esc --raw").as_text()
    assert "\x1b" not in text and "\\x1b[2J" in text
    assert "        raw: second line" in text  # every line of the return keeps its indent


def test_an_unresolved_cell_whose_validator_crashed_says_to_fix_the_validator(
        loaded: Any) -> None:
    r = run(loaded, "%%batch_json crashy --repairs 0 --replays 0 --validator broken\n"
                    "schema = {'type': 'object', 'properties': {'verdict': {'type': 'string'}}}\n"
                    "tasks = [{'task_id': 't1', 'prompt': 'p'}]\n"
                    "def broken(item, task):\n"
                    "    return item['no_such_field'] > 1\n")
    assert isinstance(r.error_in_exec, BatchUnresolved)
    shown = "\n".join(r.error_in_exec._render_traceback_())
    assert "The validator itself failed" in shown and "KeyError" in shown
    assert "fix it and re-run" in shown


def test_a_crashed_validator_shows_its_own_frames_in_the_cell_and_its_receipts(
        loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    r = run(loaded, "%%batch_json crashy --repairs 0 --replays 0 --validator broken\n"
                    "schema = {'type': 'object', 'properties': {'verdict': {'type': 'string'}}}\n"
                    "tasks = [{'task_id': 't1', 'prompt': 'p'}]\n"
                    "def broken(item, task):\n"
                    "    return item['lable'] > 1\n")
    shown = "\n".join(r.error_in_exec._render_traceback_()).splitlines()
    at = next(i for i, line in enumerate(shown) if line.endswith(", line 5, in broken"))
    assert shown[at - 1] == "  where it failed (the validator's own frames):"
    assert shown[at].startswith("    File ") and shown[at + 1] == "      return item['lable'] > 1"
    assert not any("batchjson" in line for line in shown[at - 1:])
    receipts = ok(loaded, "%batch_receipts crashy --failed")
    assert "              return item['lable'] > 1" in receipts.as_text().splitlines()
    assert "<pre style='margin:0'>File " in receipts._repr_html_()
    monkeypatch.setattr(loaded, "kernel", object(), raising=False)  # the Jupyter display
    assert "return item[&#x27;lable&#x27;] &gt; 1</pre>" in loaded.user_ns["crashy"]._repr_html_()


def test_a_cell_that_does_not_assign_schema_says_it_ran_on_the_notebooks_variable(
        loaded: Any, capsys: Any) -> None:
    ok(loaded, BODY)  # an earlier cell left `tasks` and `schema` in the notebook
    note = "schema: the notebook's `schema`, not assigned in this cell"
    capsys.readouterr()
    ok(loaded, "%%batch_json labels\ntasks = [{'task_id': 'n1', 'prompt': 'p'}]\n")
    assert f"batchjson: {note}" in capsys.readouterr().out.splitlines()
    assert note in loaded.user_ns["labels"].notes
    assert not any(n.startswith("tasks:") for n in loaded.user_ns["labels"].notes)
    # the same object assigned again, or a new one by code the cell ran: both its own
    ok(loaded, "%%batch_json labels\nschema = schema\nexec('tasks = list(tasks)')\n")
    assert "not assigned in this cell" not in capsys.readouterr().out
    assert not any("this cell" in n for n in loaded.user_ns["labels"].notes)
    ok(loaded, "%%batch_json labels --schema schema --tasks tasks\n")  # named: not stale
    assert "not assigned in this cell" not in capsys.readouterr().out


def test_a_ledger_that_cannot_record_a_receipt_fails_the_cell_naming_it_and_sends_nothing(
        loaded: Any, capsys: Any) -> None:
    """A full disk (here a trigger refusing receipts with SQLite's own words) from the magic:
    one line naming the ledger file and the cause, and not one call sent."""
    ledger = loaded.user_ns["batch_session"].ledger
    with ledger.store.transaction() as db:
        db.execute("CREATE TRIGGER full BEFORE INSERT ON attempts BEGIN "
                   "SELECT RAISE(FAIL, 'database or disk is full'); END")
    capsys.readouterr()
    result = loaded.run_cell("%%batch_json labels\n" + BODY)
    assert isinstance(result.error_in_exec, UsageError), result.error_in_exec
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # under the progress bar's lines
    assert line.startswith("UsageError: ") and "Traceback" not in err, err
    assert str(ledger.path) in line and "database or disk is full" in line, line
    assert loaded.user_ns["model"].calls == 0


# -- charts ----------------------------------------------------------------------------------
def _front_end_shows_pictures(ip: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """What the kernel publishes, as a front end that renders HTML and PNG would get it."""
    published: list[dict] = []
    monkeypatch.setattr(ip.display_formatter, "active_types",
                        ["text/plain", "text/html", "image/png"])
    monkeypatch.setattr(ip.display_pub, "publish", lambda data, *a, **k: published.append(data))
    return published


def _pictures(published: list[dict]) -> list[bytes]:
    return [d["image/png"] for d in published if "image/png" in d]


FAULTY = ("%config BatchJson.provider = SimulatedModel(answer=lambda task: "
          "{'verdict': 'match'}, faults=FaultPlan(item_wrong_type=0.1), seed=3)")


def test_batch_advise_shows_the_chart_then_the_advice_with_its_intervals(
        loaded: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    ok(loaded, FAULTY)
    ok(loaded, "%%batch_json labels --pack 2\n" + BODY.replace("range(4)", "range(20)"))
    published = _front_end_shows_pictures(loaded, monkeypatch)
    view = ok(loaded, "%batch_advise labels --replays 2")
    [png] = _pictures(published)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert view["replays"] == 2 and view["current_pack"] == 2
    assert "pack-size advice for batch 'labels'" in repr(view) and "interval" in repr(view)
    assert view["verdict"] in " ".join(repr(view).split())
    assert "no batch named 'nope'" in usage_error(loaded, "%batch_advise nope", capsys)


def test_a_run_that_spent_nothing_known_and_accepted_nothing_draws_no_empty_chart(
        loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded.user_ns["broken"] = batchjson.CallableProvider(lambda call: "not json")  # no usage
    ok(loaded, "%config BatchJson.provider = broken")
    published = _front_end_shows_pictures(loaded, monkeypatch)
    result = loaded.run_cell("%%batch_json labels --repairs 0 --replays 0\n" + BODY)
    assert isinstance(result.error_in_exec, BatchUnresolved)
    assert any("text/html" in d for d in published) and _pictures(published) == []


def test_batch_status_of_a_batch_and_its_result_show_spend_over_time(
        loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    published = _front_end_shows_pictures(loaded, monkeypatch)
    ok(loaded, "%%batch_json labels\n" + BODY)  # the result, then its chart
    assert any("text/html" in d for d in published) and len(_pictures(published)) == 1
    ok(loaded, "%batch_status labels")
    assert len(_pictures(published)) == 2
    ok(loaded, "%batch_status")  # every batch: the account, no one batch's chart
    assert len(_pictures(published)) == 2


def test_a_terminal_draws_no_chart_and_without_matplotlib_one_line_says_how_to_get_it(
        loaded: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    ok(loaded, "%%batch_json labels\n" + BODY)
    capsys.readouterr()
    ok(loaded, "%batch_advise labels")  # a terminal shows text only
    assert "install batchjson[plots]" not in capsys.readouterr().out
    published = _front_end_shows_pictures(loaded, monkeypatch)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    view = ok(loaded, "%batch_advise labels")
    assert not _pictures(published) and "pack-size advice" in repr(view)
    said = capsys.readouterr().out  # the line, then the advice as the cell's value
    assert said.startswith("batchjson: install batchjson[plots] (matplotlib) to see the chart\n")
    assert said.count("matplotlib") == 1
