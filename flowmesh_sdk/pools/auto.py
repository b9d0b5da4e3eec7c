"""Automatic execution mode: one pool, two paths, chosen per task by its isolation.

* ``strict`` -- a fresh instance for the task, terminated after it (an ephemeral pool):
  nothing of another task can be on the machine;
* ``shared`` -- a fresh container on a warm instance (a persistent pool): milliseconds to
  start, the instance's kernel shared with other sandboxes.

A task's isolation is ``Task.isolation`` (or ``isolation=`` of :meth:`AutoPool.sandbox`),
else the pool's ``isolation`` (default ``strict``: an evaluation pool isolates unless told
otherwise).  Each choice is published as a ``task.routed`` event saying which path and
why.  The two halves are pools of their own, ``NAME-strict`` and ``NAME-shared``, on the
same search space, placement and budgets (the budgets are the pool's, shared by both
halves: each half is checked against the spend of both).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..control.events import Event, EventKind
from ..errors import SpecError
from ..images import ImageInfo
from ..placement.ranking import Placement
from ..provider import Offer, Provider
from ..sandbox import Sandbox
from ..specs import ISOLATIONS, PoolMode, PoolSpec, SandboxSpec, Task, TaskResult, check_choice
from .base import MachinePool, PoolContext
from .ephemeral import EphemeralPool
from .instance import ManagedInstance
from .machines import ReconcileResult
from .persistent import PersistentPool
from .pool import Pool
from .records import AutoStats


def _half(spec: PoolSpec, suffix: str, mode: PoolMode) -> PoolSpec:
    name = f"{spec.name[:40 - len(suffix) - 1].rstrip('-')}-{suffix}"
    changes: dict[str, Any] = {"name": name, "mode": mode, "isolation": None}
    if mode is PoolMode.EPHEMERAL:
        changes["min_instances"] = 0
    return replace(spec, **changes)


class AutoPool(Pool):
    """A ``mode="auto"`` pool (see the module docstring): a :class:`Pool` over one of each kind."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, providers: Mapping[str, Provider],
                 placement: Placement) -> None:
        self.ctx = ctx
        self.spec = spec
        self.name = spec.name
        self.strict = EphemeralPool(ctx, _half(spec, "strict", PoolMode.EPHEMERAL), providers,
                                    _reranked(placement, spec, PoolMode.EPHEMERAL))
        self.shared = PersistentPool(ctx, _half(spec, "shared", PoolMode.PERSISTENT), providers, placement)
        # the budgets are this pool's: both halves count against the spend of both
        for half in (self.strict, self.shared):
            half.machines.budget_pools = (self.strict.name, self.shared.name)

    def __repr__(self) -> str:
        return f"AutoPool({self.name!r}, default isolation {self.spec.default_isolation})"

    async def start(self) -> AutoPool:
        await self.shared.start()
        await self.strict.start()
        return self

    # ---- routing -----------------------------------------------------------------------
    def route(self, isolation: str | None, what: str) -> MachinePool:
        if isolation is not None:
            check_choice("isolation", isolation, ISOLATIONS)
            path, why = isolation, "asked by the task"
        else:
            path, why = self.spec.default_isolation, "the pool's default isolation"
        self.ctx.bus.publish(Event(EventKind.TASK_ROUTED, fleet=self.ctx.fleet, pool=self.name, task_name=what,
                                   detail=json.dumps({"path": path, "why": why,
                                                      "to": self.strict.name if path == "strict"
                                                      else self.shared.name}, sort_keys=True)))
        return self.strict if path == "strict" else self.shared

    @contextlib.asynccontextmanager
    async def sandbox(self, spec: SandboxSpec | None = None, *, image: str | None = None,
                      tenant: str = "default", name: str | None = None,
                      isolation: str | None = None) -> AsyncIterator[Sandbox]:
        pool = self.route(isolation, name or "sandbox")
        async with pool.sandbox(spec, image=image, tenant=tenant, name=name) as sb:
            yield sb

    async def run_task(self, task: Task) -> TaskResult:
        if not isinstance(task, Task):
            raise SpecError("task", f"must be a Task, got {type(task).__name__}")
        return await self.route(task.isolation, task.name).run_task(task)

    def default_sandbox(self, image: str) -> SandboxSpec:
        return self.shared.default_sandbox(image)

    async def prefetch(self, images: Iterable[str]) -> list[ImageInfo]:
        return await self.shared.prefetch(images)   # strict instances are fresh per task

    # ---- the pool's surface --------------------------------------------------------------
    @property
    def instances(self) -> dict[str, ManagedInstance]:
        return {**self.strict.instances, **self.shared.instances}

    @property
    def offers(self) -> tuple[Offer, ...]:
        return self.shared.offers

    @property
    def placement(self) -> Placement:
        return self.shared.placement

    @property
    def capacity(self) -> int:
        return self.strict.capacity + self.shared.capacity

    def stats(self) -> AutoStats:
        return AutoStats(self.name, self.strict.stats(), self.shared.stats())

    async def reconcile(self) -> ReconcileResult:
        a, b = await asyncio.gather(self.strict.reconcile(), self.shared.reconcile())
        return ReconcileResult(a.gone + b.gone, a.stopped + b.stopped, a.retried + b.retried)

    async def drain(self, timeout_s: float | None = None) -> None:
        await asyncio.gather(self.strict.drain(timeout_s), self.shared.drain(timeout_s))

    @property
    def closed(self) -> bool:
        return self.strict.closed and self.shared.closed


def _reranked(placement: Placement, spec: PoolSpec, mode: PoolMode) -> Placement:
    """The strict half holds one sandbox per instance: the same offers, one slot each,
    ranked again for that (a big machine for one sandbox rarely wins)."""
    from ..placement.ranking import rank

    offers = placement.offers()
    return Placement(rank(offers, _half(spec, "strict", mode)), list(placement.excluded))
