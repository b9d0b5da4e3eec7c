"""Persistent pools: warm instances reused, a fresh container per task.

* Placement prefers an instance holding a warm container of the same shape, then one
  that already holds the image (locality), then the least loaded.
* Warm containers (``warm_per_image`` per sandbox shape, at most one instance's worth of
  slots in all) are started ahead of demand with their command channel open, so
  acquiring one costs a few milliseconds.  They do not take slots.  A shape is what a
  container fixes at creation: image, cpus, memory, pids, network, workdir.  Images in
  ``PoolSpec.warm_images`` are warmed in the shape of :meth:`Pool.default_sandbox`; other
  shapes are warmed after their first use.
* Elastic between ``min_instances`` and ``max_instances`` on queue depth: when the tasks
  waiting for a slot outnumber the free and coming slots, more instances are launched in
  one batched call.  A failed launch backs scaling off for a while.
* Instances idle for ``idle_timeout_s`` beyond ``min_instances`` are reclaimed by a timer
  that sleeps until the next instance could become idle (no polling), in batches: at most
  ``REAP_GRANULARITY`` of ``idle_timeout_s`` late.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

from .. import clock, timers
from ..control.events import EventKind
from ..errors import SandboxTimeout
from ..images import ImageInfo
from ..lifecycle import InstanceState
from ..sandbox import Sandbox
from ..specs import SandboxSpec
from .base import COALESCE_S, MachinePool, TaskRun
from .instance import ManagedInstance, WarmKey, warm_key

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..placement.ranking import Placement
    from ..provider import Provider
    from ..specs import PoolSpec
    from .base import PoolContext

log = logging.getLogger("flowmesh.pools")

LAUNCH_BACKOFF_S = 30.0
REAP_GRANULARITY = 0.05   # the reaper sleeps at least this share of idle_timeout_s between scans
# A refill (_make_warm) starts once its instance has had no take for WARM_REFILL_QUIET_S, and
# at the latest WARM_REFILL_MAX_WAIT_S after the take it replaces: a burst's takes are not
# slowed by the container starts of their own refills (each a fork and exec on the loop, and a
# container runtime's CPU beside the takes' first commands), and a steady stream of takes
# still gets its stock back.
WARM_REFILL_QUIET_S = 0.1
WARM_REFILL_MAX_WAIT_S = 1.0


class PersistentPool(MachinePool):
    def __init__(self, ctx: PoolContext, spec: PoolSpec, providers: Mapping[str, Provider],
                 placement: Placement) -> None:
        super().__init__(ctx, spec, providers, placement)
        self._cond = asyncio.Condition()
        self._pending = 0            # instances asked for and not yet READY or failed
        self._want = 0               # admitted tasks waiting for a slot
        self._launch_error: BaseException | None = None
        self._blocked_until = 0.0
        self._wake_reaper = asyncio.Event()
        self._room: dict[str, ManagedInstance] = {}   # READY instances that had a free slot
        self._scale_soon: asyncio.Task[object] | None = None
        self._reap_at: float | None = None   # when the sleeping reaper wakes by itself

    def _capacity(self) -> int:
        max_instances = self.spec.max_instances or 1   # PoolSpec sets it (>= 1)
        return self.spec.concurrency or max_instances * self.placement.candidates[0].slots

    async def start(self) -> PersistentPool:
        """Launch ``min_instances`` (waiting until they are READY) and start the reaper."""
        warm = [await self.ctx.images.resolve(image, arch=self.spec.instance.arch)   # fail fast
                for image in self.spec.warm_images]
        need = self.spec.min_instances - self._live()
        if need > 0:
            self._pending += need
            await self._launch_counted(need)
        for info in warm:
            for mi in list(self.instances.values()):
                self._refill_warm(mi, self.default_sandbox(info.image), info)
        self._spawn(self._reap_idle(), daemon=True)
        return self

    def _ready(self) -> list[ManagedInstance]:
        return [i for i in self.instances.values() if i.state is InstanceState.READY]

    def _live(self) -> int:
        return len(self._ready()) + self._pending

    # ---- scheduling ------------------------------------------------------------
    async def _place(self, spec: SandboxSpec, info: ImageInfo, run: TaskRun) -> ManagedInstance:
        key = warm_key(spec, info.digest) if self.spec.warm_per_image else None   # no warm pool: no key
        deadline = clock.monotonic() + self.ctx.bootstrap_timeout_s
        async with self._cond:
            self._want += 1
            try:
                while True:
                    mi = self._pick(key, info)
                    if mi is not None:
                        mi.active += 1
                        mi.last_used = clock.monotonic()
                        if mi.free <= 0:
                            self._room.pop(mi.id, None)
                        return mi
                    self._request_scale()
                    if self._launch_error is not None and not self._pending and not self._ready():
                        raise self._launch_error
                    remaining = deadline - clock.monotonic()
                    if remaining <= 0:
                        raise SandboxTimeout(f"pool {self.name!r}: no slot became free within "
                                             f"{self.ctx.bootstrap_timeout_s:g} s")
                    try:
                        async with timers.timeout(remaining):
                            await self._cond.wait()
                    except TimeoutError:
                        continue
            except BaseException:
                # A woken waiter that leaves (cancelled, timed out) passes its wake-up on,
                # so a freed slot never waits for a task that is gone.
                if self._room:
                    self._cond.notify(1)
                raise
            finally:
                self._want -= 1

    def _pick(self, key: WarmKey | None, info: ImageInfo) -> ManagedInstance | None:
        """A warm container of this shape first, then locality (image or its layers held),
        then the most free slots.  Looks only at instances with room (an index kept as
        slots are taken and given back), so placing is cheap with thousands of busy ones."""
        cands = []
        for i in list(self._room.values()):
            if i.free > 0:
                cands.append(i)
            else:
                del self._room[i.id]   # full, or no longer READY
        if not cands:
            return None
        return max(cands, key=lambda i: (key is not None and bool(i.warm.get(key)), i.locality(info), i.free))

    def _has_room(self, mi: ManagedInstance) -> None:
        if mi.free > 0:
            self._room[mi.id] = mi

    def _request_scale(self) -> None:
        """Decide on scaling once per burst of waiting tasks (``COALESCE_S`` later), so that a
        burst of N tasks becomes one launch of the instances they need, not N launches."""
        if self._scale_soon is None:
            self._scale_soon = self._spawn(self._scale_after(COALESCE_S))

    async def _scale_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        self._scale_soon = None
        self._maybe_scale_up()

    def _maybe_scale_up(self) -> None:
        # Even while draining: tasks admitted before the drain still need their slots.
        if clock.monotonic() < self._blocked_until:
            return
        slots = self.machines.slots_hint()
        free = sum(i.free for i in self._room.values() if i.state is InstanceState.READY)
        short = self._want - free - self._pending * slots
        max_instances = self.spec.max_instances or 1   # PoolSpec sets it (>= 1)
        n = min(math.ceil(short / slots), max_instances - self._live()) if short > 0 else 0
        if n > 0:
            self._pending += n
            self._spawn(self._scale_up(n))

    async def _launch_counted(self, n: int) -> int:
        """Launch ``n``, already counted in ``_pending`` by the caller (so that scaling
        decisions taken meanwhile see them): each leaves the count when READY (and the
        waiters are woken at once) or when it failed.  Returns how many became READY."""
        left = [n]

        def ready(mi: ManagedInstance) -> None:
            left[0] -= 1
            self._pending -= 1
            self._has_room(mi)
            self._spawn(self._wake_placers(mi.free))

        try:
            return await self.machines.launch(n, on_ready=ready)
        finally:
            self._pending -= left[0]

    async def _scale_up(self, n: int) -> None:
        self._publish(EventKind.POOL_SCALED, detail=f"+{n} (live {self._live()} of max "
                                                     f"{self.spec.max_instances})")
        try:
            if await self._launch_counted(n) < n:
                self._blocked_until = clock.monotonic() + LAUNCH_BACKOFF_S
            self._launch_error = None
        except Exception as exc:  # noqa: BLE001 - reported to the waiters
            log.warning("pool %s: launch of %d instance(s) failed: %s", self.name, n, exc)
            self._launch_error = exc
            self._blocked_until = clock.monotonic() + LAUNCH_BACKOFF_S
        finally:
            self._wake_reaper_if_idle()
            async with self._cond:
                self._cond.notify_all()

    # ---- sandboxes -------------------------------------------------------------
    async def _provision(self, spec: SandboxSpec, info: ImageInfo, inst: ManagedInstance | None,
                         run: TaskRun) -> Sandbox:
        assert inst is not None
        inst.last_take = clock.monotonic()
        sb = inst.take_warm(warm_key(spec, info.digest)) if self.spec.warm_per_image else None
        if sb is None:
            sb = await self._new_sandbox(inst, spec, info, run.id)
        else:
            sb.spec = spec  # same container shape; env and timeouts are the caller's
        self._refill_warm(inst, spec, info)
        return sb

    def _refill_warm(self, mi: ManagedInstance, spec: SandboxSpec, info: ImageInfo) -> None:
        if self._closing or not self.spec.warm_per_image:
            return
        key = warm_key(spec, info.digest)
        for _ in range(self.spec.warm_per_image - mi.warm_count(key)):   # every one missing, not one a call
            mi.warming[key] = mi.warming.get(key, 0) + 1
            self._spawn(self._make_warm(mi, key, spec, info))

    async def _make_warm(self, mi: ManagedInstance, key: WarmKey, spec: SandboxSpec,
                         info: ImageInfo) -> None:
        try:
            latest = clock.monotonic() + WARM_REFILL_MAX_WAIT_S
            while (wait := min(mi.last_take + WARM_REFILL_QUIET_S, latest) - clock.monotonic()) > 0:
                await asyncio.sleep(wait)   # the takes of a burst first (WARM_REFILL_QUIET_S)
            async with mi.warm_starts:   # a few at a time: a burst's takes are not starved by its refills
                sb = await self._new_sandbox(mi, spec, info, "warm")
        finally:
            mi.warming[key] -= 1
        if self._closing or mi.state is not InstanceState.READY:
            await self._close_sandbox(sb)
            return
        stack = mi.warm.pop(key, [])
        stack.append(sb)
        mi.warm[key] = stack  # most recently used shape last
        # bound the warm containers of one instance to its slot count: evict the oldest shapes
        while sum(len(v) for v in mi.warm.values()) > mi.slots:
            oldest = next(iter(mi.warm))
            victims = mi.warm.pop(oldest)
            await asyncio.gather(*(self._close_sandbox(v) for v in victims), return_exceptions=True)

    async def _teardown(self, sandbox: Sandbox | None, inst: ManagedInstance | None) -> None:
        try:
            await self._close_sandbox(sandbox)
        finally:
            if inst is not None:
                inst.active -= 1
                inst.last_used = clock.monotonic()
                if inst.state is InstanceState.READY:
                    self._has_room(inst)
            self._wake_reaper_if_idle()
            async with self._cond:
                self._cond.notify(1)

    # ---- idle reclaim ------------------------------------------------------------
    def _wake_reaper_if_idle(self) -> None:
        """An instance idle from now is due after every one already idle, so the reaper
        needs waking only when it is not already sleeping until one (no deadline)."""
        if self._reap_at is None:
            self._wake_reaper.set()

    async def _reap_idle(self) -> None:
        idle_s = self.spec.idle_timeout_s
        while not self._closing:
            now = clock.monotonic()
            async with self._cond:
                # idle instances have room, so the room index holds them all (busy ones are
                # not looked at: thousands of them cost nothing here)
                idle = sorted((i for i in self._room.values()
                               if i.active == 0 and i.state is InstanceState.READY), key=lambda i: i.last_used)
                due = [i for i in idle if now - i.last_used >= idle_s]
                # how many may go (beyond min_instances) is counted only when some are due
                excess = len(self._ready()) - self.spec.min_instances if due else len(idle)
                reap = due[:max(0, excess)]
                for mi in reap:
                    mi.lifecycle.to(InstanceState.DRAINING)
                    self._publish(EventKind.INSTANCE_DRAINING, instance_id=mi.id, detail="idle")
            if reap:
                await self.machines.terminate(reap)
                continue
            waiting = [i.last_used + idle_s - now for i in idle] if excess > 0 else []
            # wake no more often than every REAP_GRANULARITY of idle_s: instances going idle
            # one by one are then reaped in batches (one terminate call, one scan) rather
            # than one at a time, at the price of up to that much extra idle time
            sleep = max(min(waiting), idle_s * REAP_GRANULARITY) if waiting else None
            self._wake_reaper.clear()
            self._reap_at = now + sleep if sleep is not None else None
            try:
                await asyncio.wait_for(self._wake_reaper.wait(), sleep)
            except asyncio.TimeoutError:
                pass
            finally:
                self._reap_at = None

    def _on_instance_failed(self) -> None:
        self._spawn(self._wake_placers())

    def _after_reconcile(self, result: object) -> None:
        """Keep ``min_instances``: what the reconciler found gone is launched again."""
        need = self.spec.min_instances - self._live()
        if need > 0 and not self._closing:
            self._pending += need
            self._publish(EventKind.POOL_SCALED, detail=f"+{need} to keep min_instances "
                                                         f"({self.spec.min_instances}) after reconcile")
            self._spawn(self._replace(need))

    async def _replace(self, n: int) -> None:
        try:
            await self._launch_counted(n)
        except Exception as exc:  # noqa: BLE001 - reported; the next reconcile tries again
            log.warning("pool %s: replacing %d instance(s) after reconcile failed: %s", self.name, n, exc)
        finally:
            async with self._cond:
                self._cond.notify_all()

    async def _wake_placers(self, n: int | None = None) -> None:
        """Wake ``n`` waiting tasks (all when None: a change every waiter must see)."""
        async with self._cond:
            if n is None:
                self._cond.notify_all()
            else:
                self._cond.notify(n)

    def _on_closing(self) -> None:
        self._wake_reaper.set()
