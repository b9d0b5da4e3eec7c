"""What the Redis parts (:mod:`.limits`, :mod:`.queue`, :mod:`.events`, :mod:`.fleet_state`)
share with their backend, handed to each when :class:`~.backend.RedisBackend` makes it: the
one client, the fleet's keys, this coordinator (its id and leases), the background calls in
flight and the pub/sub wake-ups.  The parts read this, never the backend itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from .client import RedisClient
from .coordinator import Coordinator
from .keys import FleetKeys

log = logging.getLogger("flowmesh.control.redis")


class RedisAccess(Protocol):
    """The client and the keys: what a reader of the shared state needs (a
    :class:`RedisContext`, or a :class:`~.backend.RedisBackend` that has not joined)."""

    @property
    def client(self) -> RedisClient: ...

    @property
    def keys(self) -> FleetKeys: ...


@dataclass(frozen=True, slots=True)
class RedisContext:
    client: RedisClient
    keys: FleetKeys
    coordinator: Coordinator
    # background calls in flight (the backend waits for them when it closes)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    # channel -> set when it is published on (the backend's listener sets them)
    wakeups: dict[str, asyncio.Event] = field(default_factory=dict)
    # channels asked for and not subscribed to yet
    new_channels: set[str] = field(default_factory=set)

    def key(self, *parts: str) -> str:
        """A key of this fleet."""
        return self.keys.key(*parts)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Background work whose failure is logged (a release Redis never got is reclaimed
        when the lease lapses)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("redis background call failed: %s", task.exception())

    async def release(self, zkey: str, members: list[str], *, channel: str) -> int:
        n = int(await self.client.script("RELEASE", (zkey, self.coordinator.leases_key), (channel, *members)))
        if channel:
            self.notify(channel)
        return n

    # ---- wake-ups (pub/sub) -----------------------------------------------------------
    def event(self, channel: str) -> asyncio.Event:
        """Set when ``channel`` is published on (a release, a push, an adoption), and after a
        reconnect; clear it before asking, wait on it after."""
        ev = self.wakeups.get(channel)
        if ev is None:
            ev = self.wakeups[channel] = asyncio.Event()
            ev.set()   # not subscribed yet: the first wait returns at once and asks again
            self.new_channels.add(channel)
        return ev

    def notify(self, channel: str) -> None:
        ev = self.wakeups.get(channel)
        if ev is not None:
            ev.set()

    async def wait(self, channel: str, timeout_s: float) -> None:
        ev = self.event(channel)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout_s)
        ev.clear()


__all__ = ["RedisAccess", "RedisContext"]
