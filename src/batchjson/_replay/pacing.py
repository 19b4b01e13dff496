"""Pacing: keep every run of a session under the provider's requests and tokens per minute (a
semaphore alone cannot: retries fired into a closed rate window burn money). One :class:`Pacer` per
session: two leaky buckets (aiolimiter), a 429 pausing every call and halving the calls in flight
(docs/providers.md, "Rate limits"); the hosts of a ledger divide the limits (:class:`HostShare`)."""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from aiolimiter import AsyncLimiter

from .._checks import is_whole
from .._errors import ConfigError, LedgerError
from .._ledger.store import Store
from .._ledger.store_base import Tx
from .._ledger.store_calls import Owner
from .._providers.ratelimits import Reported, reported

Turn = tuple[float, int]  # when a call's turn was taken, and from which build of the buckets
HEADROOM = 0.98  # pace a little under the limit: network jitter bunches arrivals
PLENTY = 4  # bursts left of each limit for which the next answers' counts go unread
_KEYS = {"requests_per_minute": "requests_per_minute", "rpm": "requests_per_minute",
         "tokens_per_minute": "tokens_per_minute", "tpm": "tokens_per_minute"}


@dataclass(frozen=True)
class RateLimits:
    """The limits a session paces to; None means not set (learnt from headers, or unpaced)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and not is_whole(value, 1):
                raise ConfigError(f"rate_limits {name} must be a whole number >= 1 (or None to "
                                  f"learn it from the provider's headers), got {value!r}; e.g. "
                                  "rate_limits={'requests_per_minute': 500, "
                                  "'tokens_per_minute': 200_000}")

    @classmethod
    def of(cls, value: Any) -> RateLimits:
        """From None, a RateLimits, a mapping (``requests_per_minute`` / ``rpm``,
        ``tokens_per_minute`` / ``tpm``) or a pair ``(rpm, tpm)``."""
        if value is None:
            return cls()
        if isinstance(value, RateLimits):
            return value
        if isinstance(value, Mapping):
            unknown = [k for k in value if k not in _KEYS]
            if unknown:
                raise ConfigError(f"rate_limits has unknown key(s) {unknown}; use "
                                  "requests_per_minute (rpm) and tokens_per_minute (tpm)")
            return cls(**{_KEYS[k]: v for k, v in value.items()})
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(*value)
        raise ConfigError(f"rate_limits must be a mapping such as {{'requests_per_minute': 500, "
                          f"'tokens_per_minute': 200_000}} or a pair (rpm, tpm), got {value!r}")

    def __bool__(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


def _bucket(per_minute: float, slice_seconds: float, least: float) -> AsyncLimiter:
    """Drains at ``per_minute`` less headroom, a burst of half a slice but at least ``least``."""
    rate = per_minute * HEADROOM / 60.0
    burst = max(least, rate * slice_seconds / 2)
    return AsyncLimiter(burst, burst / rate)


class Pacer:
    """One session's pacing of requests and tokens per minute and of the calls in flight."""

    def __init__(self, limits: RateLimits | None = None, concurrency: int = 16, *,
                 slice_seconds: float = 1.0) -> None:
        self.limits = limits or RateLimits()
        self.learnt = RateLimits()  # what the provider's headers said, when the user set none
        self.slice_seconds = slice_seconds
        self.ceiling = concurrency
        self.allowed = float(concurrency)  # calls allowed in flight: halved by a 429
        self.in_flight = 0
        self.refused = 0  # 429s seen
        self.paused = 0.0  # seconds every call was held by 429s and low remaining counts
        self._requests: AsyncLimiter | None = None
        self._tokens: AsyncLimiter | None = None
        self._largest = 1  # the largest token count acquired: the token bucket's least burst
        # what the provider counted and the buckets did not: calls sent before there was one
        # (the lone call learning the limits), what a bucket replaced by new limits held
        self._owed_requests, self._owed_tokens = Owed(), Owed()
        self._open_at = 0.0  # loop time before which no call is sent
        self._short_until = -1.0  # the end of a pause short remaining counts asked for
        self._quiet_until = -1.0  # answers before then are not read (see observe)
        self._waiting: list[asyncio.Future[None]] = []
        # turns taken and not sent: (when, from which buckets, tokens) each; only those from the
        # buckets in force, taken within a slice, are spent (see unspent)
        self._unspent: deque[tuple[float, int, int]] = deque()
        self._built = 0  # the buckets' build: new limits or a new share make new ones
        self._learning = False  # one call alone until the first answer: see learn()
        self.heard = False  # the provider has said its limits (or that it reports none)
        self.hosts = 1  # the live hosts of the ledger, dividing the limits between them
        self._build()

    @property
    def requests_per_minute(self) -> int | None:
        return self.limits.requests_per_minute or self.learnt.requests_per_minute

    @property
    def tokens_per_minute(self) -> int | None:
        return self.limits.tokens_per_minute or self.learnt.tokens_per_minute

    def _build(self, requests: bool = True, tokens: bool = True) -> None:
        """New buckets for the limits named (one starts empty: only a changed limit gets one)."""
        rpm, tpm = self.requests_per_minute, self.tokens_per_minute
        self._built += 1
        self._unspent.clear()
        self._quiet_until = -1.0  # new buckets: the next answer is read against them
        if requests:
            self._owed_requests.carry(self._requests)
            self._requests = _bucket(rpm / self.hosts, self.slice_seconds, 1) if rpm else None
        if tokens:
            self._owed_tokens.carry(self._tokens)
            self._tokens = (_bucket(tpm / self.hosts, self.slice_seconds,
                                    min(self._largest, tpm)) if tpm else None)

    def set_ceiling(self, concurrency: int) -> None:
        """The session's concurrency: the most calls in flight, to which a 429's cut climbs."""
        self.allowed = float(concurrency) if self.allowed >= self.ceiling else min(
            self.allowed, float(concurrency))
        self.ceiling = concurrency

    def learn(self) -> None:
        """With no limits set, the session's first call goes alone: its headers say the limits
        before a burst meets them blind."""
        self._learning = not self.limits and not self.heard

    def recall(self, learnt: RateLimits) -> None:
        """Limits the ledger kept from an earlier answer on this account and model: paced to from
        the first call, none sent alone; headers still correct them."""
        self._learning, self.heard = False, True
        self._set(self.limits, learnt)

    def set_limits(self, limits: RateLimits) -> None:
        """New limits from the user; what was learnt stays for the limits left unset."""
        self._learning = self._learning and not limits
        self._set(limits, self.learnt)

    def share(self, hosts: int) -> None:
        """``hosts`` sessions are live on the ledger: this one paces to one ``hosts``-th of each."""
        hosts = max(1, hosts)
        if hosts != self.hosts:
            self.hosts = hosts
            self._build()

    # -- the interface a shared pacer would implement -------------------------------------------
    async def acquire(self, requests: int = 1, tokens: int = 0, *, probe: bool = False) -> Turn:
        """Wait for no pause in force, a slot in flight and room in both buckets for ``tokens``:
        the turn taken, for :meth:`unspent` if the call is not sent. Pair with :meth:`release`.
        ``probe``: the call finding out whether an unreachable host is back waits for no slot,
        since the calls holding them wait for it."""
        loop = asyncio.get_running_loop()
        if self.in_flight >= self._room() and not probe:
            await self._room_free(loop)
        self.in_flight += 1
        try:
            if loop.time() < self._open_at:
                await self._pause_over(loop)
            kept = self._take_unspent(loop.time()) if self._unspent else None
            if kept is None:
                built = self._built
                await self._take(loop, requests, tokens)
                return loop.time(), built
            left, turn = kept
            if tokens > left:  # a turn taken already: only the tokens it lacks
                await self._take(loop, 0, tokens - left)
            return turn
        except BaseException:
            self._leave()
            raise

    def waits(self) -> bool:
        """Whether a call now would wait: a pause, no slot in flight, or a bucket short of a turn
        (the tokens of the largest call so far) with no unspent turn to take instead."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._open_at or self.in_flight >= self._room():
            return True
        short = ((self._requests is not None and not self._requests.has_capacity(1))
                 or (self._tokens is not None and not self._tokens.has_capacity(
                     min(self._largest, self._tokens.max_rate))))
        return short and not self._fresh_unspent(loop.time())

    async def turn(self, tokens: int) -> None:
        """A call's turn, taken before its request is chosen and kept for it (:meth:`unspent`):
        where other runners work on the same requests, one chosen first and then kept waiting
        for its turn is often done elsewhere when the turn comes."""
        loop = asyncio.get_running_loop()
        while True:  # room in flight (a lone first call, fewer after a 429), and no pause
            if self.in_flight >= self._room():
                await self._room_free(loop)
            if loop.time() >= self._open_at:
                break
            await self._pause_over(loop)
        if self._fresh_unspent(loop.time()) or (self._requests is None and self._tokens is None):
            return  # a turn not sent (the next acquire takes it), or no bucket to take from
        built = self._built
        await self._take(loop, 1, tokens)
        self.unspent(tokens, (loop.time(), built))

    async def _take(self, loop: asyncio.AbstractEventLoop, requests: int, tokens: int) -> None:
        """Wait out any pause, then for room in both buckets (first for what was sent before a
        bucket was: the provider counted it)."""
        if loop.time() < self._open_at:
            await self._pause_over(loop)
        if tokens > self._largest:
            self._largest = tokens
            tpm = self.tokens_per_minute
            if self._tokens is not None and tpm and min(tokens, tpm) > self._tokens.max_rate:
                self._build(requests=False)  # a burst of at least one such request
        await self._spend("_requests", self._owed_requests, requests, loop)
        await self._spend("_tokens", self._owed_tokens, tokens, loop)

    async def _spend(self, name: str, owed: Owed, amount: int,
                     loop: asyncio.AbstractEventLoop) -> None:
        """``amount`` from the bucket ``name`` in force now, after what that bucket is owed; with
        no bucket, owed to the one made once the limit is known."""
        bucket = getattr(self, name)
        if bucket is None:
            owed.sent(loop.time(), amount)
            return
        level = owed.level(loop.time(), bucket.max_rate / bucket.time_period) if owed else 0
        parts = [bucket.max_rate] * int(level // bucket.max_rate) + [level % bucket.max_rate]
        for part in (*parts, min(amount, bucket.max_rate)):
            if part:
                await bucket.acquire(part)

    async def _room_free(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for a slot in flight (not taken: :meth:`acquire` takes it)."""
        while self.in_flight >= self._room():
            turn = loop.create_future()
            self._waiting.append(turn)
            try:
                await turn
            finally:
                if turn in self._waiting:
                    self._waiting.remove(turn)

    async def _pause_over(self, loop: asyncio.AbstractEventLoop) -> None:
        while loop.time() < self._open_at:
            await asyncio.sleep(self._open_at - loop.time())

    def unspent(self, tokens: int, turn: Turn) -> None:
        """A turn taken and not sent (its request claimed or accepted by another runner, the run
        stopped, or taken ahead by :meth:`turn`): the next call takes it and its ``tokens``
        instead of the buckets'. Only within one slice of when it was taken, and from the
        buckets in force, so no later burst exceeds what the limits allowed then."""
        self._unspent.append((*turn, tokens))

    def _fresh_unspent(self, now: float) -> bool:
        """Whether the next unspent turn may be spent (stale ones before it are dropped)."""
        while self._unspent:
            at, built, _ = self._unspent[0]
            if now - at <= self.slice_seconds and built == self._built:
                return True
            self._unspent.popleft()
        return False

    def _take_unspent(self, now: float) -> tuple[int, Turn] | None:
        """The next unspent turn that may be spent, taken: (its tokens, the turn), else None."""
        if not self._fresh_unspent(now):
            return None
        try:
            at, built, tokens = self._unspent.popleft()
        except IndexError:  # cleared meanwhile by new limits set from the user's thread
            return None
        return tokens, (at, built)

    def release(self, answered: bool = True) -> None:
        """A call is over; an answered one ends the lone first call and lets the calls in flight
        climb one step back."""
        if answered:
            self._learning, self.heard = False, True
        if answered and self.allowed < self.ceiling:
            self.allowed = min(float(self.ceiling), self.allowed + 1.0 / self.allowed)
        self._leave()

    def observe(self, headers: Mapping[str, str]) -> None:
        """Learn limits the user did not set, and pause when the provider reports less left
        than one burst (its count of this key's use is ahead of ours). An answer leaving
        :data:`PLENTY` bursts of each, for each live host, makes the next tenth of a slice's
        answers go unread: nothing the hosts send meanwhile could bring either below one."""
        try:
            at: float | None = asyncio.get_running_loop().time()
        except RuntimeError:  # headers read outside a run
            at = None
        if at is not None and at < self._quiet_until:
            return
        seen = reported(headers)
        if not seen.any:
            return
        self._learning, self.heard = False, True
        learnt = self.learnt
        rpm = seen.requests.limit or learnt.requests_per_minute
        tpm = seen.tokens.limit or learnt.tokens_per_minute
        # most answers say the same limits: no new RateLimits to check for each
        if (rpm, tpm) != (learnt.requests_per_minute, learnt.tokens_per_minute):
            self._set(self.limits, RateLimits(rpm, tpm))
        self._pause_if_short(seen)
        if at is not None and self._plenty(seen):
            self._quiet_until = at + self.slice_seconds / 10

    def _plenty(self, seen: Reported) -> bool:
        """Whether ``seen`` leaves at least :data:`PLENTY` bursts of each limit paced to for each
        live host (every host spends the account's counts)."""
        return all(bucket is None or state.remaining is None
                   or state.remaining >= PLENTY * self.hosts * bucket.max_rate
                   for state, bucket in ((seen.requests, self._requests),
                                         (seen.tokens, self._tokens)))

    def penalise(self, wait: float | None) -> None:
        """The provider refused a call (429): nothing is sent for ``wait`` seconds (one slice
        when it gave no wait), and the calls allowed in flight are halved, once per pause."""
        self.refused += 1
        loop = asyncio.get_running_loop()
        wait = self.slice_seconds if wait is None else max(0.0, wait)
        if loop.time() >= self._open_at:
            self.allowed = max(1.0, self.allowed / 2)
        self._quiet_until = -1.0  # the answers after a refusal are read
        self._hold(loop, wait)

    # -- inside ---------------------------------------------------------------------------------
    def _set(self, limits: RateLimits, learnt: RateLimits) -> None:
        """New limits: a new bucket only for a limit in force that changed."""
        rpm, tpm = self.requests_per_minute, self.tokens_per_minute
        self.limits, self.learnt = limits, learnt
        self._build(requests=self.requests_per_minute != rpm,
                    tokens=self.tokens_per_minute != tpm)

    def _pause_if_short(self, seen: Reported) -> None:
        """The provider's count corrects ours: less left than one burst pauses until drained; a
        later answer with a burst left ends that pause (never a 429's)."""
        short = None
        for state, bucket in ((seen.requests, self._requests), (seen.tokens, self._tokens)):
            if bucket is None or state.remaining is None or not state.limit:
                continue
            wait = (bucket.max_rate - state.remaining) * 60.0 / state.limit
            short = max(short or 0.0, wait)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # headers read outside a run: there is no call to hold
            return
        if short is not None and short > 0:
            self._hold(loop, short)
            self._short_until = self._open_at
        elif short is not None and self._open_at == self._short_until > loop.time():
            self.paused -= self._open_at - loop.time()
            self._open_at = self._short_until = loop.time()

    def _hold(self, loop: asyncio.AbstractEventLoop, wait: float) -> None:
        until = loop.time() + wait
        if until > self._open_at:
            self.paused += until - max(self._open_at, loop.time())
            self._open_at = until

    def _room(self) -> float:
        """Calls allowed in flight: one until the first answer; after a 429, ``allowed`` until it
        has climbed back; else no cap beyond each run's workers."""
        if self._learning:
            return 1
        return math.inf if self.allowed >= self.ceiling else max(1, int(self.allowed))

    def _leave(self) -> None:
        """Synchronous, so a cancelled call gives its slot back without awaiting."""
        self.in_flight -= 1
        if self.in_flight < self._room():
            for turn in self._waiting:  # each looks again; those without room wait on
                if not turn.done():
                    turn.set_result(None)

    def describe(self) -> str:
        """The limits in force, for notes and errors."""
        parts = [f"{n:,} {what}" for n, what in ((self.requests_per_minute, "requests"),
                                                 (self.tokens_per_minute, "tokens")) if n]
        if not parts:
            return "no rate limits"
        shared = f", this host's share 1/{self.hosts} of them" if self.hosts > 1 else ""
        return " and ".join(parts) + " per minute" + shared


class Owed:
    """What a bucket must count and has not: amounts sent while its limit was unknown, and what
    the bucket it replaced held. What of them it would not yet have drained is owed, once."""

    WINDOW = 60.0  # a per-minute limit has drained all it passed within a minute
    BIN = 0.1  # amounts sent this close together are kept as one (bounded memory, unpaced)

    def __init__(self) -> None:
        self._sent: deque[list[float]] = deque()  # [when, amount]

    def __bool__(self) -> bool:
        return bool(self._sent)

    def carry(self, bucket: AsyncLimiter | None) -> None:
        """What ``bucket``, being replaced, holds now (read by its public ``has_capacity``)."""
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # no run's loop: no call has spent from it
            return
        if bucket is None or bucket.has_capacity(bucket.max_rate):
            return
        room, full = 0.0, bucket.max_rate  # room fits; full does not
        while full - room > max(1.0, bucket.max_rate / 1024):
            middle = (room + full) / 2
            room, full = (middle, full) if bucket.has_capacity(middle) else (room, middle)
        self.sent(now, bucket.max_rate - room)

    def sent(self, now: float, amount: float) -> None:
        if not amount:
            return
        while self._sent and now - self._sent[0][0] > self.WINDOW:
            self._sent.popleft()
        if self._sent and now - self._sent[-1][0] < self.BIN:
            self._sent[-1][1] += amount  # counted as sent at the earlier moment: drains less
        else:
            self._sent.append([now, amount])

    def level(self, now: float, rate: float) -> float:
        """The level a bucket draining ``rate`` a second would hold now, had it counted them;
        forgotten once told."""
        level, last = 0.0, None
        for when, amount in self._sent:
            level = max(0.0, level - (when - last) * rate) if last is not None else 0.0
            level, last = level + amount, when
        self._sent.clear()
        return 0.0 if last is None else max(0.0, level - (now - last) * rate)


def pack_that_fits(limit: int, fixed_tokens: float, task_tokens: float) -> int:
    """The most tasks a request may pack within ``limit`` tokens: ``fixed_tokens`` per request,
    at most ``task_tokens`` per task."""
    return max(0, math.floor((limit - fixed_tokens) / max(task_tokens, 1e-9)))


COUNT_SECONDS = 1.0  # the longest a run paces to a stale count of the hosts
# Limits kept in the ledger older than this are learnt again (a call alone): an account's limits
# change with its tier, and only a first burst paces to kept ones before headers correct them.
LIMITS_TRUSTED = 30 * 86400.0
LIMITS_RENEWED = 86400.0  # kept limits older than this are written again when next heard
Account = tuple[str, str]  # (the provider's account, the model): what limits are kept under


class HostShare:
    """One session's row among the ledger's hosts, and its pacer's share of the limits."""

    def __init__(self, store: Store, session_id: str, pacer: Pacer) -> None:
        self.store = store
        self.pacer = pacer
        self.owner = Owner.start(session_id)
        self._kept: dict[Account, RateLimits] = {}  # limits the ledger holds, recently written
        self.rank = 0  # this host's place among those alive, in the order of their ids

    def count(self, tx: Tx) -> None:
        """Renew this host's row in ``tx`` and take its share of the hosts counted alive."""
        alive, self.rank = self.store.hosts(tx, self.owner)
        self.pacer.share(alive)

    def recall(self, tx: Tx, account: Account) -> None:
        """:meth:`count`, and pace to the limits the ledger keeps for ``account``."""
        self.count(tx)
        kept = self.store.rate_limits(tx, *account)
        if kept is None or kept[2] > LIMITS_TRUSTED:
            return
        limits = RateLimits(kept[0], kept[1])
        self.pacer.recall(limits)
        if kept[2] < LIMITS_RENEWED:
            self._kept[account] = limits

    def to_keep(self, account: Account) -> RateLimits | None:
        """What the pacer heard of ``account``'s limits that the ledger lacks (None: nothing new),
        taken as kept now so one write is queued for it."""
        learnt = self.pacer.learnt
        if not self.pacer.heard or self._kept.get(account) == learnt:
            return None
        self._kept[account] = learnt
        return learnt

    def keep(self, tx: Tx, account: Account, learnt: RateLimits) -> None:
        """Write ``learnt`` as ``account``'s limits, for every later session on the ledger."""
        self.store.rate_limits(tx, *account, (learnt.requests_per_minute,
                                              learnt.tokens_per_minute))

    def join(self) -> None:
        """Counted from the session's start, so hosts started together share from their first call;
        a ledger that cannot be written now is left to the first run to report."""
        with suppress(LedgerError), self.store.transaction(calls=True) as tx:
            self.count(tx)

    def leave(self) -> None:
        """The session ends: the other hosts take its share at their next count."""
        self.owner.stop()
        with suppress(LedgerError), self.store.transaction(calls=True) as tx:
            self.store.hosts(tx, self.owner, leaving=True)  # failing, dropped as a gone host's
