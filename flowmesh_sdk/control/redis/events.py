"""The fleet's events on a Redis Stream (``<namespace>:fleet:<fleet>:events``), so that every
coordinator's lifecycle and task events reach every reader.

:meth:`EventStream.attach` forwards a coordinator's :class:`~flowmesh_sdk.control.events.EventBus`
into the stream (batched, never blocking the publisher).  Readers use consumer groups: each
event goes to one consumer of a group; one a dead consumer read and never acknowledged is
taken over with :meth:`claim_stale` (``XAUTOCLAIM``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import FlowMeshError
from ...specs import PhaseTimings
from ..events import Event, EventBus, EventKind

if TYPE_CHECKING:
    from .context import RedisContext

log = logging.getLogger("flowmesh.control.redis")

_FIELDS = ("pool", "instance_id", "task_id", "task_name", "detail", "run", "tenant", "infra_failure")


@dataclass(frozen=True, slots=True)
class StreamEvent:
    id: str              # the stream entry id (server ms - sequence)
    coordinator: str     # who published it
    event: Event


def encode(ev: Event, coordinator: str) -> dict[str, str]:
    d = {"kind": ev.kind.value, "fleet": ev.fleet, "at": repr(ev.at), "coord": coordinator}
    for f in _FIELDS:
        v = getattr(ev, f)
        if v:
            d[f] = str(v)
    if ev.exit_code is not None:
        d["exit_code"] = str(ev.exit_code)
    if ev.cost is not None:
        d["cost"] = repr(ev.cost)
    if ev.phases is not None:
        d["phases"] = json.dumps(dataclasses.asdict(ev.phases))
    return d


def decode(entry_id: bytes | str, fields: dict[bytes, bytes]) -> StreamEvent:
    f = {k.decode(): v.decode() for k, v in fields.items()}
    ev = Event(EventKind(f["kind"]), fleet=f["fleet"], pool=f.get("pool", ""),
               instance_id=f.get("instance_id"), task_id=f.get("task_id"), task_name=f.get("task_name"),
               detail=f.get("detail", ""),
               exit_code=int(f["exit_code"]) if "exit_code" in f else None, at=float(f["at"]),
               phases=PhaseTimings(**json.loads(f["phases"])) if "phases" in f else None,
               run=f.get("run", ""), tenant=f.get("tenant"), infra_failure=f.get("infra_failure"),
               cost=float(f["cost"]) if "cost" in f else None)
    return StreamEvent(entry_id.decode() if isinstance(entry_id, bytes) else entry_id, f.get("coord", ""), ev)


class EventStream:
    def __init__(self, ctx: RedisContext, fleet: str, *, maxlen: int = 100_000) -> None:
        self.ctx = ctx
        self.fleet = fleet
        self.key = ctx.keys.of(fleet).key("events")
        self.maxlen = maxlen

    def attach(self, bus: EventBus) -> None:
        bus.on(self.forward)

    def forward(self, ev: Event) -> None:
        if ev.fleet == self.fleet:
            self.ctx.spawn(self.publish(ev))

    async def publish(self, ev: Event) -> str:
        rid = await self.ctx.client.command("xadd", self.key, encode(ev, self.ctx.coordinator.id),
                                                maxlen=self.maxlen, approximate=True)
        return rid.decode() if isinstance(rid, bytes) else str(rid)

    async def ensure_group(self, group: str, start: str = "0") -> None:
        try:
            await self.ctx.client.command("xgroup_create", self.key, group, start, mkstream=True)
        except FlowMeshError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(self, group: str, consumer: str, *, count: int = 100,
                   block_ms: int | None = None) -> list[StreamEvent]:
        """New entries for ``consumer`` of ``group`` (blocking up to ``block_ms`` when given)."""
        res: Any = await self.ctx.client.direct("xreadgroup", group, consumer, {self.key: ">"}, count=count,
                                                block=block_ms)
        return [decode(i, f) for _, entries in (res or []) for i, f in entries]

    async def ack(self, group: str, ids: list[str]) -> int:
        return int(await self.ctx.client.command("xack", self.key, group, *ids)) if ids else 0

    async def claim_stale(self, group: str, consumer: str, *, min_idle_ms: int, count: int = 100) -> list[StreamEvent]:
        """Entries other consumers read and did not acknowledge for ``min_idle_ms``."""
        res = await self.ctx.client.command("xautoclaim", self.key, group, consumer, min_idle_ms, "0-0",
                                                count=count)
        return [decode(i, f) for i, f in res[1] if f]

    async def tail(self, count: int = 50) -> list[StreamEvent]:
        """The newest ``count`` events, oldest first (``flowmesh status``)."""
        res = await self.ctx.client.command("xrevrange", self.key, "+", "-", count=count)
        return [decode(i, f) for i, f in reversed(res)]
