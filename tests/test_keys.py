"""A key is never echoed: every key shape, in every place a user may put it or a server may echo
it, is absent from the ledger file and its WAL, exports, reprs, CLI output, messages and
tracebacks; task data that looks like a key is shown as it is."""

from __future__ import annotations

import io
import json
import socket
import traceback
from pathlib import Path
from typing import Any

import pytest

from batchjson import (
    AnthropicProvider,
    CallableProvider,
    ConfigError,
    LedgerError,
    OpenAIProvider,
    ProviderError,
    ProviderSetupError,
    Session,
    SimulatedModel,
)
from batchjson import _cli as cli
from batchjson._secrets import Secrets, looks_like_key, public_url, shown_name
from batchjson.testing import LoopbackServer
from tests.helpers import LABEL_SCHEMA, answer, review_tasks

KEYS = {
    "sk-proj": "sk-proj-" + "Xq7Lm2Np9Rs4Tv6Wy8Za1Bc3De5Fg7Hj9Kl2Mn4Pq6Rs8Tu0Vw",
    "sk-ant": "sk-ant-api03-" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe9Dc8Ba7-_Ab12Cd34",
    "32-hex": "9f86d081884c7d659a2feaa0c55ad015",
    "uuid": "3f2b8c1e-9a4d-4e7b-8c2a-5d6e7f8a9b0c",
}
# Another key of each shape: what a server may echo that batchjson was never given.
OTHER = {
    "sk-proj": "sk-proj-" + "Aa1Bb2Cc3Dd4Ee5Ff6Gg7Hh8Ii9Jj0Kk1Ll2Mm3Nn4Oo5Pp6Qq",
    "sk-ant": "sk-ant-api03-" + "Qq6Pp5Oo4Nn3Mm2Ll1Kk0Jj9Ii8Hh7Gg6Ff5Ee4Dd3Cc2-_Bb1Aa0",
    "32-hex": "c7a1f09e42b8d3650f1e2a9b7c4d8e31",
    "uuid": "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d",
}
SHAPES = sorted(KEYS)


class EchoingServer(LoopbackServer):
    """The loopback server, plus what a hostile or careless gateway does: its first answer is
    an error whose body echoes the request URL (query included), every answer echoes ``echo``
    as its ``model`` and ``id``, and each request's path and query are recorded."""


    def __init__(self, echo: str, answers: Any = answer, **kwargs: Any) -> None:
        super().__init__(SimulatedModel(answer=answers), **kwargs)
        self.echo = echo
        self.paths: list[str] = []

    async def _early(self, request: Any, fault: Any, key: Any, protocol: str) -> Any:
        from batchjson.testing._wire import error_response

        self.paths.append(request.path_qs)
        if len(self.paths) == 1:
            return error_response(protocol, 400, f"cannot route {request.url}")
        return await super()._early(request, fault, key, protocol)

    async def _send(self, request: Any, payload: dict[str, Any], fault: Any) -> Any:
        return await super()._send(request, {**payload, "model": self.echo, "id": self.echo},
                                   fault)


def cli_output(*argv: str, capsys: Any) -> str:
    out = io.StringIO()
    cli.main(list(argv), out)
    return out.getvalue() + capsys.readouterr().err


def everything_shown(ledger: Path, session: Session, result: Any, capsys: Any) -> str:
    """Every place a key could leak to: the ledger's bytes (file and WAL, read before the
    session closes), reprs, results, receipts, exports and the command line's output."""
    parts = [path.read_bytes().decode("latin-1") for path in
             (ledger, ledger.with_name(ledger.name + "-wal")) if path.exists()]
    parts += [repr(session), repr(session.provider), repr(vars(session.provider)),
              repr(result), result.failure_report(), json.dumps(list(result.errors)),
              repr(session.ledger.attempts("keys")),
              json.dumps(session.ledger.export_receipts(), default=str)]
    session.close()
    for argv in (["status"], ["receipts", "keys", "--raw"], ["receipts", "keys", "--json"],
                 ["export", "--jsonl"], ["values", "keys"]):
        parts.append(cli_output(*argv, "--ledger", str(ledger), capsys=capsys))
    return "\n".join(parts)


def assert_absent(key: str, text: str) -> None:
    assert key not in text
    assert key[-12:] not in text  # nor a recognisable part of it


PROTOCOLS = {
    "openai": (lambda base: OpenAIProvider("gpt-4o-mini", base_url=base, api_key=""),
               "/v1/chat/completions", lambda srv: srv.base_url),
    "anthropic": (lambda base: AnthropicProvider("claude-haiku-4-5", base_url=base, api_key=""),
                  "/v1/messages", lambda srv: srv.anthropic_base_url),
}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("shape", SHAPES)
def test_a_key_in_the_base_urls_query_is_sent_there_and_shown_nowhere(
        shape: str, protocol: str, tmp_path: Path, capsys: Any) -> None:
    key = KEYS[shape]
    make, endpoint, base_of = PROTOCOLS[protocol]
    ledger = tmp_path / "ledger.sqlite"
    with EchoingServer(echo=key) as srv:
        session = Session(make(f"{base_of(srv)}?api-key={key}"), ledger=ledger, repairs=0,
                          replays=0)
        first = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA, pack=2,
                                  on_exhausted="return")
        result = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA, pack=2)
    # the path goes before the query: /v1/chat/completions?api-key=...
    assert srv.paths[0].startswith(f"{endpoint}?api-key=")
    assert all(path.split("?")[0] == endpoint for path in srv.paths)
    assert first.errors[0]["type"] == "provider_error" and "<redacted>" in str(first.errors)
    assert result.resolved
    receipts = session.ledger.attempts("keys")
    assert receipts[-1].model == "<redacted>"  # the server echoed the key as its model
    assert_absent(key, everything_shown(ledger, session, result, capsys))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("form", ["user:key", "key@"])
def test_a_key_in_the_base_urls_userinfo_is_shown_nowhere(
        shape: str, form: str, tmp_path: Path, capsys: Any) -> None:
    key = KEYS[shape]
    ledger = tmp_path / "ledger.sqlite"
    userinfo = f"user:{key}" if form == "user:key" else key
    with EchoingServer(echo=OTHER[shape]) as srv:
        base = srv.base_url.replace("http://", f"http://{userinfo}@")
        session = Session(OpenAIProvider("gpt-4o-mini", base_url=base, api_key=""),
                          ledger=ledger, repairs=0, replays=0)
        first = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
        result = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA)
    assert first.errors and result.resolved
    # a key-shaped model the server echoes is masked whole (the shape rule for model fields)
    assert session.ledger.attempts("keys")[-1].model == shown_name(OTHER[shape]) != OTHER[shape]
    shown = everything_shown(ledger, session, result, capsys)
    assert_absent(key, shown)
    assert_absent(OTHER[shape], shown)


@pytest.mark.parametrize("shape", SHAPES)
def test_rotating_a_key_in_the_url_query_keeps_stored_answers_reusable(shape: str) -> None:
    with LoopbackServer(SimulatedModel(answer=answer)) as srv:
        old = OpenAIProvider("gpt-4o-mini", base_url=f"{srv.base_url}?api-version=2&key=old1")
        session = Session(old)
        session.run_batch("keys", review_tasks(2), LABEL_SCHEMA)
        sent = srv.requests
        session.provider = OpenAIProvider(
            "gpt-4o-mini", base_url=f"{srv.base_url}?api-version=2&key={KEYS[shape]}")
        again = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA)
        assert again.calls == 0 and srv.requests == sent  # the same source: answers reused
        session.provider = OpenAIProvider("gpt-4o-mini",
                                          base_url=f"{srv.base_url}?api-version=3&key=old1")
        other = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA)
        assert other.calls == 2  # another API version is another source


@pytest.mark.parametrize("shape", SHAPES)
def test_an_unreachable_url_with_a_key_fails_without_showing_it(shape: str) -> None:
    key = KEYS[shape]
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    session = Session(OpenAIProvider("gpt-4o-mini", api_key="",
                                     base_url=f"http://u:{key}@127.0.0.1:{port}/v1?token={key}"),
                      transport_retries=0)
    with pytest.raises(ProviderError) as raised:
        session.run_batch("keys", review_tasks(1), LABEL_SCHEMA)
    shown = [str(raised.value), repr(raised.value),
             *traceback.format_exception(raised.value), repr(session), repr(session.provider)]
    assert "cannot reach" in shown[0]
    assert_absent(key, "\n".join(shown))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("make", [
    lambda key: OpenAIProvider(key, base_url="http://127.0.0.1:9/v1"),
    lambda key: CallableProvider(lambda call: "", model=key),
    lambda key: Session(CallableProvider(lambda call: ""), model=key),
    lambda key: Session("openai", model=key).provider,
    lambda key: SimulatedModel(model=key),
], ids=["OpenAIProvider", "CallableProvider", "Session", "named provider", "SimulatedModel"])
def test_a_key_given_as_the_model_is_refused_and_never_echoed(shape: str, make: Any) -> None:
    key = KEYS[shape]
    with pytest.raises(ProviderSetupError) as raised:
        make(key)
    shown = "\n".join([str(raised.value), *traceback.format_exception(raised.value)])
    assert "looks like an API key" in shown
    assert_absent(key, shown)


@pytest.mark.parametrize("shape", SHAPES)
def test_config_model_refuses_a_key_keeping_the_old_value(
        ip: Any, capsys: Any, caplog: Any, shape: str) -> None:
    from tests.test_magics import MODEL, ok, refused

    key = KEYS[shape]
    ok(ip, "%load_ext batchjson")
    ok(ip, MODEL)
    ok(ip, "%config BatchJson.provider = model")
    ok(ip, "%config BatchJson.model = 'gpt-4o-mini'")
    line = refused(ip, f"%config BatchJson.model = '{key}'", caplog)
    assert line.startswith("BatchJson.model: ") and "looks like an API key" in line
    assert ip.magics_manager.registry["BatchJson"].model == "gpt-4o-mini"
    assert ip.user_ns["batch_session"].model == "gpt-4o-mini"
    ip.run_cell("%config BatchJson")
    assert_absent(key, line + caplog.text + "".join(capsys.readouterr())
                  + repr(ip.user_ns["batch_session"]))


def test_config_ledger_url_is_refused_with_its_password_masked(ip: Any, caplog: Any) -> None:
    from tests.test_magics import MODEL, ok, refused

    key = KEYS["uuid"]
    ok(ip, "%load_ext batchjson")
    ok(ip, MODEL)
    line = refused(ip, f"%config BatchJson.ledger = 'postgresql://app:{key}@db/runs'", caplog)
    assert "was not applied" in line and "postgresql://app:<redacted>@db/runs" in line
    assert ip.magics_manager.registry["BatchJson"].ledger == ".batchjson/ledger.sqlite"
    assert_absent(key, line)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_key_shaped_task_id_is_data_and_shown_in_full(shape: str) -> None:
    """Shape rules are for provider and model names only: a UUID (or hex digest) task id is
    the user's data, shown whole in an identity error."""
    task_id = KEYS[shape]
    tasks = [{"task_id": task_id, "case_id": "gold-pair-078", "prompt": "p"}]

    def swapped(call: Any) -> str:
        return json.dumps({"items": [{"task_id": task_id, "case_id": "gold-pair-079",
                                      "verdict": "match"}]})

    session = Session(CallableProvider(swapped), repairs=0, replays=0)
    result = session.run_batch("ids", tasks, LABEL_SCHEMA, on_exhausted="return")
    error = result.errors[0]
    assert error["type"] == "identity" and task_id in error["message"]
    assert task_id in result.failure_report()
    assert session.ledger.attempts("ids")[0].task_ids == (task_id,)


@pytest.mark.parametrize("shape", SHAPES)
def test_a_key_in_both_the_url_and_api_key_is_refused_at_setup(shape: str) -> None:
    """OpenAI's key travels in the Authorization header, which a URL's user:password would
    fill too: one of the two must go, and neither is shown."""
    key = KEYS[shape]
    with pytest.raises(ProviderSetupError) as raised:
        OpenAIProvider("gpt-4o-mini", api_key=key, base_url=f"http://u:{key}@127.0.0.1:9/v1")
    assert "user and password" in str(raised.value)
    assert_absent(key, "\n".join(traceback.format_exception(raised.value)))


def test_a_ledger_url_that_cannot_be_reached_says_so_with_its_password_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = KEYS["sk-proj"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LedgerError) as raised:
        Session(CallableProvider(lambda call: ""), ledger=f"postgresql://app:{key}@db.invalid/runs")
    message = str(raised.value)
    assert "could not connect" in message and "postgresql://app:<redacted>@db.invalid/runs" in (
        message)
    assert_absent(key, "\n".join([message, *traceback.format_exception(raised.value)]))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["mysql://app:{key}@db/runs", "postgresql://app:{key}@db/runs"])
def test_a_ledger_url_batchjson_cannot_use_is_refused_with_its_password_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    key = KEYS["sk-proj"]
    monkeypatch.chdir(tmp_path)
    given = url.format(key=key)
    with pytest.raises(ConfigError) as raised:  # pathlib folds "//": still a URL, still masked
        Session(CallableProvider(lambda call: ""),
                ledger=Path(given) if given.startswith("postgresql") else given)
    message = str(raised.value)
    assert "cannot keep a ledger at" in message and "://<redacted>@db/runs" in message
    assert "as a str" in message
    assert_absent(key, "\n".join([message, *traceback.format_exception(raised.value)]))
    assert list(tmp_path.iterdir()) == []


def test_the_masking_rules_keep_to_their_places() -> None:
    key = KEYS["sk-proj"]
    secrets = Secrets([key], urls=["http://u:pw@h/v1?sig=s3cr3tsig&api-version=1"])
    said = secrets.mask(f"GET http://u:pw@h/v1?sig=s3cr3tsig&api-version=1 with {key}; "
                        f"Incorrect API key provided: sk-********{key[-4:]}.")
    assert key not in said and "pw@" not in said and "s3cr3tsig" not in said
    assert key[-4:] not in said and "api-version=1" in said
    assert public_url("https://a:b@h/v1?api-key=k&x=1") == "https://<redacted>@h/v1?api-key=<redacted>&x=1"
    for name in ("gpt-4o-mini", "claude-haiku-4-5", "ft:gpt-4o:org:custom:abc123", "llama3:8b"):
        assert not looks_like_key(name) and shown_name(name) == name
    for shape in SHAPES:
        assert looks_like_key(KEYS[shape]) and KEYS[shape] not in shown_name(KEYS[shape])
    assert repr(secrets).startswith("Secrets(<") and key not in repr(secrets)


@pytest.mark.parametrize("shape", SHAPES)
def test_provider_metadata_echoing_the_key_is_masked_and_the_answer_text_kept(
        shape: str) -> None:
    import asyncio

    from batchjson._providers.base import Call

    key = KEYS[shape]
    call = Call(tasks=({"task_id": "t1", "candidate_id": "c-1", "prompt": "p"},), prompt="p",
                system="", schema=LABEL_SCHEMA, attempt=0, kind="initial", request_key="k",
                mode="value")

    async def twice(provider: OpenAIProvider) -> Any:
        try:
            with pytest.raises(ProviderError):  # the server's first answer is an error
                await provider.complete(call)
            return await provider.complete(call)
        finally:
            await provider.aclose()

    with EchoingServer(echo=key, answers=lambda task: {"verdict": "match"}) as srv:
        provider = OpenAIProvider("gpt-4o-mini", base_url=f"{srv.base_url}?key={key}",
                                  response_format="text")
        reply = asyncio.run(twice(provider))
    assert reply.model == "<redacted>" and reply.extra["id"] == "<redacted>"
    assert reply.text and key not in repr(reply)


class AuthEchoingServer(LoopbackServer):
    """A debugging gateway: it refuses every request with a 401 whose body echoes the
    ``Authorization`` header it got, as some proxies do."""

    async def _early(self, request: Any, fault: Any, key: Any, protocol: str) -> Any:
        from batchjson.testing._wire import error_response

        return error_response(protocol, 401, "bad credentials "
                              + request.headers.get("Authorization", "<none>"))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("user", ["user", "", "us%C3%A9r"])
def test_url_credentials_never_reach_the_ledger_as_the_basic_auth_header_a_server_echoes(
        shape: str, user: str, tmp_path: Path, capsys: Any) -> None:
    """A URL's user:password travels as base64 in a basic-auth header; a server echoing that
    header put the credentials in the ledger, receipts and exports in that encoding."""
    import base64
    from urllib.parse import unquote

    key = KEYS[shape]
    ledger = tmp_path / "ledger.sqlite"
    with AuthEchoingServer(SimulatedModel(answer=answer)) as srv:
        base = srv.base_url.replace("http://", f"http://{user}:{key}@")
        session = Session(OpenAIProvider("gpt-4o-mini", base_url=base, api_key=""),
                          ledger=ledger, repairs=0, replays=0, transport_retries=0)
        result = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA, on_exhausted="return")
    encoded = base64.b64encode(f"{unquote(user)}:{key}".encode("latin-1")).decode()
    assert "Basic <redacted>" in result.failure_report()  # the server did echo it
    shown = everything_shown(ledger, session, result, capsys)
    for secret in (encoded, encoded.rstrip("="), key):
        assert_absent(secret, shown)


@pytest.mark.parametrize("name", ["opnai", "gpt 4o", "my model v2", "GPT-4o mini (2024)",
                                  "x1000000000000000000000000000005001",
                                  "build20240611a1b2c3d4e5f60718293a4b5c", "llama3" * 60])
def test_typos_spaced_names_and_build_ids_are_shown_as_written_not_taken_for_keys(
        name: str, ip: Any, caplog: Any) -> None:
    """The shape rule matches whole values shaped like a vendor's key, 32 or more hex digits or
    a UUID, nothing else: a typo masked as ``'opna'... (5 chars)`` cannot be seen to be fixed,
    and a model or source name with a space or a build id was refused as a key."""
    from batchjson._secrets import shown_value
    from tests.test_magics import MODEL, ok, refused

    assert not looks_like_key(name) and shown_name(name) == name
    assert shown_value(name) == repr(name)
    assert CallableProvider(lambda call: "", source=name, model=name).source == name
    assert SimulatedModel(model=name).model == name
    with pytest.raises(ConfigError) as raised:
        _ = Session(name).provider
    assert f"Unknown provider {name!r} from provider" in str(raised.value)
    assert repr(name) in repr(Session(name))
    ok(ip, "%load_ext batchjson")
    ok(ip, MODEL)
    ok(ip, f"%config BatchJson.model = {name!r}")
    assert ip.magics_manager.registry["BatchJson"].model == name
    line = refused(ip, f"%config BatchJson.provider = {name!r}", caplog)
    assert f"unknown provider name {name!r}" in line


def test_every_key_shape_is_still_taken_for_a_key_whole_and_only_whole() -> None:
    hex40 = "9f86d081884c7d659a2feaa0c55ad015b3bf4f1b"
    for key in [*KEYS.values(), *OTHER.values(), hex40, hex40.upper(),
                "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY", "gsk_" + "a1B2" * 10,
                "Bearer " + KEYS["sk-proj"], " " + KEYS["uuid"] + "\n"]:
        assert looks_like_key(key) and shown_name(key) != key, key
    for name in ("sk-1", "sk-", "hf_llama", KEYS["sk-proj"] + " is my key", "uuid " + KEYS["uuid"],
                 KEYS["32-hex"][:31], "gpt-4o-" + KEYS["32-hex"][:8]):
        assert not looks_like_key(name), name


class FragmentEchoingServer(LoopbackServer):
    """A provider refusing every request with a 401 that echoes part of a key, as OpenAI's
    ``Incorrect API key provided: sk-VKMIs***...wjh3`` does: here the part of another key
    than the one configured (a provider echoes the key it received, perhaps an old one)."""

    def __init__(self, echo: str) -> None:
        super().__init__(SimulatedModel(answer=answer))
        self.echo = echo

    async def _early(self, request: Any, fault: Any, key: Any, protocol: str) -> Any:
        from batchjson.testing._wire import error_response

        return error_response(protocol, 401, f"Incorrect API key provided: {self.echo}. You "
                              "can find your API key at https://platform.openai.com/account/"
                              "api-keys.", "invalid_api_key")


@pytest.mark.parametrize("shape", ["sk-proj", "sk-ant"])
@pytest.mark.parametrize("hidden", ["***\u2026", "*" * 40, "\u2022" * 8, "..."])
def test_a_401_echoing_part_of_another_key_is_never_stored_nor_shown(
        shape: str, hidden: str, tmp_path: Path, capsys: Any) -> None:
    """The echoed part matches no configured key, so the known-secret rule could not see it;
    the shape rule masks a key's fragment in a provider's error text whichever key it is."""
    other, head = OTHER[shape], OTHER[shape][:16]
    echo = f"{head}{hidden}{other[-4:]}"
    ledger = tmp_path / "ledger.sqlite"
    make = OpenAIProvider if shape == "sk-proj" else AnthropicProvider
    with FragmentEchoingServer(echo) as srv:
        base = srv.base_url if shape == "sk-proj" else srv.anthropic_base_url
        session = Session(make("gpt-4o-mini" if shape == "sk-proj" else "claude-haiku-4-5",
                               base_url=base, api_key=KEYS[shape]),
                          ledger=ledger, repairs=0, replays=0)
        result = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA, pack=2,
                                   on_exhausted="return")
    said = result.failure_report() + json.dumps(list(result.errors))
    assert "Incorrect API key provided: <redacted>." in said  # the provider's words, kept
    assert f"{hidden}{other[-4:]}" not in said
    receipts = session.ledger.attempts("keys")
    assert [r.status for r in receipts] == ["provider_error"]
    assert "<redacted>" in json.dumps(receipts[0].errors)
    shown = everything_shown(ledger, session, result, capsys)
    assert echo not in shown and head not in shown


def test_key_fragments_are_masked_in_provider_text_and_nothing_else_is() -> None:
    from batchjson._secrets import keys_masked

    for fragment in ("sk-VKMIs***\u2026wjh3", "sk-proj-****wjh3", "sk-ant-api03-AbCd\u2026wxyz",
                     "sk-abc...wxyz", OTHER["sk-proj"], OTHER["sk-ant"]):
        assert keys_masked(f"key {fragment}.") == "key <redacted>."
    for text in ("sk-1", "sk-", "task-abc***d", "gpt-4o-mini *** later", "mask-ant-***x",
                 "ask-me...", "a sk-abc."):
        assert keys_masked(text) == text


OLD_KEY = "sk-proj-" + "OLDKEY0123456789abcdefghijklmnopqrstuvwxyzABCD"
# What a provider or a gateway in front of it may answer with another key in it, and where.
LEAKY_ANSWERS = {
    "error.code": (401, lambda p: web_page(json.dumps({"error": {
        "type": "authentication_error", "message": "bad key", "code": OLD_KEY}}), 401)),
    "error.type": (401, lambda p: error_response_of(p, "bad key", kind=OLD_KEY)),
    "200 web page": (200, lambda p: web_page(f"<html>proxy: key {OLD_KEY} not allowed</html>")),
    "glued to a word": (401, lambda p: error_response_of(p, f"bad api_key_{OLD_KEY}")),
    "after =": (401, lambda p: error_response_of(p, f"bad key={OLD_KEY}.")),
    "Perplexity key": (401, lambda p: error_response_of(p, "bad key pplx-" + OLD_KEY[8:])),
    "bare hex": (401, lambda p: error_response_of(p, f"bad key {OTHER['32-hex']}")),
    "at the cut": (401, lambda p: error_response_of(p, "x" * 481 + " " + OLD_KEY)),
}


def error_response_of(protocol: str, message: str, **kwargs: Any) -> Any:
    from batchjson.testing._wire import error_response

    return error_response(protocol, 401, message, **kwargs)


def web_page(text: str, status: int = 200) -> Any:
    from aiohttp import web

    return web.Response(status=status, text=text, content_type="text/html")


class LeakyServer(LoopbackServer):
    """Every request is answered with one of :data:`LEAKY_ANSWERS`."""

    def __init__(self, leak: str) -> None:
        super().__init__(SimulatedModel(answer=answer))
        self.leak = leak

    async def _early(self, request: Any, fault: Any, key: Any, protocol: str) -> Any:
        return LEAKY_ANSWERS[self.leak][1](protocol)


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
@pytest.mark.parametrize("leak", sorted(LEAKY_ANSWERS))
def test_another_key_in_an_errors_code_a_web_page_or_glued_to_a_word_is_never_stored(
        leak: str, protocol: str, tmp_path: Path, capsys: Any) -> None:
    """The shape rule masked a key in an error's message only: one in its code or type (shown
    as ``[code]``), in a 200 web page, glued to a word, of another vendor or as bare hex, or
    cut short at the message's 500 characters, was stored and shown as sent."""
    ledger = tmp_path / "ledger.sqlite"
    make, _, base = PROTOCOLS[protocol]
    with LeakyServer(leak) as srv:
        session = Session(make(base(srv)), ledger=ledger, repairs=0, replays=0,
                          transport_retries=0)
        result = session.run_batch("keys", review_tasks(2), LABEL_SCHEMA, pack=2,
                                   on_exhausted="return")
    said = json.dumps(list(result.errors))
    assert f"HTTP {LEAKY_ANSWERS[leak][0]}" in said and "<redacted>" in said
    shown = everything_shown(ledger, session, result, capsys)
    for key in (OLD_KEY, OTHER["32-hex"]):
        assert_absent(key, shown)
        assert key[8:18] not in shown


def test_glued_keys_and_bare_hex_are_masked_in_provider_text_alone() -> None:
    from batchjson._secrets import keys_masked, provider_text_masked

    digest = OTHER["32-hex"]
    for glued in (f"api_key_{OLD_KEY}", f"key-{OLD_KEY}", f'"{OLD_KEY}"', f"k:{OLD_KEY}"):
        assert OLD_KEY not in provider_text_masked(f"bad {glued}."), glued
    assert provider_text_masked(f"key {digest}.") == "key <redacted>."
    assert provider_text_masked("pplx-" + "a1B2" * 8) == "<redacted>"
    for text in ("task-abc", "ask-me-again", "risk-assessment-framework-for-teams",
                 "see request ID req_" + digest, "task-" + "a1" * 3, "gpt-4o-mini"):
        assert provider_text_masked(text) == text, text
    assert keys_masked(f"digest {digest}") == f"digest {digest}"  # elsewhere hex is a digest


def test_an_answer_holding_key_shaped_text_is_stored_byte_for_byte() -> None:
    """Masking is for a provider's own words: the model's answer is kept as it returned it."""
    said = f"api_key_{OLD_KEY} {OTHER['32-hex']} pplx-{OLD_KEY[8:]}"

    def reply(call: Any) -> str:
        return json.dumps({"items": [{"task_id": t["task_id"], "candidate_id": t["candidate_id"],
                                      "verdict": "match", "note": said} for t in call.tasks]})

    session = Session(CallableProvider(reply), ledger=":memory:")
    result = session.run_batch("kept", review_tasks(2), LABEL_SCHEMA, pack=2)
    assert result.status == "resolved"
    assert all(said in receipt.raw for receipt in session.ledger.attempts("kept"))
