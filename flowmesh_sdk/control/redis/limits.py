"""The three tiers on Redis, shared by every coordinator: a token bucket, a semaphore
whose permits are leases, a per-tenant quota whose in-flight slots are leases.  Same
attributes and methods as :mod:`flowmesh_sdk.control.limits`; the state lives in Redis
(see :mod:`.scripts`).

Waiting is never polling: a waiter for a permit sleeps until a release is published on
the semaphore's channel, or until the earliest lease would expire (a dead holder's),
whichever comes first; waiters of one coordinator are served FIFO and asked for in one
script call.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import TYPE_CHECKING

from ... import clock
from ...errors import ControlPlaneUnavailableError, QuotaError, SpecError, ThrottledError
from ...specs import check_number
from ..limits import Quota, QuotaLimits, quota_error

if TYPE_CHECKING:
    from .context import RedisContext


class RedisTokenBucket:
    """``rate`` tokens per second shared by every coordinator, at most ``burst`` saved up."""

    def __init__(self, ctx: RedisContext, key: str, rate: float, burst: float) -> None:
        check_number(f"rate_limit[{key}].rate", rate, lo=0, lo_open=True)
        check_number(f"rate_limit[{key}].burst", burst, lo=1)
        self.ctx = ctx
        self.key = key
        self.rate = float(rate)
        self.burst = float(burst)
        self._rkey = ctx.key("bucket", key)
        self._seen = float(burst)   # tokens as of the last call (what available() reports)
        self._lock = asyncio.Lock()

    def available(self) -> float:
        """Tokens at the last call, an estimate (other coordinators take from it too)."""
        return self._seen

    async def take(self, tokens: float = 1.0) -> float:
        """Take ``tokens`` now if there are; returns 0, or the seconds until they are due."""
        if tokens > self.burst:
            raise SpecError(f"rate_limit[{self.key}].tokens",
                            f"{tokens:g} tokens exceed the burst {self.burst:g}: they could never be taken")
        ok, wait_ms, left = await self.ctx.client.script(
            "BUCKET_TAKE", (self._rkey,), (repr(self.rate), repr(self.burst), repr(float(tokens))))
        self._seen = float(left)
        return 0.0 if ok else int(wait_ms) / 1000.0

    async def acquire(self, tokens: float = 1.0, *, timeout_s: float | None = None) -> float:
        check_number(f"rate_limit[{self.key}].tokens", tokens, lo=0)
        t0 = clock.monotonic()
        async with self._lock:
            while True:
                wait = await self.take(tokens)
                if not wait:
                    return clock.monotonic() - t0
                if timeout_s is not None and clock.monotonic() - t0 + wait > timeout_s:
                    raise ThrottledError(f"rate limit {self.key!r}: next token in {wait:.2f} s, "
                                         f"past the {timeout_s:g} s deadline", code="RateLimit")
                await asyncio.sleep(wait)


class RedisSemaphore:
    """In flight <= capacity across every coordinator; a dead holder's permits come back
    when its lease lapses.  ``in_flight`` and ``waiting`` are this coordinator's."""

    def __init__(self, ctx: RedisContext, key: str, capacity: int) -> None:
        check_number(f"semaphore[{key}].capacity", capacity, lo=1, integer=True)
        self.ctx = ctx
        self.key = key
        self.capacity = capacity
        self._rkey = ctx.key("sem", key)
        self._held: list[str] = []   # members this coordinator holds
        self._waiters: collections.deque[tuple[asyncio.Future[str], str]] = collections.deque()
        self._seq = itertools.count()
        self._pump: asyncio.Task[None] | None = None

    @property
    def in_flight(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> int:
        return sum(1 for f, _ in self._waiters if not f.done())

    def resize(self, capacity: int) -> None:
        check_number(f"semaphore[{self.key}].capacity", capacity, lo=1, integer=True)
        self.capacity = capacity
        self.ctx.notify(self._rkey)

    def _member(self) -> str:
        return f"{self.ctx.coordinator.id}:{next(self._seq)}"

    async def acquire(self) -> None:
        self.ctx.coordinator.check()
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.append((fut, self._member()))
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._serve())
        try:
            member = await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._give_back([fut.result()])   # granted while being cancelled
            else:
                fut.cancel()
            raise
        self._held.append(member)

    async def _serve(self) -> None:
        """Ask for every waiter at once, FIFO; sleep until a release or a lease expiry."""
        be = self.ctx
        while True:
            while self._waiters and self._waiters[0][0].done():
                self._waiters.popleft()
            if not self._waiters:
                return
            want = [(f, m) for f, m in self._waiters if not f.done()]
            try:
                got, wait_ms = await be.client.script(
                    "SEM_ACQUIRE", (self._rkey, be.coordinator.leases_key, be.coordinator.coord_key),
                    (self.capacity, *(m for _, m in want)))
            except ControlPlaneUnavailableError as exc:
                for f, _ in want:
                    if not f.done():
                        f.set_exception(exc)
                continue
            if got < 0:   # this coordinator's lease lapsed: fence, rejoin, ask again as the new one
                await be.coordinator.lapsed()
                for i, (f, _) in enumerate(list(self._waiters)):
                    self._waiters[i] = (f, self._member())
                continue
            for f, m in want[:got]:
                if f.done():
                    self._give_back([m])
                else:
                    f.set_result(m)
            if got < len(want):
                await be.wait(self._rkey, wait_ms / 1000.0 if wait_ms else be.coordinator.lease_ms / 1000.0)

    def release(self) -> None:
        """Give one permit back (sent in the background; a release Redis never gets is
        reclaimed when the lease lapses)."""
        if self._held:
            self._give_back([self._held.pop()])

    async def release_async(self) -> None:
        if self._held:
            await self.ctx.release(self._rkey, [self._held.pop()], channel=self._rkey)

    def _give_back(self, members: list[str]) -> None:
        self.ctx.spawn(self.ctx.release(self._rkey, members, channel=self._rkey))

    def drop_local(self) -> None:
        """Forget the permits this coordinator held (fenced: they were adopted)."""
        self._held.clear()

    async def held(self) -> int:
        """Permits held now by every coordinator together."""
        return int(await self.ctx.client.script("SEM_COUNT", (self._rkey,), ()))


class RedisQuota(Quota):
    """Per-tenant admission shared by every coordinator.  The limits are this coordinator's
    configuration (give every coordinator the same; ``set`` and ``limits`` as in
    :class:`~flowmesh_sdk.control.limits.Quota`); the counts are the fleet's."""

    def __init__(self, ctx: RedisContext, key: str, default: QuotaLimits | None = None) -> None:
        super().__init__(default)
        self.ctx = ctx
        self.key = key
        self._held: collections.defaultdict[str, list[str]] = collections.defaultdict(list)
        self._seq = itertools.count()

    def _keys(self, tenant: str) -> tuple[str, str]:
        return self.ctx.key("quota", self.key, tenant, "inflight"), self.ctx.key("quota", self.key, tenant, "total")

    def admit(self, tenant: str) -> None:
        raise SpecError("quota.admit", "a quota on Redis is asked with 'await quota.admit_async(tenant)'")

    def slot_key(self, tenant: str) -> str:
        """The sorted set of ``tenant``'s in-flight slots."""
        return self._keys(tenant)[0]

    async def admit_async(self, tenant: str, *, task_id: str | None = None) -> None:
        """Take a slot for ``tenant`` or raise QuotaError with the numbers.  With ``task_id``
        the slot belongs to that queued task (it outlives this coordinator and is freed when
        the task is acked), else to this coordinator's lease (``release_async`` frees it)."""
        be = self.ctx
        be.coordinator.check()
        lim = self.limits(tenant)
        inflight, total = self._keys(tenant)
        for _ in range(2):
            member = task_id or f"{be.coordinator.id}:{next(self._seq)}"
            ok, what, count = await be.client.script(
                "QUOTA_ADMIT", (inflight, total, be.coordinator.leases_key, be.coordinator.coord_key),
                (-1 if lim.max_in_flight is None else lim.max_in_flight,
                 -1 if lim.max_total is None else lim.max_total, member, "1" if task_id else "0"))
            if ok >= 0:
                break
            await be.coordinator.lapsed()
        if ok == 1:
            if task_id is None:
                self._held[tenant].append(member)
            return
        if ok < 0:
            raise ControlPlaneUnavailableError(f"coordinator lease keeps lapsing at {be.client!r}", url=be.client.url)
        raise quota_error(tenant, lim, in_flight=int(count) if what == 1 else None,
                          total=int(count) if what == 2 else None)

    def release(self, tenant: str) -> None:
        if self._held.get(tenant):
            self.ctx.spawn(self.release_async(tenant))

    async def release_async(self, tenant: str) -> None:
        members = self._held.get(tenant)
        if members:
            await self.ctx.release(self._keys(tenant)[0], [members.pop()], channel="")

    def drop_local(self) -> None:
        self._held.clear()

    async def in_flight_async(self, tenant: str) -> int:
        return int(await self.ctx.client.script("SEM_COUNT", (self._keys(tenant)[0],), ()))

    def in_flight(self, tenant: str) -> int:
        """This coordinator's share (``in_flight_async`` counts the fleet's)."""
        return len(self._held.get(tenant, ()))


__all__ = ["QuotaError", "RedisQuota", "RedisSemaphore", "RedisTokenBucket"]
