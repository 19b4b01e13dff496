"""A ledger in a PostgreSQL database as its users meet it: the provider's text kept byte for
byte (on both stores), the command line and the magics on a ``postgresql://`` URL, and the
URL's password never shown, whether the database answers or not."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchjson import CallableProvider, Session
from batchjson._errors import LedgerError
from batchjson._ledger import Ledger
from tests.helpers import ledger_rows

PASSWORD = "s3cret-Pw0rd"  # the test server trusts every local connection: any password works
NOTE_SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["match", "no_match"]},
                   "note": {"type": "string"}},
    "required": ["verdict", "note"],
}
TASKS = [{"task_id": "t1", "prompt": "Does it match?"}]
# What a model may send that a jsonb or text column would not keep as sent: keys in its own
# order, its own spacing and escapes, a NUL (escaped inside a string, bare outside one), NaN,
# text beyond ASCII.
REJECTED = '{"items": [{"verdict": NaN, "task_id": "t1", "note": "\x00"}]}\x00'
ACCEPTED = ('{ "items" :[\n\t{"note":"na\\u00efve\\u0000 \u2713 \u65e5\u672c \\ud83d\\ude00",'
            ' "verdict" : "match","task_id":"t1"} ]  }')


def with_password(url: str) -> str:
    return url.replace("postgres@", f"postgres:{PASSWORD}@", 1)


def masked(url: str) -> str:
    """The URL as batchjson shows it: who logs in, and with what, left out."""
    return url.replace(f"postgres:{PASSWORD}@", "<redacted>@", 1)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bj(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchjson", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_providers_text_is_kept_byte_for_byte_accepted_or_not(ledger_at):
    target = ledger_at()
    session = Session(CallableProvider(
        lambda call: REJECTED if call.kind == "initial" else ACCEPTED), ledger=target,
        repairs=1, replays=0)
    result = session.run_batch("raw", TASKS, NOTE_SCHEMA)
    session.close()
    assert result.values["t1"]["note"] == "na\u00efve\x00 \u2713 \u65e5\u672c \U0001f600"
    stored = ledger_rows(target, "SELECT raw, status FROM attempts ORDER BY id")
    assert stored == [(REJECTED, "rejected"), (ACCEPTED, "accepted")]
    held = Ledger(target)
    try:
        assert [r["raw"] for r in held.export_receipts("raw")] == [REJECTED, ACCEPTED]
    finally:
        held.close()


def test_the_command_line_reads_and_budgets_a_database_ledger_and_never_prints_its_password(
        postgres: Any, tmp_path: Path) -> None:
    url = with_password(postgres.database("cli_ledger"))
    session = Session(CallableProvider(lambda call: ACCEPTED), ledger=url)
    session.run_batch("raw", TASKS, NOTE_SCHEMA)
    session.close()
    runs = {
        "status": bj("status", "--ledger", url, cwd=tmp_path),
        "set": bj("budget", "--cost", "50", "--ledger", url, cwd=tmp_path),
        "show": bj("budget", "--json", "--ledger", url, cwd=tmp_path),
        "values": bj("values", "raw", "--ledger", url, cwd=tmp_path),
    }
    for name, done in runs.items():
        assert done.returncode == 0, (name, done.stderr)
        assert PASSWORD not in done.stdout + done.stderr, name
    assert runs["status"].stdout.splitlines()[0] == f"ledger {masked(url)}"
    assert runs["set"].stdout.startswith("ledger cost budget $50.00: $0 spent")
    shown = json.loads(runs["show"].stdout)
    assert shown["ledger"] == masked(url)
    assert shown["budget"]["cost"] == 50 and shown["budget"]["reserved"] == 0
    assert json.loads(runs["values"].stdout.splitlines()[0])["task_id"] == "t1"
    assert Ledger(url).budget()["cost"] == 50  # every runner on the database now holds it


def test_a_database_that_does_not_answer_is_named_without_its_password_before_any_call(
        tmp_path: Path) -> None:
    url = f"postgresql://batch:{PASSWORD}@127.0.0.1:{closed_port()}/ledger"
    done = bj("status", "--ledger", url, cwd=tmp_path)
    assert done.returncode == 3 and PASSWORD not in done.stdout + done.stderr
    assert "could not connect (is the server running, and the URL right?)" in done.stderr
    sent = []
    with pytest.raises(LedgerError) as raised:
        Session(CallableProvider(lambda call: sent.append(call) or ACCEPTED),
                ledger=url).run_batch("raw", TASKS, NOTE_SCHEMA)
    assert PASSWORD not in str(raised.value) and "127.0.0.1" in str(raised.value)
    assert sent == []


def test_config_ledger_to_a_database_opens_a_session_there_and_shows_it_masked(
        ip: Any, postgres: Any, caplog: Any) -> None:
    url = with_password(postgres.database("magic_ledger"))
    ip.run_cell("%load_ext batchjson")
    ip.run_cell("from batchjson import CallableProvider\n"
                f"model = CallableProvider(lambda call: {ACCEPTED!r})")
    ip.run_cell("%config BatchJson.provider = model")
    assert ip.run_cell(f"%config BatchJson.ledger = {url!r}").success
    session = ip.user_ns["batch_session"]
    assert session.ledger.store.url == url
    result = ip.run_cell(f"run_batch('raw', {TASKS!r}, {NOTE_SCHEMA!r})")
    assert result.success and Ledger(url).spend()["calls"] == 1
    status = ip.run_cell("%batch_status").result
    assert PASSWORD not in repr(status) + str(status._repr_html_())
    assert masked(url) in repr(status)
    unreachable = f"postgresql://batch:{PASSWORD}@127.0.0.1:{closed_port()}/ledger"
    caplog.clear()
    assert ip.run_cell(f"%config BatchJson.ledger = {unreachable!r}").success
    refusal = " ".join(r.getMessage() for r in caplog.records)
    assert "was not applied: LedgerError" in refusal and PASSWORD not in refusal
    assert ip.user_ns["batch_session"] is session  # the working session stays
