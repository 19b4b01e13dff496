"""Every bad input is refused in one place (the run description, ``RunSpec``, and the session's
own settings), so every face refuses it the same way: with a batchjson error naming the problem
and the fix, before anything is spent or recorded (a UsageError in a magic, exit code 2 and no
traceback in the CLI)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchjson import (
    CallableProvider,
    ConfigError,
    InvalidBatch,
    ProviderSetupError,
    RunSpec,
    Session,
)
from batchjson.rlm import bind
from tests.helpers import LABEL_SCHEMA, items_reply, review_tasks

TABLES = ("batches", "revisions", "requests", "attempts", "validators", "claims")


class Spy:
    """A provider function that counts what it is asked."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, call: Any) -> str:
        self.calls += 1
        return items_reply(call) if call.mode == "items" else '"yes"'


def recorded(ledger: Path) -> dict[str, int]:
    """Rows in every table a run writes (none at all if the file was never made)."""
    if not ledger.exists():
        return {}
    db = sqlite3.connect(ledger)
    try:
        return {t: n for t in TABLES
                if (n := db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])}
    finally:
        db.close()


async def agen_check(item: Any, task: Any) -> Any:
    yield item  # an async generator: calling it returns something no one can await


def gen_check(item: Any, task: Any) -> Any:
    yield item


RUN_INPUTS = [
    ("split='yes'", {"split": "yes"}, "split must be True or False, got 'yes'"),
    ("split=2", {"split": 2}, "split must be True or False, got 2"),
    ("a NUL batch name", {"name": "\x00"}, "control character '\\x00' at position 0"),
    # a PostgreSQL ledger cannot hold it: the run would pay for its call, then fail to record it
    ("a NUL in a task_id", {"tasks": [*review_tasks(1), {**review_tasks(2)[1],
                                                         "task_id": "t2\x00"}]},
     "task #1: task_id 't2\\x00' holds a NUL character (\\x00); remove it from the id"),
    ("a newline in a batch name", {"name": "labels\nrow"}, "use printable characters"),
    ("an async-generator validator", {"validator": agen_check},
     "agen_check is an async generator function (it uses yield)"),
    ("a generator validator", {"validator": gen_check},
     "gen_check is a generator function (it uses yield)"),
    ("pack True", {"pack": True}, "pack must be a whole number >= 1"),
    ("progress 'bar'", {"progress": "bar"}, "progress must be True, False or None"),
    ("instructions as bytes", {"instructions": b"be brief"}, "instructions must be a"),
    # a typo'd keyword is ignored by every validator: `requried` would commit {} as resolved
    ("'requried' in a schema", {"schema": {**LABEL_SCHEMA, "required": [],
                                           "requried": ["verdict"]}},
     "schema keyword 'requried' at <root> is not JSON Schema (did you mean 'required'?)"),
    ("'propertes' in a schema", {"schema": {"type": "object", "required": ["verdict"],
                                            "propertes": LABEL_SCHEMA["properties"]}},
     "did you mean 'properties'?"),
    ("'enun' in a property", {"schema": {**LABEL_SCHEMA, "properties": {
        "verdict": {"type": "string", "enun": ["match", "no_match"]}}}},
     "'enun' at properties/verdict is not JSON Schema (did you mean 'enum'?)"),
    ("'minimun' deep in $defs", {"schema": {**LABEL_SCHEMA, "$defs": {"n": {"anyOf": [
        {"type": "array", "items": {"type": "integer", "minimun": 0}}]}}}},
     "'minimun' at $defs/n/anyOf/0/items is not JSON Schema (did you mean 'minimum'?)"),
    ("'Required' in a schema", {"schema": {**LABEL_SCHEMA, "Required": ["verdict"]}},
     "(did you mean 'required'?)"),
    # a keyword of another draft, which the schema's own draft ignores, commits what it forbids
    ("draft-07's 'dependencies' judged as 2020-12", {"schema": {**LABEL_SCHEMA, "dependencies": {
        "verdict": ["case_id"]}}}, "schema keyword 'dependencies' at <root> is ignored by JSON "
     "Schema draft 2020-12, the draft this schema is judged by (its $schema, else 2020-12), so "
     "nothing it meant would be checked: write it as 'dependentRequired' or 'dependentSchemas'"),
    ("draft 3's 'divisibleBy' judged as 2020-12", {"schema": {**LABEL_SCHEMA, "properties": {
        "n": {"type": "integer", "divisibleBy": 3}}}},
     "'divisibleBy' at properties/n is ignored by JSON Schema draft 2020-12"),
    ("'prefixItems' under a draft-07 $schema", {"schema": {
        **LABEL_SCHEMA, "$schema": "http://json-schema.org/draft-07/schema#", "properties": {
            "pair": {"type": "array", "prefixItems": [{"type": "string"}]}}}},
     "write it as 'items', as draft-07 does, or set $schema to a draft that has 'prefixItems' "
     "(draft 2020-12)"),
    ("'dependentRequired' under a draft-07 $schema", {"schema": {
        **LABEL_SCHEMA, "$schema": "http://json-schema.org/draft-07/schema#",
        "dependentRequired": {"verdict": ["case_id"]}}},
     "'dependentRequired' at <root> is ignored by JSON Schema draft-07"),
    *((f"a {kind} as an explicit identity value", {
        "tasks": [*review_tasks(2), {**review_tasks(3)[2], "case_id": value}],
        "identity": ["task_id", "case_id"], "pack": 2},
       f"identity field 'case_id' is a {said}, but identity values must be "
       "plain JSON scalars") for kind, value, said in (
          ("list", ["c"], "list"), ("tuple", ("c",), "list"), ("dict", {"c": 1}, "dict"))),
]


@pytest.mark.parametrize(("what", "bad", "said"), RUN_INPUTS, ids=[c[0] for c in RUN_INPUTS])
@pytest.mark.parametrize("face", ["run_batch", "RunSpec"])
def test_a_bad_run_input_is_refused_before_anything_is_spent_or_recorded(
        tmp_path: Path, face: str, what: str, bad: dict[str, Any], said: str) -> None:
    spy, ledger = Spy(), tmp_path / "l.sqlite"
    session = Session(CallableProvider(spy), ledger=ledger)
    args = {"name": "r", "tasks": review_tasks(2), "schema": LABEL_SCHEMA, **bad}
    with pytest.raises(InvalidBatch) as raised:
        if face == "run_batch":
            session.run_batch(args.pop("name"), args.pop("tasks"), args.pop("schema"), **args)
        else:
            session.run(RunSpec(**args))
    assert said in str(raised.value)
    assert spy.calls == 0 and recorded(ledger) == {}
    session.close()


def test_a_spec_refuses_a_bad_option_when_it_is_made() -> None:
    """Before any session sees it: a face that builds a spec learns at once."""
    with pytest.raises(InvalidBatch, match="split must be True or False"):
        RunSpec(name="r", tasks=review_tasks(1), schema=LABEL_SCHEMA, split="no")
    with pytest.raises(InvalidBatch, match="validator_name .* control character"):
        RunSpec(name="r", tasks=review_tasks(1), schema=LABEL_SCHEMA,
                validator=lambda item, task: None, validator_name="a\tb")


@pytest.mark.parametrize(("what", "options", "said"), [
    ("strict='yes'", {"strict": "yes"}, "strict must be True or False, got 'yes'"),
    ("strict=1", {"strict": 1}, "strict must be True or False"),
    ("ledger=123", {"ledger": 123},
     "ledger must be a file path (a str or pathlib.Path), a postgresql:// URL, or None"),
    ("ledger as bytes", {"ledger": b"l.sqlite"}, "ledger must be a file path"),
    ("ledger with a NUL", {"ledger": "a\x00b.sqlite"}, "ledger path 'a\\x00b.sqlite' holds a "
     "NUL character"),
    ("concurrency 0", {"concurrency": 0}, "concurrency must be a whole number >= 1"),
    ("replays 'two'", {"replays": "two"}, "replays must be a whole number >= 0"),
], ids=lambda case: case if isinstance(case, str) else None)
def test_a_bad_session_setting_is_refused_before_the_ledger_is_made(
        tmp_path: Path, what: str, options: dict[str, Any], said: str) -> None:
    spy, ledger = Spy(), tmp_path / "l.sqlite"
    options = {"ledger": ledger, **options}
    with pytest.raises(ConfigError) as raised:
        Session(CallableProvider(spy), **options)
    assert said in str(raised.value)
    assert not ledger.exists() and list(tmp_path.iterdir()) == []


def test_a_callable_provider_with_a_negative_max_tokens_is_refused() -> None:
    with pytest.raises(ProviderSetupError,
                       match=r"CallableProvider max_tokens must be a whole number >= 1, got -1"):
        CallableProvider(Spy(), max_tokens=-1)


# -- the RLM face ------------------------------------------------------------------------------
@pytest.mark.parametrize(("options", "said"), [
    ({"strict": "yes"}, "strict must be True or False"),
    ({"ledger": 123}, "ledger must be a file path"),
    ({"ledger": "/tmp/a\x00b"}, "holds a NUL character"),
])
def test_rlm_bind_refuses_bad_settings_the_same_way(options: dict[str, Any], said: str) -> None:
    namespace: dict[str, Any] = {}
    with pytest.raises(ConfigError, match=said):
        bind(namespace, CallableProvider(Spy()), **options)
    assert "llm_batch_json" not in namespace


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"validator": agen_check}, "agen_check is an async generator function"),
    ({"name": "\x00"}, "control character"),
])
def test_rlm_helper_refuses_bad_input_before_spending_or_recording(
        tmp_path: Path, kwargs: dict[str, Any], said: str) -> None:
    spy, ledger, namespace = Spy(), tmp_path / "l.sqlite", {}
    bind(namespace, CallableProvider(spy), ledger=ledger)
    with pytest.raises(InvalidBatch, match=said):
        namespace["llm_batch_json"](["is it?", "and this?"], {"type": "string"}, **kwargs)
    assert spy.calls == 0 and recorded(ledger) == {}


@pytest.mark.parametrize("prompts", [[b"is it?"], ["is it?", bytearray(b"and this?")],
                                     ["is it?", {"text": "and this?"}]])
@pytest.mark.parametrize("face", ["Session", "bind llm_batch_json",
                                  "bind llm_query_batched_json"])
def test_a_prompt_that_is_not_text_is_refused_by_index_before_anything_is_recorded(
        tmp_path: Path, face: str, prompts: list[Any]) -> None:
    """bytes read from a file used to fail deep in the run with a raw TypeError."""
    spy, ledger, namespace = Spy(), tmp_path / "l.sqlite", {}
    if face == "Session":
        helper = Session(CallableProvider(spy), ledger=ledger).llm_batch_json
    else:
        bind(namespace, CallableProvider(spy), ledger=ledger)
        helper = namespace[face.split()[1]]
    with pytest.raises(InvalidBatch) as raised:
        helper(prompts, {"type": "string"}, validator=lambda value, index: None)
    index = len(prompts) - 1
    assert str(raised.value).startswith(f"prompts[{index}]: prompt must be a string, got "
                                        f"{type(prompts[index]).__name__}")
    if isinstance(prompts[index], (bytes, bytearray)):
        assert f"prompts[{index}].decode('utf-8')" in str(raised.value)
    with pytest.raises(InvalidBatch, match=r"contexts\[0\]: a context must be a string or None"):
        helper(["is it?"], {"type": "string"}, contexts=[b"ctx"])
    assert spy.calls == 0 and recorded(ledger) == {}


def kw_check(value: Any, index: Any, *, must: Any) -> None:
    return None


@pytest.mark.parametrize("validator", [lambda value: None, len, kw_check],
                         ids=["one parameter", "len", "a required keyword"])
def test_binds_helper_refuses_a_validator_it_cannot_call_before_registering_it(
        tmp_path: Path, validator: Any) -> None:
    """Refused, as Session.llm_batch_json refuses it, before the registry writes a
    ``validators`` row: nothing is recorded for a call that was never made."""
    spy, ledger, namespace = Spy(), tmp_path / "l.sqlite", {}
    bind(namespace, CallableProvider(spy), ledger=ledger)
    with pytest.raises(InvalidBatch, match=r"cannot be called as validator\(item, index\)"):
        namespace["llm_batch_json"](["is it?"], {"type": "string"}, validator=validator)
    assert spy.calls == 0 and recorded(ledger) == {}


@pytest.mark.parametrize(("bad", "said"), [
    ({"schema": {"type": "strin"}}, "invalid JSON Schema"),
    ({"name": "labels\x00"}, "control character"),
    ({"prompts": ["is it?", b"and this?"]}, "prompts[1]: prompt must be a string"),
    ({"contexts": [3]}, "contexts[0]: a context must be a string or None"),
    ({"schema": {"type": "object", "propertes": {}}}, "did you mean 'properties'?"),
], ids=["a bad schema", "a bad name", "bytes as a prompt", "a number as a context",
        "a schema typo"])
def test_binds_helper_registers_a_good_validator_only_for_a_call_it_makes(
        tmp_path: Path, bad: dict[str, Any], said: str) -> None:
    """The helper registers the call's validator (a ``validators`` row) before it runs: every
    input that refuses the call is checked first, so a refused call leaves no row."""
    spy, ledger, namespace = Spy(), tmp_path / "l.sqlite", {}
    bind(namespace, CallableProvider(spy), ledger=ledger)
    args = {"prompts": ["is it?"], "schema": {"type": "string"}, **bad}
    with pytest.raises(InvalidBatch, match=re.escape(said)):
        namespace["llm_batch_json"](args.pop("prompts"), args.pop("schema"),
                                    validator=lambda value, index: None, **args)
    assert spy.calls == 0 and recorded(ledger) == {}


# -- provider settings -------------------------------------------------------------------------
PROVIDER_SETTINGS = [
    ("extra_body a list", {"extra_body": [1]}, "extra_body must be a dict"),
    ("extra_body with a number as a key", {"extra_body": {1: "x"}}, "extra_body must be a dict"),
    ("a negative max_tokens", {"extra_body": {"max_tokens": -1}},
     "extra_body 'max_tokens' must be a whole number of tokens >= 1"),
    ("max_completion_tokens as text", {"extra_body": {"max_completion_tokens": "100"}},
     "got '100'; e.g. extra_body={'max_completion_tokens': 1024}"),
    ("max_connections -1", {"max_connections": -1}, "max_connections (0 for no limit) must be"),
    ("max_connections 1.5", {"max_connections": 1.5}, "max_connections (0 for no limit) must be"),
    ("base_url a number", {"base_url": 8000}, "base_url must be a string"),
    ("api_key a number", {"api_key": 1234}, "api_key= must be a string"),
    ("prices a list", {"prices": [1]}, "prices must map model names to prices"),
]


@pytest.mark.parametrize("protocol", ["OpenAIProvider", "AnthropicProvider"])
@pytest.mark.parametrize(("what", "setting", "said"), PROVIDER_SETTINGS,
                         ids=[c[0] for c in PROVIDER_SETTINGS])
def test_a_provider_setting_no_call_could_use_is_refused_when_the_provider_is_made(
        protocol: str, what: str, setting: dict[str, Any], said: str) -> None:
    """Each used to be accepted and then sent as is, ignored by the budget, or crash with a raw
    TypeError: refused now, naming the setting and what it must be."""
    import batchjson

    if protocol == "AnthropicProvider" and "max_tokens" in setting.get("extra_body", {}):
        said = "extra_body may not set 'max_tokens'"  # its own max_tokens= argument
    options = {"base_url": "http://127.0.0.1:9/v1", **setting}
    with pytest.raises(ProviderSetupError) as raised:
        getattr(batchjson, protocol)("m1", **options)
    assert said in str(raised.value) and str(raised.value).startswith(protocol)


@pytest.mark.parametrize("key", ["sk-proj-Xq7Lm2Np9Rs4Tv6Wy8Za1Bc3De5Fg7Hj9Kl2Mn4\n",
                                 " sk-proj-Xq7Lm2Np9Rs4Tv6Wy8Za1Bc3De5Fg7Hj9Kl2Mn4",
                                 "sk-proj-Xq7Lm2Np9Rs4Tv6Wy8Za1Bc3De5Fg7Hj9Kl2Mn4\r\n"])
@pytest.mark.parametrize("given", ["api_key", "environment"])
def test_an_api_key_with_whitespace_around_it_is_refused_at_setup_not_blamed_on_the_base_url(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, given: str) -> None:
    """A key read from a file keeps its newline, which no HTTP header can carry: every call
    used to be recorded as a provider error telling the user to check the base URL."""
    from batchjson import OpenAIProvider
    from batchjson.testing import LoopbackServer

    ledger = tmp_path / "l.sqlite"
    with LoopbackServer() as srv:
        options = {"api_key": key} if given == "api_key" else {}
        monkeypatch.setenv("OPENAI_API_KEY", key)
        session = Session(provider="openai", model="gpt-4o-mini", ledger=ledger)
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        with pytest.raises(ProviderSetupError) as raised:
            if options:
                OpenAIProvider("gpt-4o-mini", base_url=srv.base_url, **options)
            else:
                session.run_batch("r", review_tasks(2), LABEL_SCHEMA)
        assert srv.requests == 0
    message = str(raised.value)
    where = "api_key=" if given == "api_key" else "the OPENAI_API_KEY environment variable"
    assert f"the API key from {where}" in message and "whitespace around it" in message
    assert ".strip()" in message and "base URL" not in message
    assert key.strip() not in message and key.strip()[-12:] not in message
    session.close()
    assert recorded(ledger) == {}


def test_an_api_key_with_a_space_or_control_character_inside_is_refused_at_setup() -> None:
    from batchjson import AnthropicProvider

    for key in ("sk-ant-api03 Zy9Xw8Vu7Ts6Rq5Po4", "sk-ant-api03\x00Zy9Xw8Vu7Ts6Rq5Po4",
                "sk-ant-api03-Zy9Xw8Vu7Ts6Rq5Po4\u200b"):
        with pytest.raises(ProviderSetupError, match="copy the key again") as raised:
            AnthropicProvider("claude-haiku-4-5", base_url="http://127.0.0.1:9", api_key=key)
        assert "Zy9Xw8Vu7Ts6Rq5Po4" not in str(raised.value)


# -- the notebook face -------------------------------------------------------------------------
def magic_setup(ip: Any) -> Spy:
    from tests.test_magics import ok

    spy = Spy()
    ip.user_ns["spy_provider"] = CallableProvider(spy)
    ok(ip, "%load_ext batchjson")
    ok(ip, "%config BatchJson.provider = spy_provider")
    return spy


@pytest.mark.parametrize(("line", "said"), [
    ("%%batch_json b --instructions 'abc", "No closing quotation"),
    ('%%batch_json b --identity "task_id,case_id', "close the quote"),
])
def test_an_unclosed_quote_in_a_magic_is_a_usage_error(
        ip: Any, capsys: Any, line: str, said: str) -> None:
    from tests.test_magics import usage_error

    spy = magic_setup(ip)
    body = f"{line}\ntasks = {review_tasks(2)!r}\nschema = {LABEL_SCHEMA!r}\n"
    said_line = usage_error(ip, body, capsys)
    assert said in said_line and "%batch_json" in said_line
    assert spy.calls == 0 and recorded(Path(".batchjson/ledger.sqlite")) == {}
    for magic in ("%batch_status 'b", "%batch_receipts 'b"):
        assert "close the quote" in usage_error(ip, magic, capsys)


def test_a_magic_refuses_an_async_generator_validator_before_spending_or_recording(
        ip: Any, capsys: Any) -> None:
    from tests.test_magics import usage_error

    spy = magic_setup(ip)
    cell = (f"%%batch_json b --validator check\ntasks = {review_tasks(2)!r}\n"
            f"schema = {LABEL_SCHEMA!r}\nasync def check(item, task):\n    yield item\n")
    said = usage_error(ip, cell, capsys)
    assert "check is an async generator function" in said and "without yield" in said
    assert spy.calls == 0 and recorded(Path(".batchjson/ledger.sqlite")) == {}


def test_a_magic_refuses_a_schema_typo_with_a_did_you_mean_before_spending(
        ip: Any, capsys: Any) -> None:
    from tests.test_magics import usage_error

    spy = magic_setup(ip)
    schema = {**LABEL_SCHEMA, "required": [], "requried": ["verdict"]}
    said = usage_error(ip, f"%%batch_json b\ntasks = {review_tasks(2)!r}\nschema = {schema!r}\n",
                       capsys)
    assert "'requried'" in said and "did you mean 'required'?" in said
    assert spy.calls == 0 and recorded(Path(".batchjson/ledger.sqlite")) == {}


def test_a_magic_refuses_a_strict_setting_that_is_not_a_bool(ip: Any, caplog: Any) -> None:
    from tests.test_magics import refused

    magic_setup(ip)
    said = refused(ip, "%config BatchJson.strict = 'yes'", caplog)
    assert "'strict' trait of a BatchJson instance expected a boolean, not the str 'yes'" in said
    assert ip.magics_manager.registry["BatchJson"].strict is False


# -- the command line --------------------------------------------------------------------------
@pytest.mark.parametrize("port", ["-5", "65536", "http"])
def test_serve_with_a_bad_port_exits_2_without_a_traceback(tmp_path: Path, port: str) -> None:
    done = subprocess.run([sys.executable, "-m", "batchjson", "serve", "--port", port],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr
    assert "argument --port: must be a whole number from 0 to 65535" in done.stderr


@pytest.mark.parametrize(("option", "value"), [("--latency", "nan"), ("--latency", "inf"),
                                               ("--latency", "-1"), ("--hold", "nan"),
                                               ("--retry-after", "-0.5"), ("--rate-429", "nan"),
                                               ("--rate-500", "2")])
def test_serve_with_a_delay_or_rate_that_is_no_number_exits_2_without_a_traceback(
        tmp_path: Path, option: str, value: str) -> None:
    """``--latency nan`` used to start a server that never answers."""
    done = subprocess.run([sys.executable, "-m", "batchjson", "serve", option, value],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert option in done.stderr and ("finite number of seconds >= 0" in done.stderr
                                      or "probability in [0, 1]" in done.stderr)


def test_a_simulated_model_with_a_delay_that_is_no_number_is_refused() -> None:
    from batchjson import SimulatedModel

    for latency in (-1, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ProviderSetupError, match="SimulatedModel latency must be a finite"):
            SimulatedModel(latency=latency)


def test_serve_on_a_port_in_use_exits_2_naming_it(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run([sys.executable, "-m", "batchjson", "serve", "--port", port],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr


def test_a_spec_reads_an_identity_given_as_a_generator_once_and_keeps_it() -> None:
    tasks = review_tasks(2)
    spec = RunSpec(name="r", tasks=tasks, schema=LABEL_SCHEMA,
                   identity=(name for name in ("task_id", "case_id")))
    assert spec.identity == ("task_id", "case_id")
    assert spec.checked().identity == ("task_id", "case_id")
    result = Session(CallableProvider(Spy())).run(spec)
    assert result.identity_compared == ("task_id", "case_id") and result.resolved


def test_rlm_helper_says_what_one_call_may_cost_when_the_budget_cannot_hold_it(
        tmp_path: Path) -> None:
    from batchjson import BudgetExceeded

    spy, ledger, namespace = Spy(), tmp_path / "l.sqlite", {}
    provider = CallableProvider(spy, price={"input": 3.0, "output": 15.0}, max_tokens=1000)
    bind(namespace, provider, ledger=ledger, budget={"cost": 0.001})
    with pytest.raises(BudgetExceeded) as raised:
        namespace["llm_batch_json"](["is it?"], {"type": "string"})
    said = str(raised.value)
    assert "one call may cost up to $0.01" in said and "cost budget has left" in said
    assert "0 call(s) remain" not in said and raised.value.one_call > 0.001
    assert spy.calls == 0


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"\ud800": {"type": "string"}}},
    {"type": "object", "properties": {"label": {"enum": ["ok", "\ud800"]}}},
    {"type": "object", "description": "half an emoji \udc80"},
])
def test_an_unpaired_surrogate_in_a_schema_is_refused_by_where_it_is_before_anything_is_spent(
        schema: dict[str, Any]) -> None:
    calls: list[Any] = []
    session = Session(CallableProvider(lambda call: calls.append(call) or items_reply(call)))
    with pytest.raises(InvalidBatch, match=r"schema holds an unpaired surrogate at "
                                           r"(properties/'\\ud800' \(a key\)|properties/label/"
                                           r"enum/1|description) .*fix the text"):
        session.run_batch("b", review_tasks(2), schema)
    namespace: dict[str, Any] = {}
    bind(namespace, lambda prompts: ["{}" for _ in prompts])
    with pytest.raises(InvalidBatch, match="unpaired surrogate"):
        namespace["llm_batch_json"](["a"], schema)
    assert calls == [] and session.ledger.batch_names() == []


def test_a_validator_name_that_no_ledger_can_store_is_refused_when_it_is_registered() -> None:
    namespace: dict[str, Any] = {}
    bind(namespace, lambda prompts: ["{}" for _ in prompts])
    for name, said in (("\ud800", "unpaired surrogate"), ("a\x00b", "control character")):
        with pytest.raises(InvalidBatch, match=f"a validator name .*{said}"):
            namespace["validator"](lambda value, index: None, name=name)


def test_a_ledgers_reads_refuse_a_name_no_batch_can_have_with_batchjsons_own_error(
        ledger_at: Any) -> None:
    """A batch name with an unpaired surrogate reached SQLite or psycopg and came back as their
    UnicodeEncodeError; a budget beyond any float as an OverflowError."""
    from batchjson import Ledger

    ledger = Ledger(ledger_at())
    name = "labels\ud800"
    for read in (ledger.spend, ledger.cost_summary, ledger.evidence, ledger.attempts,
                 ledger.checkpoint, ledger.revisions, ledger.export_receipts,
                 lambda n: ledger.forget(n, via="test")):
        with pytest.raises(InvalidBatch, match=r"batch name 'labels\\ud800' holds an unpaired "
                                               "surrogate at position 6"):
            read(name)
    for huge in (10**400, 10**5000):  # past any float; past what Python prints as digits
        with pytest.raises(InvalidBatch, match="finite number .*got an integer of"):
            ledger.set_budget(huge)
    assert ledger.budget() is None and ledger.batch_names() == []
    ledger.close()
