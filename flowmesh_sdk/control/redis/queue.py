"""The FIFO task queue of one pool, shared by every coordinator.

``push`` appends (an id pushed twice is queued once); ``claim`` takes from the front and
holds each task under the claimer's lease: its visibility timeout is the coordinator's
lease, renewed by its heartbeat while it lives.  A task whose claimer dies comes back to
the *front* of the queue -- at once when another coordinator adopts the dead one, at the
latest on the next claim after the lease lapsed.  ``ack`` removes a finished task;
``nack`` puts it back at the front (cancelled, or this coordinator is draining).
A claim whose reply was lost (Redis restarted, the connection dropped) and that the retry
loop sends again returns the tasks the first one took, so none is left held unseen.

The queue's keys are its fleet's (``<namespace>:fleet:<fleet>:q:<name>:...``, see
:mod:`.keys`); :meth:`TaskQueue.migrate` moves in what an older version queued under the
same name without the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...specs import check_name

if TYPE_CHECKING:
    from .context import RedisContext
    from .client import RedisClient

log = logging.getLogger("flowmesh.control.redis")

_REQUEST_MS = 120_000   # how long a claim's reply is kept for a retry of the same call


@dataclass(frozen=True, slots=True)
class Claim:
    id: str
    payload: bytes
    attempt: int       # 1 on the first dispatch; more when a dead coordinator's claim came back


class TaskQueue:
    def __init__(self, ctx: RedisContext, name: str) -> None:
        check_name("queue.name", name)
        self.ctx = ctx
        self.name = name
        self._base = base = ctx.key("q", name)
        self._ready, self._tasks = f"{base}:ready", f"{base}:tasks"
        self._claimed, self._attempts = f"{base}:claimed", f"{base}:attempts"
        self._order, self._seq = f"{base}:order", f"{base}:seq"

    def __repr__(self) -> str:
        return f"TaskQueue({self.name!r}, fleet={self.ctx.keys.fleet!r})"

    async def migrate(self) -> int:
        """Move the tasks an older version queued under ``<namespace>:q:<name>`` (the
        layout without the fleet) to the front of this queue; how many.  While a coordinator
        of that version still holds a lease they stay where they are (a warning says so)."""
        be = self.ctx
        old = f"{be.keys.legacy}q:{self.name}"
        moved, live, left = await be.client.script(
            "Q_MIGRATE", (*(f"{old}:{part}" for part in ("ready", "tasks", "claimed", "attempts", "order", "seq")),
                          f"{be.keys.legacy}coords", self._ready, self._tasks, self._attempts, self._order, self._seq),
            (self._ready, be.keys.legacy))
        if moved:
            log.warning("queue %s: moved %d task(s) an older FlowMesh queued under %s:* (no fleet in its keys) "
                        "into fleet %s's queue", self.name, moved, old, be.keys.fleet)
        elif left:
            log.warning("queue %s: %d task(s) an older FlowMesh queued under %s:* stay there while %d of its "
                        "coordinator(s) still hold a lease on this Redis; stop them, and this queue takes the "
                        "tasks when it is next opened", self.name, left, old, live)
        return int(moved)

    async def push(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Append ``(id, payload)`` pairs in order; returns how many were new."""
        flat: list[object] = []
        for task_id, payload in items:
            flat += [task_id, payload]
        if not flat:
            return 0
        return int(await self.ctx.client.script("Q_PUSH", (self._ready, self._tasks, self._order, self._seq),
                                                      (self._ready, *flat)))

    async def claim(self, n: int = 1) -> list[Claim]:
        """Up to ``n`` tasks from the front, held under this coordinator's lease."""
        be = self.ctx
        be.coordinator.check()
        request = f"{self._base}:claim:{uuid.uuid4().hex}"   # the same through retries of this call
        for _ in range(2):
            c = be.coordinator
            flat = await be.client.script(
                "Q_CLAIM", (self._ready, self._tasks, self._claimed, self._attempts, c.leases_key, c.coord_key,
                            request), (n, self._base, _REQUEST_MS))
            if flat != [-1]:
                break
            await c.lapsed()
        return [Claim(flat[i].decode(), flat[i + 1], int(flat[i + 2])) for i in range(0, len(flat), 3)]

    async def wait(self, timeout_s: float) -> None:
        """Until something is pushed or given back (or ``timeout_s``)."""
        ev = self.ctx.event(self._ready)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout_s)
        ev.clear()

    async def ack(self, ids: Iterable[str], *, slots: Iterable[str] | None = None) -> int:
        """Remove finished tasks; ``slots``: each task's tenant-slot set (see
        :meth:`RedisQuota.slot_key`), freed in the same step."""
        ids = list(ids)
        if not ids:
            return 0
        keys = list(slots) if slots is not None else [""] * len(ids)
        flat = [x for pair in zip(ids, keys) for x in pair]
        return int(await self.ctx.client.script(
            "Q_ACK", (self._claimed, self._tasks, self._attempts, self.ctx.coordinator.leases_key,
                      self._order), flat))

    async def nack(self, ids: Iterable[str]) -> int:
        ids = list(ids)
        if not ids:
            return 0
        return int(await self.ctx.client.script(
            "Q_NACK", (self._claimed, self._ready, self.ctx.coordinator.leases_key), (self._ready, *ids)))

    async def depth(self) -> tuple[int, int]:
        """(queued, claimed) now."""
        return await depth(self.ctx.client, self._base)


async def depth(client: RedisClient, base: str) -> tuple[int, int]:
    """(queued, claimed) of the queue whose keys begin with ``base``."""
    queued = await client.command("llen", f"{base}:ready")
    claimed = await client.command("zcard", f"{base}:claimed")
    return int(queued), int(claimed)
