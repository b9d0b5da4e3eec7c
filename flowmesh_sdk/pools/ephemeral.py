"""Ephemeral pools: a fresh instance per task, terminated after it (perfect isolation).

Tasks that ask for an instance within ``COALESCE_S`` of each other share ONE launch call
for all of them (one ``RunInstances`` for a burst of N tasks, not N), and each gets its
own instance from the batch.
"""

from __future__ import annotations

import asyncio

from ..errors import CapacityError
from ..images import ImageInfo
from ..sandbox import Sandbox
from ..specs import SandboxSpec
from .base import Pool, TaskRun
from .instance import ManagedInstance

COALESCE_S = 0.02   # how long a launch waits for company


class EphemeralPool(Pool):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._waiting: list[asyncio.Future[ManagedInstance]] = []
        self._flush: asyncio.Task[None] | None = None

    def _capacity(self) -> int:
        return self.spec.max_instances

    async def _place(self, spec: SandboxSpec, info: ImageInfo, run: TaskRun) -> ManagedInstance | None:
        return None  # the instance is made for this task in _provision

    async def _provision(self, spec: SandboxSpec, info: ImageInfo, inst: ManagedInstance | None,
                         run: TaskRun) -> Sandbox:
        mi = await self._instance()
        mi.active = 1
        try:
            return await self._new_sandbox(mi, spec, info, run.id)
        except BaseException:
            await self._terminate([mi])
            raise

    async def _instance(self) -> ManagedInstance:
        fut: asyncio.Future[ManagedInstance] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        if self._flush is None:
            self._flush = asyncio.ensure_future(self._launch_batch())
        return await fut

    async def _launch_batch(self) -> None:
        await asyncio.sleep(COALESCE_S)
        batch, self._waiting, self._flush = self._waiting, [], None
        batch = [f for f in batch if not f.done()]
        if not batch:
            return
        try:
            ready = await self._launch(len(batch))
        except BaseException as exc:
            for fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        spare: list[ManagedInstance] = []
        for fut in batch:
            if fut.done():                 # its task was cancelled meanwhile
                continue
            if ready:
                fut.set_result(ready.pop(0))
            else:
                fut.set_exception(CapacityError(f"pool {self.name!r}: {len(batch)} instances asked "
                                                "in one launch, fewer came up", code="PartialLaunch"))
        spare += ready
        if spare:
            await self._terminate(spare)

    async def _teardown(self, sandbox: Sandbox | None, inst: ManagedInstance | None) -> None:
        try:
            await self._close_sandbox(sandbox)
        finally:
            if inst is not None and inst.id in self.instances:
                await self._terminate([inst])
