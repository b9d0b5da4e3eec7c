"""What every coordinator of one fleet shares besides the limits: its instances (owned by
the fleet, held by one live coordinator, handed to an adopter when that one dies) and
its spend, so that budgets bound the whole fleet, whoever launches.

:class:`SharedSpendLedger` is the fleet's :class:`~flowmesh_sdk.control.spend.SpendLedger`
with every charge also written to Redis at *server* time, and the other coordinators'
charges mirrored in every ``refresh_s`` (their times turned into this process's clock by
differences of server times, so clocks that disagree do not matter).  Budgets are
therefore fleet-wide to within ``refresh_s``: two coordinators launching in the same
instant can each see the other's launch up to ``refresh_s`` late.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import TYPE_CHECKING

from ... import clock
from ...catalog.profiles import profile
from ...errors import FlowMeshError
from ..shared import SharedHolders, SharedInstance
from ..spend import Charge, SpendLedger

if TYPE_CHECKING:
    from .context import RedisAccess, RedisContext

log = logging.getLogger("flowmesh.control.redis")


class SharedSpendLedger(SpendLedger):
    def __init__(self, ctx: RedisContext, fleet: str, *, refresh_s: float = 1.0) -> None:
        super().__init__()
        self.ctx = ctx
        self.fleet = fleet
        self.refresh_s = refresh_s
        self._mine: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def _keys(self) -> tuple[str, str, str, str]:
        be = self.ctx
        return be.key("charges"), be.key("instances"), be.key("holder"), be.coordinator.instances_key

    def start(self, instance_id: str, *, pool: str, provider: str, price_per_hour: float,
              billing_min_s: float | None = None) -> None:
        fresh = instance_id not in self._charges
        super().start(instance_id, pool=pool, provider=provider, price_per_hour=price_per_hour,
                      billing_min_s=billing_min_s)
        if not fresh:
            return
        self._mine.add(instance_id)
        minimum = profile(provider).billing_min_s if billing_min_s is None else billing_min_s
        charge = json.dumps({"pool": pool, "provider": provider, "price": float(price_per_hour), "min_s": minimum})
        inst = json.dumps({"pool": pool, "provider": provider, "host": socket.gethostname()})
        self.ctx.spawn(self.ctx.client.script(
            "CHARGE_START", self._keys(), (self.fleet, instance_id, self.ctx.coordinator.id, charge, inst)))

    def end(self, instance_id: str) -> None:
        super().end(instance_id)
        self.ctx.spawn(self.ctx.client.script("CHARGE_END", self._keys(), (self.fleet, instance_id)))

    async def refresh(self) -> None:
        """Mirror the other coordinators' charges now."""
        flat = await self.ctx.client.script("CHARGES", (self._keys()[0],), ())
        server_now, mono_now = int(flat[0]), clock.monotonic()
        for i in range(1, len(flat), 2):
            cid = flat[i].decode()
            if cid in self._mine:
                continue
            d = json.loads(flat[i + 1])
            started = mono_now - (server_now - int(d["started_ms"])) / 1000.0
            ended = None if d.get("ended_ms") is None else mono_now - (server_now - int(d["ended_ms"])) / 1000.0
            self.put(Charge(cid, d["pool"], d["provider"], float(d["price"]), started, float(d["min_s"]), ended))

    def run(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except FlowMeshError as exc:
                log.warning("fleet %s: spend refresh failed: %s", self.fleet, exc)
            await asyncio.sleep(self.refresh_s)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


async def instances(ctx: RedisAccess, fleet: str) -> list[SharedInstance]:
    """The fleet's live instances and which coordinator holds each."""
    k = ctx.keys.of(fleet)
    rows = await ctx.client.command("hgetall", k.key("instances"))
    holders = await ctx.client.command("hgetall", k.key("holder"))
    out = []
    for iid, v in sorted(rows.items()):
        d = json.loads(v)
        out.append(SharedInstance(iid.decode(), fleet, d.get("pool", ""), d.get("provider", ""),
                                  holders.get(iid, b"").decode(), d.get("host", "")))
    return out


async def forget(ctx: RedisAccess, inst: SharedInstance) -> None:
    """``inst`` is gone (terminated by ``flowmesh gc``): its charge ends at server time and
    it leaves the fleet's list and its holder's."""
    k = ctx.keys.of(inst.fleet)
    keys = (k.key("charges"), k.key("instances"), k.key("holder"), k.key("coord", inst.holder, "instances"))
    await ctx.client.script("CHARGE_END", keys, (inst.fleet, inst.id))


async def fleets(ctx: RedisAccess, *, having: str = "instances") -> list[str]:
    """The fleets of the backend's namespace that have the key ``having`` (``instances``:
    those with instances listed; ``epoch``: those a coordinator ever joined)."""
    ks, found = ctx.keys, set()
    async for raw in ctx.client.redis.scan_iter(match=ks.pattern(having), count=500):
        key = raw.decode()
        fleet = ks.fleet_of(key)
        if fleet is not None and key == ks.of(fleet).key(having):
            found.add(fleet)
    return sorted(found)


async def live_coordinators(ctx: RedisAccess, fleet: str) -> frozenset[str]:
    """The coordinators of ``fleet`` whose lease runs."""
    k = ctx.keys.of(fleet)
    coords = [c.decode() for c in await ctx.client.command("zrange", k.key("coords"), 0, -1)]
    alive = await asyncio.gather(*(ctx.client.command("exists", k.key("coord", c)) for c in coords))
    return frozenset(c for c, a in zip(coords, alive) if a)


async def holders(ctx: RedisAccess, fleet: str | None = None) -> SharedHolders:
    """``fleet``'s instances (every fleet's: None) and the coordinators whose lease runs."""
    names = [fleet] if fleet is not None else await fleets(ctx)
    insts = [i for f in names for i in await instances(ctx, f)]
    live = [await live_coordinators(ctx, f) for f in names]
    return SharedHolders(tuple(insts), frozenset().union(*live))
