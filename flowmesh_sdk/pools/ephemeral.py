"""Ephemeral pools: a fresh instance per task, terminated after it (perfect isolation)."""

from __future__ import annotations

from ..images import ImageInfo
from ..sandbox import Sandbox
from ..specs import SandboxSpec
from .base import Pool, TaskRun
from .instance import ManagedInstance


class EphemeralPool(Pool):
    def _capacity(self) -> int:
        return self.spec.max_instances

    async def _place(self, spec: SandboxSpec, info: ImageInfo, run: TaskRun) -> ManagedInstance | None:
        return None  # the instance is made for this task in _provision

    async def _provision(self, spec: SandboxSpec, info: ImageInfo, inst: ManagedInstance | None,
                         run: TaskRun) -> Sandbox:
        (mi,) = await self._launch(1)
        mi.active = 1
        try:
            return await self._new_sandbox(mi, spec, info, run.id)
        except BaseException:
            await self._terminate([mi])
            raise

    async def _teardown(self, sandbox: Sandbox | None, inst: ManagedInstance | None) -> None:
        try:
            await self._close_sandbox(sandbox)
        finally:
            if inst is not None and inst.id in self.instances:
                await self._terminate([inst])
