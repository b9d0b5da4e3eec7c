"""The shared fleet as one view, for ``flowmesh status`` and ``flowmesh pools`` when
``FLOWMESH_STATE`` names a Redis: every coordinator's events replayed from the fleets'
streams into one (in-memory) metadata store -- so the same tables show every pool, task
and instance of every coordinator -- plus what only Redis knows: the live coordinators and
their leases, the adoptions, the queues, and which coordinator holds each instance -- for
every fleet of the namespace (:mod:`.keys`), each row naming its fleet."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from ...redaction import redact_url
from ..shared import Adoption, SharedInstance
from ..store import MetadataStore
from .backend import RedisBackend
from .events import decode
from .fleet_state import instances
from .queue import depth


@dataclass(frozen=True, slots=True)
class CoordinatorRow:
    id: str
    host: str
    pid: int
    lease_left_ms: int      # -2: its lease lapsed, not adopted yet
    fleet: str = ""


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    queued: int
    claimed: int
    fleet: str = ""         # "": left under the layout without the fleet (see keys.py), not run yet


@dataclass(frozen=True, slots=True)
class SharedStatus:
    url: str                # its password as *** (redaction.redact_url)
    coordinators: tuple[CoordinatorRow, ...]
    adoptions: tuple[Adoption, ...]
    queues: tuple[QueueRow, ...]
    instances: tuple[SharedInstance, ...]


async def _layout(be: RedisBackend) -> dict[str, set[str]]:
    """Every fleet of the namespace, and each one's keys (without the fleet's prefix)."""
    out: dict[str, set[str]] = {}
    async for raw in be.client.redis.scan_iter(match=be.keys.pattern(), count=1000):
        key = raw.decode()
        fleet = be.keys.fleet_of(key)
        if fleet is not None:
            out.setdefault(fleet, set()).add(key[len(be.keys.of(fleet).prefix):])
    return out


def _queues(rests: set[str]) -> list[str]:
    return sorted(r[2:-len(":tasks")] for r in rests if r.startswith("q:") and r.endswith(":tasks")
                  and r.count(":") == 2)


async def _legacy_queues(be: RedisBackend) -> list[QueueRow]:
    """Queues an older version left under ``<namespace>:q:<name>`` (no fleet in the keys)."""
    rows = []
    head = be.keys.legacy + "q:"
    async for raw in be.client.redis.scan_iter(match=head + "*:tasks", count=1000):
        name = raw.decode()[len(head):-len(":tasks")]
        if ":" not in name:
            queued, claimed = await depth(be.client, f"{head}{name}")
            rows.append(QueueRow(name, queued, claimed, ""))
    return sorted(rows, key=lambda q: q.name)


async def snapshot(be: RedisBackend) -> SharedStatus:
    """What Redis says now about every fleet of the backend's namespace."""
    c = be.client
    layout = await _layout(be)
    coords, adoptions, queues, insts = [], [], [], []
    for fleet in sorted(layout):
        k = be.keys.of(fleet)
        for raw in await c.command("zrange", k.key("coords"), 0, -1):
            cid = raw.decode()
            info = await c.command("get", k.key("coord", cid))
            d = json.loads(info) if info else {}
            coords.append(CoordinatorRow(cid, str(d.get("host", "")), int(d.get("pid", 0)),
                                         int(await c.command("pttl", k.key("coord", cid))), fleet))
        for _, f in await c.command("xrange", k.key("adoptions"), "-", "+"):
            g = {a.decode(): v.decode() for a, v in f.items()}
            adoptions.append(Adoption(g["dead"], g["adopter"], int(g["leases"]), int(g["tasks"]),
                                      int(g["instances"]), int(g["at_ms"])))
        for name in _queues(layout[fleet]):
            queued, claimed = await depth(c, k.key("q", name))
            queues.append(QueueRow(name, queued, claimed, fleet))
        insts += await instances(be, fleet)
    queues += await _legacy_queues(be)
    return SharedStatus(redact_url(be.url), tuple(coords), tuple(adoptions), tuple(queues), tuple(insts))


async def replay(be: RedisBackend, store: MetadataStore) -> int:
    """Every fleet's stream into ``store``; how many events."""
    n = 0
    layout = await _layout(be)
    for fleet in sorted(f for f, rests in layout.items() if "events" in rests):
        key = be.keys.of(fleet).key("events")
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
