"""A coordinator's membership of the shared fleet: its lease, its heartbeat, and the
reaper that adopts the work of coordinators whose lease lapsed.

The lease is a Redis key with a TTL (``PEXPIRE``) that only the server's clock runs
down; a heartbeat every ``lease_s / 3`` pushes it -- and every lease the coordinator
holds -- forward.  Coordinators' own clocks never enter: a coordinator whose clock is
hours off holds and loses leases exactly like the others.

When a heartbeat finds its own lease gone (the process was paused, or cut off from
Redis, for longer than ``lease_s``) the coordinator has been, or is about to be, adopted:
it is *fenced* -- ``on_lost`` is called (a runner cancels its in-flight work, whose
results another coordinator will publish), and it joins again under a new id.  When it
finds the fleet's epoch gone, Redis lost its data (no AOF); that is reported as an error,
never papered over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable

from ...errors import ControlPlaneUnavailableError, FlowMeshError
from ...specs import check_number
from ..shared import Adoption, SharedInstance
from .client import RedisClient
from .keys import FleetKeys

log = logging.getLogger("flowmesh.control.redis")


class Coordinator:
    def __init__(self, client: RedisClient, keys: FleetKeys, *, lease_s: float = 5.0,
                 on_lost: Callable[[str], None] | None = None,
                 on_adopted: Callable[[Adoption], None] | None = None) -> None:
        check_number("state.lease_s", lease_s, lo=0.1)
        self.client = client
        self.keys = keys
        self.lease_ms = int(lease_s * 1000)
        self.on_lost = on_lost
        self.on_adopted = on_adopted
        self.id = ""
        self.epoch = ""
        self.lost = False
        self.state_lost = False
        self.adoptions: list[Adoption] = []
        self._hb: asyncio.Task[None] | None = None
        self._joined = asyncio.Event()
        self._new_id()

    def _new_id(self) -> None:
        self.id = f"{socket.gethostname()[:20]}-{os.getpid()}-{uuid.uuid4().hex[:6]}"

    # ---- keys ----------------------------------------------------------------------
    def key(self, *parts: str) -> str:
        return self.keys.key(*parts)

    @property
    def coord_key(self) -> str:
        return self.key("coord", self.id)

    @property
    def leases_key(self) -> str:
        return self.key("coord", self.id, "leases")

    @property
    def instances_key(self) -> str:
        return self.key("coord", self.id, "instances")

    # ---- life ----------------------------------------------------------------------
    async def join(self) -> None:
        info = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})
        ep, _ = await self.client.script("REGISTER", (self.coord_key, self.key("coords"), self.key("epoch")),
                                         (self.id, self.lease_ms, uuid.uuid4().hex, info))
        ep = ep.decode() if isinstance(ep, bytes) else str(ep)
        if self.epoch and ep != self.epoch:
            self.state_lost = True
        self.epoch = ep
        self.lost = False
        self._joined.set()
        if self._hb is None:
            self._hb = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        period = self.lease_ms / 3000.0
        while True:
            await asyncio.sleep(period)
            try:
                await self.beat()
                await self.reap()
            except ControlPlaneUnavailableError as exc:
                log.warning("coordinator %s: heartbeat failed: %s", self.id, exc)
            except FlowMeshError as exc:
                log.error("coordinator %s: %s", self.id, exc)

    async def beat(self) -> int:
        """Renew this coordinator's lease and every lease it holds; fence and rejoin if it
        lapsed.  Returns how many leases were renewed."""
        n, _ = await self.client.script(
            "HEARTBEAT", (self.coord_key, self.leases_key, self.key("coords"), self.key("epoch")),
            (self.id, self.lease_ms, self.epoch))
        if n >= 0:
            return int(n)
        reason = ("the control state was lost (Redis restarted without its data)" if n == -2
                  else f"coordinator {self.id}'s lease lapsed (paused or cut off for more than "
                       f"{self.lease_ms / 1000:g} s); its work is adopted by another coordinator")
        log.error("%s; fencing and joining again", reason)
        self.state_lost = self.state_lost or n == -2
        self.lost = True
        self._joined.clear()
        old = self.id
        self._new_id()
        if self.on_lost is not None:
            self.on_lost(reason)
        await self.join()
        log.info("coordinator %s rejoined as %s", old, self.id)
        return 0

    async def reap(self) -> list[Adoption]:
        """Adopt the work of every coordinator whose lease lapsed (one adopter wins each);
        ``on_adopted`` hears of each adoption (its instances are this coordinator's now)."""
        flat = await self.client.script("ADOPT", (self.key("coords"), self.key("adoptions")),
                                        (self.keys.prefix, self.id, self.keys.fleet))
        out = []
        for i in range(0, len(flat), 5):
            dead = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
            adopted = tuple(SharedInstance(d["id"], d["fleet"], str(d.get("pool", "")), str(d.get("provider", "")),
                                           self.id, str(d.get("host", "")))
                            for d in json.loads(flat[i + 4]))
            a = Adoption(dead, self.id, int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]), 0, adopted)
            log.warning("coordinator %s adopted dead coordinator %s: %d leases dropped, %d tasks requeued, "
                        "%d instances", self.id, dead, a.leases, a.tasks, a.instances)
            out.append(a)
            if self.on_adopted is not None:
                self.on_adopted(a)
        self.adoptions.extend(out)
        return out

    def check(self) -> None:
        """Raise if this coordinator may not take new leases now."""
        if self.state_lost:
            raise ControlPlaneUnavailableError(
                f"the control state at {self.client!r} was lost (Redis restarted without its data); run "
                "redis-server with appendonly yes (see docs/operations.md)", url=self.client.url)

    async def lapsed(self) -> None:
        """A script found this coordinator's lease gone: beat now (fence and rejoin)."""
        await self.beat()

    async def leave(self) -> None:
        """Stop heartbeating and give every lease back (a clean exit adopts itself)."""
        if self._hb is not None:
            self._hb.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hb
            self._hb = None
        with contextlib.suppress(FlowMeshError):
            await self.client.command("delete", self.coord_key)
            await self.client.command("zadd", self.key("coords"), {self.id: 0})
            await self.client.script("ADOPT", (self.key("coords"), self.key("adoptions")),
                                     (self.keys.prefix, "-", self.keys.fleet))
