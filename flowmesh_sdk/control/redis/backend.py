"""The Redis control backend: the three tiers, the task queues, the event stream, the
fleet's instances and spend, shared by every coordinator that points at one Redis.

    async with Fleet(state="redis://127.0.0.1:6379/0") as fleet:   # or FLOWMESH_STATE=...
        ...

Objects are made on first use of a key, as in the in-process backend; nothing talks to
Redis until :meth:`start` (the fleet calls it), which fails with a
:class:`ControlPlaneUnavailableError` naming the URL when Redis cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ...backoff import backoff_delay
from ...errors import FlowMeshError, SpecError
from ...redaction import redact_url
from ..backend import ControlBackend
from ..events import EventBus
from ..limits import QuotaLimits
from ..shared import Adoption, SharedHolders, SharedInstance
from . import fleet_state, scripts
from .client import RedisClient, RetrySettings, check_url
from .context import RedisContext
from .coordinator import Coordinator
from .events import EventStream
from .fleet_state import SharedSpendLedger
from .keys import FleetKeys
from .limits import RedisQuota, RedisSemaphore, RedisTokenBucket
from .queue import TaskQueue

log = logging.getLogger("flowmesh.control.redis")


class RedisBackend(ControlBackend):
    """``url``: ``redis://host:port/db``; ``fleet``: the fleet whose coordinator this is
    (``Fleet(name, state=url)`` makes it with its name): every key it writes is under
    ``<namespace>:fleet:<fleet>:`` (:mod:`.keys`), so one Redis can hold several fleets
    and a coordinator only ever claims, counts and adopts its own fleet's work;
    ``lease_s``: how long a coordinator that stopped heartbeating keeps its leases (and
    how soon its work is adopted: within about 1.3 x ``lease_s``)."""

    def __init__(self, url: str, *, fleet: str = "default", namespace: str = "flowmesh", lease_s: float = 5.0,
                 retry: RetrySettings | None = None) -> None:
        self.url = check_url(url)
        self.keys = FleetKeys(namespace.rstrip(":"), fleet)
        self.fleet = fleet
        self.ns = self.keys.prefix
        self.client = RedisClient(url, scripts.ALL, retry=retry)
        self.coordinator = Coordinator(self.client, self.keys, lease_s=lease_s, on_lost=self._fenced,
                                       on_adopted=self._adopted)
        self.ctx = RedisContext(self.client, self.keys, self.coordinator)   # what the parts below read
        self._buckets: dict[str, RedisTokenBucket] = {}
        self._sems: dict[str, RedisSemaphore] = {}
        self._quotas: dict[str, RedisQuota] = {}
        self._queues: dict[str, TaskQueue] = {}
        self._ledgers: dict[str, SharedSpendLedger] = {}
        self._bg = self.ctx.tasks   # background calls in flight
        self._listener: asyncio.Task[None] | None = None
        self._fence_hooks: list[Any] = []
        self._adopt_hooks: list[Callable[[Adoption], None]] = []
        self.started = False

    def __repr__(self) -> str:
        return f"RedisBackend({redact_url(self.url)!r}, coordinator={self.coordinator.id!r})"

    def key(self, *parts: str) -> str:
        """A key of this backend's fleet."""
        return self.keys.key(*parts)

    def _own(self, fleet: str) -> None:
        if fleet != self.fleet:
            raise SpecError("fleet.control", f"this Redis backend is fleet {self.fleet!r}'s, not {fleet!r}'s: "
                                             f"RedisBackend(url, fleet={fleet!r})")

    # ---- life ------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        await self.client.ping()
        await self.coordinator.join()
        self._listener = asyncio.ensure_future(self._listen())
        self.started = True
        log.info("coordinator %s joined the shared control state at %s", self.coordinator.id, redact_url(self.url))

    async def close(self) -> None:
        if not self.started:
            return
        self.started = False
        for ledger in self._ledgers.values():
            ledger.stop()
        if self._bg:
            await asyncio.gather(*list(self._bg), return_exceptions=True)
        await self.coordinator.leave()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        await self.client.close()

    def on_fenced(self, hook: Any) -> None:
        """``hook(reason)`` when this coordinator's lease lapsed (its work was adopted)."""
        self._fence_hooks.append(hook)

    def on_adopted(self, hook: Callable[[Adoption], None]) -> None:
        self._adopt_hooks.append(hook)

    def _adopted(self, adoption: Adoption) -> None:
        for hook in self._adopt_hooks:
            hook(adoption)

    def _fenced(self, reason: str) -> None:
        for sem in self._sems.values():
            sem.drop_local()
        for quota in self._quotas.values():
            quota.drop_local()
        for hook in self._fence_hooks:
            hook(reason)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Background work whose failure is logged (a release Redis never got is reclaimed
        when the lease lapses)."""
        self.ctx.spawn(coro)

    # ---- the seam ---------------------------------------------------------------------
    def rate_limiter(  # type: ignore[override]  # the bucket on Redis: TokenBucket's methods, not its class
            self, key: str, rate: float, burst: float) -> RedisTokenBucket:
        if key not in self._buckets:
            self._buckets[key] = RedisTokenBucket(self.ctx, key, rate, burst)
        return self._buckets[key]

    def semaphore(  # type: ignore[override]  # the semaphore on Redis: Semaphore's methods, not its class
            self, key: str, capacity: int) -> RedisSemaphore:
        sem = self._sems.get(key)
        if sem is None:
            sem = self._sems[key] = RedisSemaphore(self.ctx, key, capacity)
        elif sem.capacity != capacity:
            sem.resize(capacity)
        return sem

    def quota(self, key: str, default: QuotaLimits | None = None) -> RedisQuota:
        if key not in self._quotas:
            self._quotas[key] = RedisQuota(self.ctx, key, default)
        return self._quotas[key]

    def queue(self, name: str) -> TaskQueue:
        if name not in self._queues:
            self._queues[name] = TaskQueue(self.ctx, name)
        return self._queues[name]

    def ledger(self, fleet: str) -> SharedSpendLedger:
        self._own(fleet)
        if fleet not in self._ledgers:
            self._ledgers[fleet] = SharedSpendLedger(self.ctx, fleet)
        return self._ledgers[fleet]

    def attach(self, fleet: str, bus: EventBus) -> None:
        """Forward ``bus`` to the fleet's stream; mirror the fleet's spend."""
        self._own(fleet)
        EventStream(self.ctx, fleet).attach(bus)
        self.ledger(fleet).run()

    async def shared_instances(self, fleet: str | None = None) -> SharedHolders:
        return await fleet_state.holders(self.ctx, fleet)

    async def forget_instances(self, insts: Sequence[SharedInstance]) -> None:
        await asyncio.gather(*(fleet_state.forget(self.ctx, i) for i in insts))

    def events(self, fleet: str) -> EventStream:
        return EventStream(self.ctx, fleet)

    async def release(self, zkey: str, members: list[str], *, channel: str) -> int:
        return await self.ctx.release(zkey, members, channel=channel)

    # ---- wake-ups (pub/sub) -----------------------------------------------------------
    def event(self, channel: str) -> asyncio.Event:
        """Set when ``channel`` is published on (a release, a push, an adoption), and after a
        reconnect; clear it before asking, wait on it after."""
        return self.ctx.event(channel)

    def notify(self, channel: str) -> None:
        self.ctx.notify(channel)

    async def wait(self, channel: str, timeout_s: float) -> None:
        await self.ctx.wait(channel, timeout_s)

    async def _listen(self) -> None:
        attempt = 0
        errors = self.client._errors
        wakeups, new_channels = self.ctx.wakeups, self.ctx.new_channels
        while True:
            ps = self.client.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await ps.subscribe(self.key("_wake"), *wakeups)
                new_channels.clear()
                attempt = 0
                for ev in wakeups.values():
                    ev.set()   # a message may have been missed while disconnected
                while True:
                    if new_channels:
                        chans = list(new_channels)
                        new_channels.clear()
                        await ps.subscribe(*chans)
                    msg = await ps.get_message(timeout=0.2)
                    if msg is not None:
                        ch = msg["channel"]
                        self.notify(ch.decode() if isinstance(ch, bytes) else ch)
            except errors as exc:
                attempt += 1
                wait = backoff_delay(attempt, 0.05, 1.0)
                log.info("redis pub/sub at %s: %s; reconnecting in %.2f s", redact_url(self.url), exc, wait)
                await asyncio.sleep(wait)
            except FlowMeshError as exc:   # pragma: no cover - defensive
                log.warning("redis pub/sub: %s", exc)
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await ps.aclose()
