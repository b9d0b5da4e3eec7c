"""Persistent pools of instances that are containers (pods, Vast.ai instances): warm pods.

Where every provider of a pool runs each sandbox as its own instance
(``nested_containers=False``), a persistent pool cannot keep machines and start
containers on them.  It keeps a *stock* instead: for each image of
``PoolSpec.warm_images``, ``warm_per_image`` instances launched from that image in the
shape of :meth:`Pool.default_sandbox`, each already READY with its sandbox's command
channel open.  A task of that shape takes a stocked one (no launch, no pull, no
bootstrap: the cost of a cold pod is paid before the task arrives) and a replacement is
launched at once; any other shape gets a cold instance, as in an ephemeral pool (an
image used once, as in SWE-bench, is not worth a warm pod).

Isolation is the ephemeral pool's: an instance a task used is terminated after it, never
given to another.  The stock counts against ``max_instances``: a cold launch at the cap
first terminates a stocked instance of another shape, and a replacement is launched only
while the pool is under its cap and no task waits for capacity.  ``min_instances`` must
be 0 (the stock is the warm capacity) and ``idle_timeout_s`` does not apply (stocked
instances live as long as the pool).  A stocked instance found lost (evicted, reclaimed)
is dropped and replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING

from .. import clock
from ..control.events import EventKind
from ..errors import FlowMeshError, SpecError
from ..images import ImageInfo
from ..lifecycle import InstanceState
from ..provider import ContainerRequest
from ..sandbox import Sandbox
from ..specs import SandboxSpec
from .base import PoolStats, TaskRun
from .ephemeral import EphemeralPool
from .instance import ManagedInstance
from .machines import ReconcileResult
from .persistent import LAUNCH_BACKOFF_S

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..placement.ranking import Placement
    from ..provider import Provider
    from ..specs import PoolSpec
    from .base import PoolContext

log = logging.getLogger("flowmesh.pools")


@dataclasses.dataclass
class _Shape:
    """One stocked shape: what its instances are launched from, and the stock."""

    request: ContainerRequest
    info: ImageInfo
    stock: list[tuple[ManagedInstance, Sandbox]] = dataclasses.field(default_factory=list)
    launching: int = 0
    blocked_until: float = 0.0        # after a failed refill: LAUNCH_BACKOFF_S


class WarmPodPool(EphemeralPool):
    """A persistent pool whose instances are containers (see the module docstring)."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, providers: Mapping[str, Provider],
                 placement: Placement) -> None:
        super().__init__(ctx, spec, providers, placement)
        if self.spec.min_instances:
            raise SpecError("pool.min_instances",
                            f"must be 0 for a persistent pool of {', '.join(sorted(self.providers))} "
                            "(its instances are containers: the warm stock is warm_per_image instances "
                            "per image of warm_images)")
        self._shapes: dict[Hashable, _Shape] = {}
        self._cap: int = self.spec.max_instances or 1   # set by PoolSpec
        self._cold = 0   # tasks on their way to a cold launch

    async def start(self) -> WarmPodPool:
        """Resolve ``warm_images`` (failing fast) and launch their stock, waiting until it
        is READY; a stock that cannot be launched is an error here, not at the first task."""
        for image in self.spec.warm_images:
            info = await self.ctx.images.resolve(image, arch=self.spec.instance.arch)
            request = ContainerRequest(info.run_ref, self.default_sandbox(image), stock=self.spec.warm_per_image)
            self._shapes.setdefault(request.key, _Shape(request, info))
        first = []
        for shape in self._shapes.values():
            for _ in range(min(self.spec.warm_per_image, self._cap - self._launching())):
                shape.launching += 1
                first.append(self._refill(shape, strict=True))
        await asyncio.gather(*first)
        return self

    # ---- taking from the stock ------------------------------------------------
    async def _provision(self, spec: SandboxSpec, info: ImageInfo, inst: ManagedInstance | None,
                         run: TaskRun) -> Sandbox:
        shape = self._shapes.get(ContainerRequest(info.run_ref, spec).key)
        while shape is not None and shape.stock:
            mi, sb = shape.stock.pop(0)
            if mi.state is not InstanceState.READY or mi.id not in self.instances:
                self._spawn(self._discard(mi, sb))   # lost while stocked
                continue
            mi.active = 1
            sb.spec = spec  # same shape; the default timeout is the caller's
            self._publish(EventKind.SANDBOX_READY, instance_id=mi.id, task_id=run.id,
                          detail=f"{sb.name} (warm)")
            self._top_up()
            return sb
        self._cold += 1   # its room is not the stock's to refill
        try:
            if len(self.instances) >= self._cap:
                victim = self._victim(exclude=shape)
                if victim is not None:
                    await self._discard(*victim)
            return await super()._provision(spec, info, inst, run)
        finally:
            self._cold -= 1

    def _victim(self, exclude: _Shape | None) -> tuple[ManagedInstance, Sandbox] | None:
        """A stocked instance to give up for a cold launch at the cap: of the shape with
        the most stock, not the task's own."""
        shapes = [s for s in self._shapes.values() if s.stock and s is not exclude]
        if not shapes:
            return None
        return max(shapes, key=lambda s: len(s.stock)).stock.pop()

    async def _discard(self, mi: ManagedInstance, sb: Sandbox) -> None:
        try:
            await self._close_sandbox(sb)
        finally:
            if mi.id in self.instances:
                await self._terminate_coalesced(mi)

    # ---- keeping the stock ----------------------------------------------------
    def _top_up(self) -> None:
        """Launch what each shape's stock lacks, while the pool is under its cap and no
        task waits for capacity or is on its way to a cold launch (tasks come first)."""
        if self._closing or self._cold or any(self._waiting.values()):
            return
        now = clock.monotonic()
        room = self._cap - len(self.instances) - self._launching()
        for shape in self._shapes.values():
            for mi, sb in [e for e in shape.stock if e[0].state is not InstanceState.READY]:
                shape.stock.remove((mi, sb))
                self._spawn(self._discard(mi, sb))
            if now < shape.blocked_until:
                continue
            while room > 0 and len(shape.stock) + shape.launching < self.spec.warm_per_image:
                room -= 1
                shape.launching += 1      # counted now: a second top-up does not launch it again
                self._spawn(self._refill(shape))

    def _launching(self) -> int:
        return sum(s.launching for s in self._shapes.values())

    async def _refill(self, shape: _Shape, *, strict: bool = False) -> None:
        """One more stocked instance of ``shape`` (its ``launching`` already counts it);
        ``strict``: a failure raises (at start), else it is logged and the shape backs off."""
        try:
            ready: list[ManagedInstance] = []
            await self.machines.launch(1, container=shape.request, on_ready=ready.append)
            for mi in ready:
                mi.active = 1        # not idle: it holds its sandbox
                try:
                    sb = await self._new_sandbox(mi, shape.request.sandbox, shape.info, "warm")
                except BaseException:
                    await self.machines.terminate([mi])
                    raise
                if self._closing or any(self._waiting.values()) or mi.state is not InstanceState.READY:
                    await self._discard(mi, sb)   # a task waits for this capacity
                else:
                    shape.stock.append((mi, sb))
                    self._publish(EventKind.POOL_SCALED, instance_id=mi.id,
                                  detail=f"warm {shape.info.image}: {len(shape.stock)} stocked")
        except FlowMeshError as exc:
            shape.blocked_until = clock.monotonic() + LAUNCH_BACKOFF_S
            if strict:
                raise
            log.warning("pool %s: warm instance of %s not launched: %s", self.name, shape.info.image, exc)
        finally:
            shape.launching -= 1

    def _retry_waiting(self) -> None:
        super()._retry_waiting()
        self._top_up()

    def _on_instance_failed(self) -> None:
        self._top_up()

    def _after_reconcile(self, result: ReconcileResult) -> None:
        self._top_up()

    def _on_closing(self) -> None:
        for shape in self._shapes.values():
            stock, shape.stock = shape.stock, []
            for _, sb in stock:   # their instances go with the pool's, in drain
                self._spawn(self._close_sandbox(sb))

    def stats(self) -> PoolStats:
        base = super().stats()
        return dataclasses.replace(base, warm=sum(len(s.stock) for s in self._shapes.values()),
                                   warming=self._launching())
