"""The shared fleet as one view, for ``flowmesh status`` and ``flowmesh pools`` when
``FLOWMESH_STATE`` names a Redis: every coordinator's events replayed from the fleets'
streams into one (in-memory) metadata store -- so the same tables show every pool, task
and instance of every coordinator -- plus what only Redis knows: the live coordinators and
their leases, the adoptions, the queues, and which coordinator holds each instance."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from ..shared import Adoption, SharedInstance
from ..store import MetadataStore
from .backend import RedisBackend
from .events import decode
from .fleet_state import fleets, instances


@dataclass(frozen=True, slots=True)
class CoordinatorRow:
    id: str
    host: str
    pid: int
    lease_left_ms: int      # -2: its lease lapsed, not adopted yet


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    queued: int
    claimed: int


@dataclass(frozen=True, slots=True)
class SharedStatus:
    url: str
    coordinators: tuple[CoordinatorRow, ...]
    adoptions: tuple[Adoption, ...]
    queues: tuple[QueueRow, ...]
    instances: tuple[SharedInstance, ...]


async def _scan(be: RedisBackend, pattern: str) -> list[str]:
    return sorted([k.decode() async for k in be.client.redis.scan_iter(match=be.ns + pattern, count=500)])


async def snapshot(be: RedisBackend) -> SharedStatus:
    c = be.client
    coords = []
    for raw in await c.command("zrange", be.key("coords"), 0, -1):
        cid = raw.decode()
        info = await c.command("get", be.key("coord", cid))
        d = json.loads(info) if info else {}
        coords.append(CoordinatorRow(cid, str(d.get("host", "")), int(d.get("pid", 0)),
                                     int(await c.command("pttl", be.key("coord", cid)))))
    adoptions = []
    for _, f in await c.command("xrange", be.key("adoptions"), "-", "+"):
        g = {k.decode(): v.decode() for k, v in f.items()}
        adoptions.append(Adoption(g["dead"], g["adopter"], int(g["leases"]), int(g["tasks"]),
                                  int(g["instances"]), int(g["at_ms"])))
    queues = []
    for key in await _scan(be, "q:*:tasks"):
        name = key[len(be.ns) + 2:-len(":tasks")]
        queued, claimed = await be.queue(name).depth()
        queues.append(QueueRow(name, queued, claimed))
    insts = [i for f in await fleets(be) for i in await instances(be, f)]
    return SharedStatus(be.url, tuple(coords), tuple(adoptions), tuple(queues), tuple(insts))


async def replay(be: RedisBackend, store: MetadataStore) -> int:
    """Every fleet's stream into ``store``; how many events."""
    n = 0
    for key in await _scan(be, "events:*"):
        last = "-"
        while True:
            rows = await be.client.command("xrange", key, last, "+", count=5000)
            rows = [r for r in rows if r[0].decode() != last]
            if not rows:
                break
            for rid, fields in rows:
                store.record(decode(rid, fields).event)
            n += len(rows)
            last = rows[-1][0].decode()
    await store.flush()
    return n


async def _shared_view(url: str) -> tuple[MetadataStore, SharedStatus]:
    be = RedisBackend(url)
    await be.client.ping()       # a reader: it does not join the fleet as a coordinator
    try:
        store = MetadataStore(":memory:")
        await replay(be, store)
        return store, await snapshot(be)
    finally:
        await be.client.close()


def shared_view(url: str) -> tuple[MetadataStore, SharedStatus]:
    """(a metadata store holding the whole shared fleet's events, what Redis says now)."""
    return asyncio.run(_shared_view(url))
