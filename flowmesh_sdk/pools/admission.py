"""A pool's admission, a component the pool composes.  Admission runs three tiers in
order: the tenant's quota (rejects at once), then the pool's semaphore (in-flight <=
capacity, FIFO queue), then placement (the pool's own).  An image is resolved before any
of it, so a task with a missing image takes no slot and launches nothing.  This holds
the checks and the first two tiers, and counts the tasks in flight (the pool drains when
none are)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ..control.limits import Quota, Semaphore
from ..images import ImageInfo
from ..specs import PoolSpec, SandboxSpec
from .records import PoolContext


class Admission:
    """One pool's admission (see the module docstring)."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, capacity: int) -> None:
        self.ctx = ctx
        self.spec = spec
        self.sem: Semaphore = ctx.control.semaphore(f"fleet:{ctx.fleet}:pool:{spec.name}", capacity)
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def check(self, spec: SandboxSpec, tenant: str) -> tuple[SandboxSpec, ImageInfo]:
        """The checks at dispatch, before any slot is taken: the pool's kernel is every
        sandbox's floor, the sandbox fits the pool's slots, its image resolves, the tenant's
        quota admits it.  Returns the sandbox (on the pool's kernel) and its image; raises
        :class:`~flowmesh_sdk.errors.FlowMeshError` for what failed."""
        if spec.kernel != self.spec.kernel and self.spec.kernel != "host":
            spec = replace(spec, kernel=self.spec.kernel)   # the pool's kernel is every sandbox's floor
        self.spec.check_fits(spec)
        info = await self.ctx.images.resolve(spec.image, arch=self.spec.instance.arch)
        await self.ctx.quota.admit_async(tenant)
        return spec, info

    def enter(self) -> None:
        """A task is in flight (checked, not yet torn down)."""
        self.in_flight += 1
        self.idle.clear()

    def leave(self) -> None:
        """A task is no longer in flight."""
        self.in_flight -= 1
        if self.in_flight == 0:
            self.idle.set()

    async def acquire(self) -> None:
        """The pool's semaphore: wait (FIFO) for a place among its capacity."""
        await self.sem.acquire()

    def release_now(self, tenant: str, admitted: bool) -> bool:
        """Give the permit and slot back at once where both live in this process (the local
        backend: nothing to await, so no shielded task per task, issue 29); False where a
        backend elsewhere must be asked (:meth:`release`)."""
        if type(self.sem) is not Semaphore or type(self.ctx.quota) is not Quota:
            return False
        if admitted:
            self.sem.release()
        self.ctx.quota.release(tenant)
        return True

    async def release(self, tenant: str, admitted: bool) -> None:
        """Give the permit (when ``admitted``) and the tenant's quota slot back."""
        if admitted:
            await self.sem.release_async()
        await self.ctx.quota.release_async(tenant)
