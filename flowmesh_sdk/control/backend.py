"""Where the three tiers keep their state.

:class:`InProcessBackend` keeps it in this process (the default).
:class:`~flowmesh_sdk.control.redis.RedisBackend` implements the same interface on Redis
so that many coordinators share one fleet;
:func:`~flowmesh_sdk.control.state.open_backend` picks one from the ``FLOWMESH_STATE``
setting (or a fleet's ``state=`` argument).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence

from .. import settings
from ..errors import SpecError
from ..redaction import redact_url
from .events import EventBus
from .limits import Quota, QuotaLimits, Semaphore, TokenBucket
from .shared import Adoption, SharedHolders, SharedInstance
from .spend import SpendLedger

STATE_ENV = "FLOWMESH_STATE"


class ControlBackend(abc.ABC):
    # the one fleet whose state this backend keeps (a shared backend: its keys are that
    # fleet's); None: any fleet of this process
    fleet: str | None = None

    @abc.abstractmethod
    def rate_limiter(self, key: str, rate: float, burst: float) -> TokenBucket: ...

    @abc.abstractmethod
    def semaphore(self, key: str, capacity: int) -> Semaphore: ...

    @abc.abstractmethod
    def quota(self, key: str, default: QuotaLimits | None = None) -> Quota: ...

    def ledger(self, fleet: str) -> SpendLedger:
        """The fleet's spend ledger (shared by every coordinator on a shared backend)."""
        return SpendLedger()

    def attach(self, fleet: str, bus: EventBus) -> None:
        """Hook: the fleet's bus (a shared backend forwards its events)."""

    def on_adopted(self, hook: Callable[[Adoption], None]) -> None:
        """``hook(adoption)`` each time this coordinator adopts a dead one's work (a shared
        backend; in this process there is no other coordinator to adopt)."""

    async def shared_instances(self, fleet: str | None = None) -> SharedHolders | None:
        """The instances the shared state lists for ``fleet`` (every fleet: None) and the
        live coordinators; None when the state is in this process."""
        return None

    async def forget_instances(self, insts: Sequence[SharedInstance]) -> None:
        """Terminated: end their charges and drop them from the shared lists (a shared backend)."""

    async def start(self) -> None:
        """Connect (a shared backend); a clear error when the state cannot be reached."""

    async def close(self) -> None:
        """Give back what this coordinator holds."""


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


def state_url(state: str | None = None) -> str | None:
    """The Redis URL ``state`` (else ``FLOWMESH_STATE``, else flowmesh.toml's ``state``)
    names; None for in-process (``memory`` or unset); a SpecError for anything else."""
    value = state if state is not None else (settings.value("state") or "")
    if value in ("", "memory", "in-process"):
        return None
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        shown = repr(redact_url(value)) if isinstance(value, str) else type(value).__name__
        raise SpecError("state", f"must be 'memory' or a redis://host:port[/db] URL ({STATE_ENV}), got {shown}")
    return value


__all__ = ["ControlBackend", "InProcessBackend", "STATE_ENV", "state_url"]
