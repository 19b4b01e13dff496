"""Rate limits learnt are kept in the ledger per provider account and model: a re-run, a new
session or another process on the same ledger starts paced, with no call sent alone to learn
them; a fresh ledger still sends one. The ledger never holds the key they were learnt with."""

from __future__ import annotations

import asyncio

from batchjson import Ledger, Session
from batchjson._replay.pacing import LIMITS_TRUSTED, HostShare, Pacer, RateLimits
from batchjson.testing import Limits, LoopbackServer
from tests.helpers import KEY, LABEL_SCHEMA, ledger_rows, ledger_write, openai, review_tasks

LATENCY = 0.4  # each answer's wait: a call sent alone holds the next ones back this long
CAP = {"max_completion_tokens": 60}


def arrivals_span(srv: LoopbackServer, session: Session, name: str, n: int = 6) -> float:
    """Seconds between the first and the last of a run's ``n`` calls reaching the server: under
    a tenth of the latency when they go together, the latency or more behind a lone first."""
    srv.reset_stats()
    result = session.run_batch(name, review_tasks(n, case=name), LABEL_SCHEMA)
    assert result.status == "resolved" and srv.requests == n
    return srv.last_at - srv.first_at


def test_a_second_session_on_the_same_ledger_sends_no_lone_first_call(ledger_at):
    with LoopbackServer(latency=LATENCY, rate_limits=Limits(6000, 600_000, 300_000)) as srv:
        first = Session(openai(srv, extra_body=CAP), ledger=ledger_at(), concurrency=8)
        assert arrivals_span(srv, first, "one") >= LATENCY  # a fresh ledger: one call alone
        first.close()
        second = Session(openai(srv, extra_body=CAP), ledger=ledger_at(), concurrency=8)
        assert arrivals_span(srv, second, "two") < LATENCY / 4  # all six at once
        assert second.pacer.learnt == RateLimits(6000, 900_000)
        second.close()


def test_kept_limits_are_per_account_and_model_and_hold_no_secret(ledger_at):
    other_key = "sk-test-ANOTHERSECRET-9876543210fedcba"
    with LoopbackServer(latency=LATENCY, rate_limits=Limits(6000, 600_000, 300_000)) as srv:
        for key, model in ((KEY, "gpt-4o-mini"), (other_key, "gpt-4o-mini"), (KEY, "gpt-4.1")):
            session = Session(openai(srv, api_key=key, model=model, extra_body=CAP),
                              ledger=ledger_at())
            session.run_batch(f"{model}-{key[-4:]}", review_tasks(2, case=key[-4:] + model),
                              LABEL_SCHEMA)
            session.close()
        # another key on the same server is another account: it learns with a call alone
        third = Session(openai(srv, api_key="sk-test-THIRD-00000000000000000", extra_body=CAP),
                        ledger=ledger_at(), concurrency=8)
        assert arrivals_span(srv, third, "third") >= LATENCY
        third.close()
    rows = ledger_rows(ledger_at(), "SELECT * FROM rate_limits")
    assert len(rows) == 4 and len({(r[0], r[1]) for r in rows}) == 4
    assert {r[1] for r in rows} == {"gpt-4o-mini", "gpt-4.1"}
    assert len({r[0] for r in rows}) == 3  # three keys, one server
    assert all(r[2:4] == (6000, 900_000) for r in rows)
    text = repr(rows)
    for key in (KEY, other_key):
        assert key not in text and key[3:] not in text and key[-12:] not in text
    assert all(srv.base_url in r[0] for r in rows)


def test_limits_a_provider_does_not_report_are_kept_as_absent(ledger_at):
    """An answer without rate-limit headers says the provider reports none: kept as such, a
    later session neither sends a call alone nor paces."""
    ledger = Ledger(ledger_at())
    account = ("openai http://127.0.0.1:1/v1 0123456789abcdef", "local-model")

    async def one_answer_without_headers(pacer: Pacer, hosts: HostShare) -> None:
        pacer.learn()
        await pacer.acquire(1, 10)
        pacer.release(answered=True)
        learnt = hosts.to_keep(account)
        assert learnt == RateLimits()
        with ledger.store.transaction(calls=True) as tx:
            hosts.keep(tx, account, learnt)
        assert hosts.to_keep(account) is None  # written once

    first = Pacer()
    asyncio.run(one_answer_without_headers(first, HostShare(ledger.store, "s1", first)))
    later = Pacer()
    later.learn()
    assert later._room() == 1  # a fresh pacer would send its first call alone
    with ledger.store.transaction(calls=True) as tx:
        HostShare(ledger.store, "s2", later).recall(tx, account)
    assert later.heard and later._room() > 1 and later.tokens_per_minute is None
    ledger.close()


def test_limits_kept_too_long_ago_are_learnt_again(ledger_at):
    account = ("openai https://api.openai.com/v1 0123456789abcdef", "gpt-4o-mini")
    ledger_write(ledger_at(), ("INSERT INTO rate_limits VALUES (?, ?, ?, ?, ?)",
                               (*account, 500, 200_000, 0.0)))
    ledger = Ledger(ledger_at())
    pacer = Pacer()
    pacer.learn()
    with ledger.store.transaction(calls=True) as tx:
        HostShare(ledger.store, "s", pacer).recall(tx, account)
        age = ledger.store.rate_limits(tx, *account)[2]
    ledger.close()
    assert age > LIMITS_TRUSTED
    assert not pacer.heard and pacer.learnt == RateLimits()  # one call alone, as on a fresh one
