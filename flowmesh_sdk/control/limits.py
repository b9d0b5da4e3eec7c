"""The three tiers of concurrency control (MegaFlow §2.3), in-process implementations.

1. rate limits: a token bucket per key (a model endpoint, a cloud API) -- callers wait
   for the exact time the next token is due, never poll;
2. semaphores: in-flight work <= capacity, FIFO for the waiters;
3. quotas: per tenant, reject at submission with :class:`QuotaError` instead of queueing
   forever.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass

from .. import clock
from ..errors import QuotaError, SpecError, ThrottledError
from ..specs import check_number


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: float, *, key: str = "") -> None:
        check_number(f"rate_limit[{key}].rate", rate, lo=0, lo_open=True)
        check_number(f"rate_limit[{key}].burst", burst, lo=1)
        self.key = key
        self.rate = float(rate)
        self.burst = float(burst)
        self._tokens = float(burst)
        self._stamp = clock.monotonic()
        self._lock = asyncio.Lock()  # FIFO: waiters are served in arrival order

    def _refill(self) -> None:
        now = clock.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def available(self) -> float:
        """Tokens that could be taken now without waiting."""
        self._refill()
        return self._tokens

    def _check_tokens(self, tokens: float) -> None:
        check_number(f"rate_limit[{self.key}].tokens", tokens, lo=0)
        if tokens > self.burst:
            raise SpecError(f"rate_limit[{self.key}].tokens",
                            f"{tokens:g} tokens exceed the burst {self.burst:g}: they could never be taken")

    def try_acquire(self, tokens: float = 1.0) -> bool:
        self._check_tokens(tokens)
        self._refill()
        if self._tokens >= tokens:
            self._tokens -= tokens
            return True
        return False

    async def acquire(self, tokens: float = 1.0, *, timeout_s: float | None = None) -> float:
        """Take ``tokens``; returns the seconds waited.  Raises ThrottledError at once when the
        next token is due after ``timeout_s``."""
        self._check_tokens(tokens)
        t0 = clock.monotonic()
        async with self._lock:
            self._refill()
            if self._tokens < tokens:
                wait = (tokens - self._tokens) / self.rate
                if timeout_s is not None and clock.monotonic() - t0 + wait > timeout_s:
                    raise ThrottledError(f"rate limit {self.key!r}: next token in {wait:.2f} s, "
                                         f"past the {timeout_s:g} s deadline", code="RateLimit")
                await asyncio.sleep(wait)
                self._refill()
            self._tokens -= tokens
        return clock.monotonic() - t0


class Semaphore:
    """In-flight <= capacity; FIFO; exposes how many wait (the pool's queue depth)."""

    def __init__(self, capacity: int, *, key: str = "") -> None:
        check_number(f"semaphore[{key}].capacity", capacity, lo=1, integer=True)
        self.key = key
        self.capacity = capacity
        self.in_flight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self) -> None:
        if self.in_flight < self.capacity and not self._waiters:
            self.in_flight += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()  # we were handed a slot while being cancelled: pass it on
            else:
                fut.cancel()
            raise

    def release(self) -> None:
        while self._waiters and self.in_flight <= self.capacity:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # hand the slot over; in_flight is unchanged
                return
        self.in_flight -= 1

    async def release_async(self) -> None:
        self.release()

    def resize(self, capacity: int) -> None:
        check_number(f"semaphore[{self.key}].capacity", capacity, lo=1, integer=True)
        self.capacity = capacity
        while self.in_flight < self.capacity and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self.in_flight += 1
                fut.set_result(None)


def quota_error(tenant: str, lim: QuotaLimits, *, in_flight: int | None = None,
                total: int | None = None) -> QuotaError:
    """The rejection of a tenant over its quota, with the numbers (one wording for every backend)."""
    if in_flight is not None:
        return QuotaError(f"tenant {tenant!r} has {in_flight} tasks in flight, its quota is "
                          f"{lim.max_in_flight}", code="TenantInFlight")
    return QuotaError(f"tenant {tenant!r} used its quota of {lim.max_total} tasks ({total} admitted)",
                      code="TenantTotal")


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """Per-tenant limits; None is unlimited."""

    max_in_flight: int | None = None   # admitted (queued or running) at once
    max_total: int | None = None       # ever admitted in this quota's lifetime

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_total"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"quota.{name}", value, lo=0, integer=True)


class Quota:
    """Per-tenant admission: rejects at once when a tenant is over its limits."""

    def __init__(self, default: QuotaLimits | None = None) -> None:
        if default is not None and not isinstance(default, QuotaLimits):
            raise SpecError("quota.default", f"must be a QuotaLimits, got {type(default).__name__}")
        self.default = default or QuotaLimits()
        self._limits: dict[str, QuotaLimits] = {}
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._total: collections.Counter[str] = collections.Counter()

    def set(self, tenant: str, limits: QuotaLimits) -> None:
        if not isinstance(tenant, str) or not tenant:
            raise SpecError("quota.tenant", f"must be a non-empty tenant name, got {tenant!r}")
        if not isinstance(limits, QuotaLimits):
            raise SpecError(f"quota[{tenant}]", f"must be a QuotaLimits, got {type(limits).__name__}")
        self._limits[tenant] = limits

    def limits(self, tenant: str) -> QuotaLimits:
        return self._limits.get(tenant, self.default)

    def admit(self, tenant: str) -> None:
        lim = self.limits(tenant)
        if lim.max_in_flight is not None and self._in_flight[tenant] >= lim.max_in_flight:
            raise quota_error(tenant, lim, in_flight=self._in_flight[tenant])
        if lim.max_total is not None and self._total[tenant] >= lim.max_total:
            raise quota_error(tenant, lim, total=self._total[tenant])
        self._in_flight[tenant] += 1
        self._total[tenant] += 1

    def release(self, tenant: str) -> None:
        if self._in_flight[tenant] > 0:
            self._in_flight[tenant] -= 1

    # the pools' calls: a backend whose state is elsewhere (Redis) answers them remotely
    async def admit_async(self, tenant: str) -> None:
        self.admit(tenant)

    async def release_async(self, tenant: str) -> None:
        self.release(tenant)

    def in_flight(self, tenant: str) -> int:
        return self._in_flight[tenant]
