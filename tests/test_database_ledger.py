"""A ledger in a PostgreSQL database as its users meet it: the provider's text kept byte for
byte (on both stores), the command line and the magics on a ``postgresql://`` URL, and the
URL's password never shown, whether the database answers or not."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from batchjson import CallableProvider, Ledger, RunSpec, Session
from batchjson._errors import LedgerError
from batchjson._secrets import public_url
from tests.helpers import LABEL_SCHEMA, items_reply, ledger_rows, review_tasks

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
    """The URL as batchjson shows it: who logs in kept (no secret), the password left out."""
    return url.replace(f"postgres:{PASSWORD}@", "postgres:<redacted>@", 1)


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


def test_tasks_beyond_ascii_with_quotes_braces_and_backslashes_are_kept_and_resume_for_free(
        ledger_at):
    """Requests, their seen content and accepted items are written many to a statement (on
    PostgreSQL, as arrays in binary form): each text comes back as it went in, so a re-run finds
    every request answered and asks nothing."""
    odd = ['caf\u00e9 "quoted", {braced}', "back\\slash \\\" NULL", "\u65e5\u672c\u2028 \U0001f600",
           "NULL", ""]
    tasks = [{"task_id": f"t{i}-{text[:6]}", "case_id": text, "prompt": f"label {text}"}
             for i, text in enumerate(odd)]

    def model(call):
        return json.dumps({"items": [{"task_id": t["task_id"], "case_id": t["case_id"],
                                      "label": t["prompt"][::-1]} for t in call.tasks]})

    schema = {"type": "object", "properties": {"label": {"type": "string"}},
              "required": ["label"]}
    target = ledger_at()
    for pack, calls in ((2, 3), (2, 0)):
        session = Session(CallableProvider(model), ledger=target)
        result = session.run_batch("odd", tasks, schema, pack=pack,
                                   identity=["task_id", "case_id"])
        session.close()
        assert result.status == "resolved" and result.calls == calls
        assert dict(result.values) == {t["task_id"]: {"label": t["prompt"][::-1]}
                                       for t in tasks}


def test_a_write_the_server_refuses_mid_group_leaves_the_sessions_later_runs_working(
        postgres, monkeypatch, caplog):
    """PostgreSQL refuses an accepted return's statement in its pipelined group (injected: a
    NUL in its task ids, which the tasks' check now refuses before any call), in two runs,
    each tried in its group and again alone: those runs fail with a LedgerError, and the
    session's later runs and its close work. Fault: the failed pipeline's connection went back
    to the pool with psycopg counting as prepared a statement the server had dropped, so every
    later run, and close(), failed."""
    from batchjson._ledger.postgres import PostgresStore

    accept, refused = PostgresStore._accept_call, []

    def refused_twice_a_run(self, tx, attempt_id, batch_id, request_key, items, *rest):
        if len(refused) < 4:
            refused.append(request_key)
            items = {f"{task_id}\x00": item for task_id, item in items.items()}
        return accept(self, tx, attempt_id, batch_id, request_key, items, *rest)

    monkeypatch.setattr(PostgresStore, "_accept_call", refused_twice_a_run)
    session = Session(CallableProvider(items_reply), ledger=postgres.database("refused_mid_group"))
    for tasks in (review_tasks(1), review_tasks(1)):  # a retry before the cause is found
        with pytest.raises(LedgerError, match="could not be written"):
            session.run_batch("refused", tasks, LABEL_SCHEMA)
    result = session.run_batch("later", review_tasks(6)[2:], LABEL_SCHEMA)
    assert result.status == "resolved" and result.calls == 4
    session.close()
    # the LedgerError says it all: no pool warning of a connection closed under it
    assert not [r for r in caplog.records if r.name.startswith("psycopg")], caplog.text


def test_a_calls_receipt_and_claim_are_committed_before_it_is_sent_on_either_store(ledger_at):
    """What another reader sees while the call is out: its receipt in flight, holding the
    request's claim. Fault: the writes of a group (BEGIN, receipts, claims, COMMIT, sent
    together to save round trips) committed only after the call went out, so a crash
    mid-call would leave no evidence that a call may have been paid for."""
    seen = []

    def model(call):
        seen.append(ledger_rows(ledger_at(), "SELECT a.status, CASE WHEN c.owner IS NULL THEN 0 "
                                "ELSE 1 END FROM attempts a LEFT JOIN claims c ON "
                                "c.attempt_id = a.id"))
        return items_reply(call)

    session = Session(CallableProvider(model, source="a reader"), ledger=ledger_at())
    result = session.run_batch("r", review_tasks(1), LABEL_SCHEMA)
    session.close()
    assert result.status == "resolved" and seen == [[("in_flight", 1)]]


def _traced_calls_transactions(store: Any, begin: Any = lambda: None) -> list[list[list[bytes]]]:
    """From now on, each calls transaction of ``store`` as libpq traces it: its messages, each
    split into its tab-separated fields (BEGIN is sent before the trace starts); ``begin`` is
    called as each starts."""
    traces: list[list[list[bytes]]] = []
    calls_transaction = store._calls_transaction

    @contextlib.contextmanager
    def traced():
        begin()
        with tempfile.TemporaryFile("w+b") as log:
            with calls_transaction() as tx:
                tx.pgconn.trace(log.fileno())
                yield tx
            tx.pgconn.untrace()
            log.seek(0)
            traces.append([line.split(b"\t") for line in log.read().splitlines()
                           if line.count(b"\t") > 2])

    store._calls_transaction = traced
    return traces


def test_a_group_of_claims_or_accepted_returns_costs_one_round_trip_on_postgresql(postgres):
    """Counted in libpq's protocol trace, never timed: each transaction of the calls' writes
    waits on the server once, however many calls it holds. Fault: psycopg's transaction block
    waiting as it begins and ends, or a claim whose answer is read before COMMIT."""
    session = Session(CallableProvider(items_reply, source="counted"),
                      ledger=postgres.database("round_trips"), concurrency=8)
    traces = _traced_calls_transactions(session.ledger.store)
    result = session.run_batch("r", review_tasks(40), LABEL_SCHEMA, pack=1)
    session.close()
    assert result.status == "resolved" and result.calls == 40
    waits = []
    for trace in traces:
        sides = [message[1] for message in trace]  # F: to the server, B: from it
        waits.append(sum(pair == (b"F", b"B") for pair in zip(sides, sides[1:], strict=False)))
    # the first and the last: the run joining and leaving the live hosts (reads of their rows)
    assert len(waits) < 40 and set(waits[1:-1]) == {1}, str(waits)


def test_a_group_of_calls_is_claimed_in_one_statement_and_admitted_in_two_on_postgresql(
        postgres, monkeypatch):
    """Counted in libpq's protocol trace: however many calls a transaction of their writes
    holds, their claims and receipts are one statement, and their accepted returns two (the
    requests' admission locks, then the rows). Fault: a statement for each call, so the work
    of client and server grows with the group."""
    from batchjson._ledger import postgres as pg

    session = Session(CallableProvider(items_reply, source="counted"),
                      ledger=postgres.database("statements"), concurrency=8)
    groups: list[dict[str, int]] = []
    for name in ("_Claims", "_Accepts"):
        added = getattr(pg, name).add

        def counting(self, *args, added=added, name=name):
            groups[-1][name] += 1
            return added(self, *args)

        monkeypatch.setattr(getattr(pg, name), "add", counting)
    traces = _traced_calls_transactions(
        session.ledger.store, begin=lambda: groups.append({"_Claims": 0, "_Accepts": 0}))
    result = session.run_batch("r", review_tasks(40), LABEL_SCHEMA, pack=1)
    session.close()
    assert result.status == "resolved" and result.calls == 40
    for group, trace in zip(groups, traces, strict=True):  # COMMIT too (BEGIN: before the trace)
        group["statements"] = sum(m[1] == b"F" and m[3].startswith(b"Bind") for m in trace)
    calls = [g for g in groups if g["_Claims"] or g["_Accepts"]]  # not joining the hosts
    assert sum(g["_Claims"] for g in calls) == sum(g["_Accepts"] for g in calls) == 40
    assert max(g["_Claims"] for g in calls) >= 4 and max(g["_Accepts"] for g in calls) >= 4
    for group in calls:
        assert group["statements"] == 1 + bool(group["_Claims"]) + 2 * bool(
            group["_Accepts"]), groups


def test_a_group_of_claims_or_returns_reads_the_postgresql_ledger_by_key_never_by_scan(postgres):
    """The plans the server makes of the grouped claim and the grouped accepted returns (for
    these values, and the generic plan a connection keeps), on a ledger of thousands of rows
    not yet analyzed: every table that grows is read through an index, so a group costs the
    same on a ledger a thousand times larger. Fault: statements that join the group's keys to
    whole tables, which the planner reads by sequential scan (requests, attempts, claims) for
    every group."""
    import psycopg

    from batchjson._ledger import postgres as pg

    url = postgres.database("by_key")
    session = Session(CallableProvider(items_reply, source="planned"), ledger=url,
                      concurrency=64)
    assert session.run_batch("r", review_tasks(1500), LABEL_SCHEMA, pack=1).calls == 1500
    session.close()
    with psycopg.connect(url, autocommit=True) as db:  # no ANALYZE yet, as in a first run
        keys = [r[0] for r in db.execute("SELECT key FROM requests LIMIT 8")]
        attempts = db.execute("SELECT id, batch_id, request_key FROM attempts LIMIT 8").fetchall()
        claim = {c: [None] * 8 for c in pg._GROUP_COLUMNS} | {"request_key": keys}
        statements = {
            "claims": (pg.CLAIMS, [claim[c] for c in pg._GROUP_COLUMNS] + [30.0]),
            "returns": (pg.ACCEPTS, [[a[0] for a in attempts], [a[1] for a in attempts],
                                     [a[2] for a in attempts]] + [[None] * 8] * 9 + [
                [a[0] for a in attempts], ["t"] * 8, ["{}"] * 8, pg._FIRST])}
        generic = db.info.server_version >= 160000  # EXPLAIN (GENERIC_PLAN): what runs
        for name, (sql, args) in statements.items():
            explained = [("EXPLAIN " + sql, args)] + [
                ("EXPLAIN (GENERIC_PLAN) " + _numbered(sql), None)] * generic
            for explain, bound in explained:
                plan = "\n".join(r[0] for r in db.execute(explain, bound))
                scans = re.findall(r"Seq Scan on (\w+)", plan)  # the one-row budget may be
                assert set(scans) <= {"budget"}, f"{name}:\n{plan}"


def _numbered(sql: str) -> str:
    """``sql`` with its parameters numbered as the server reads them ($1, $2, ...)."""
    count = iter(range(1, 1000))
    return re.sub(r"%[bs]", lambda _: f"${next(count)}", sql)


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


def test_status_suggests_commands_with_the_ledger_url_user_kept_and_only_its_password_masked(
        postgres: Any, tmp_path: Path) -> None:
    assert public_url("postgresql://alice@localhost/db", user=False) == (
        "postgresql://alice@localhost/db")
    assert public_url("postgresql://alice:secret@host/db?sslmode=require", user=False) == (
        "postgresql://alice:<redacted>@host/db?sslmode=require")
    bare = postgres.database("hint_ledger")  # postgresql://postgres@...: no password
    Session(CallableProvider(lambda call: ACCEPTED), ledger=bare).run_batch(
        "raw", TASKS, NOTE_SCHEMA)
    for url, expected in ((bare, bare), (with_password(bare), masked(with_password(bare)))):
        done = bj("status", "--ledger", url, cwd=tmp_path)
        assert done.returncode == 0 and PASSWORD not in done.stdout + done.stderr, done.stderr
        hints = done.stdout.split("next:")[1]
        assert f"values raw --csv --ledger {shlex.quote(expected)} " in hints, done.stdout
        assert "//<redacted>@" not in hints  # the user name is shown, to be copied


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


def test_a_server_that_dies_mid_run_stops_it_and_a_rerun_after_its_restart_pays_nothing_twice(
        ) -> None:
    from tests.postgres_server import start_postgres

    server = start_postgres()  # its own: this test stops it
    try:
        url = with_password(server.database("crash"))
        tasks = review_tasks(12)
        sent: list[str] = []
        after_crash: list[str] = []

        async def model(call: Any) -> str:
            (after_crash if server.port < 0 else sent).append(call.tasks[0]["task_id"])
            if len(sent) == 6 and server.port > 0:
                server.crash()
                server.port = -server.port  # calls started from here on are counted apart
            await asyncio.sleep(0.01)
            return items_reply(call)

        session = Session(CallableProvider(model, source="m"), ledger=url, concurrency=3)
        with pytest.raises(LedgerError) as raised:
            session.run(RunSpec("r", tasks, LABEL_SCHEMA, pack=1))
        assert after_crash == []  # no call opened once the ledger could not be written
        assert str(raised.value).startswith(f"ledger ({masked(url)}): a write failed; the run "
                                            "stopped before any further call")
        server.port = -server.port
        server.restart()
        kept = {key for key, in ledger_rows(url, "SELECT request_key FROM attempts "
                                                 "WHERE status = 'accepted'")}
        rerun: list[str] = []
        again = Session(CallableProvider(lambda call: rerun.append(call.tasks[0]["task_id"])
                                         or items_reply(call), source="m"), ledger=url)
        result = again.run(RunSpec("r", tasks, LABEL_SCHEMA, pack=1))
        assert result.status == "resolved" and len(result.values) == 12
        assert len(rerun) == 12 - len(kept)  # what committed before the crash is never re-paid
        per_key = ledger_rows(url, "SELECT request_key, COUNT(*) FROM attempts WHERE status = "
                              "'accepted' GROUP BY request_key")
        assert len(per_key) == 12 and {n for _, n in per_key} == {1}
        again.close()
    finally:
        server.stop()


def test_a_postgresql_ledger_renders_each_statement_once_however_many_revisions_it_holds(
        postgres):
    """A long session runs many revisions: no value of one is spelled into a statement, so the
    statements rendered (and prepared on each connection) do not grow with them."""
    from batchjson._ledger.store_base import _marked

    session = Session(CallableProvider(items_reply, source="counted"),
                      ledger=postgres.database("revisions"))
    store = session.ledger.store
    sizes = []
    for n in range(4):
        tasks = review_tasks(3 + n)  # another revision of the batch each time
        result = session.run_batch("grown", tasks, LABEL_SCHEMA, pack=1)
        assert result.status == "resolved"
        revision = max(session.ledger.revisions("grown"), key=lambda r: r.number)
        keys = [row["key"] for row in store._read(
            "SELECT key FROM requests WHERE revision_id = ?", (revision.id,))]
        assert len(store.requests_by_keys(keys, revision.id)) == 3 + n
        assert store.job_window(keys, revision.id)[1] == set(keys)  # every one accepted
        sizes.append(_marked.cache_info().currsize)
    session.close()
    assert sizes[1:] == sizes[1:2] * 3, sizes
