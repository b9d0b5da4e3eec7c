"""Where the three tiers keep their state.

:class:`InProcessBackend` keeps it in this process (the default).  A Redis backend
implements the same interface so that many coordinators can share one fleet.
"""

from __future__ import annotations

import abc

from .limits import Quota, QuotaLimits, Semaphore, TokenBucket


class ControlBackend(abc.ABC):
    @abc.abstractmethod
    def rate_limiter(self, key: str, rate: float, burst: float) -> TokenBucket: ...

    @abc.abstractmethod
    def semaphore(self, key: str, capacity: int) -> Semaphore: ...

    @abc.abstractmethod
    def quota(self, key: str, default: QuotaLimits | None = None) -> Quota: ...


class InProcessBackend(ControlBackend):
    """One object per key, shared by everything in this process that asks for the key."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}
        self._sems: dict[str, Semaphore] = {}
        self._quotas: dict[str, Quota] = {}

    def rate_limiter(self, key: str, rate: float, burst: float) -> TokenBucket:
        if key not in self._buckets:
            self._buckets[key] = TokenBucket(rate, burst, key=key)
        return self._buckets[key]

    def semaphore(self, key: str, capacity: int) -> Semaphore:
        sem = self._sems.get(key)
        if sem is None:
            sem = self._sems[key] = Semaphore(capacity, key=key)
        elif sem.capacity != capacity:
            sem.resize(capacity)
        return sem

    def quota(self, key: str, default: QuotaLimits | None = None) -> Quota:
        if key not in self._quotas:
            self._quotas[key] = Quota(default)
        return self._quotas[key]
