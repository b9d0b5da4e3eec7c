"""Ephemeral pools: a fresh instance per task, terminated after it (perfect isolation).

Tasks that ask for an instance within ``COALESCE_S`` of each other share ONE launch call
for all of them (one ``RunInstances`` for a burst of N tasks, not N; calls of at most the
provider's ``max_batch``), and each gets its own instance from the batch the moment that
instance is READY.  Where the pool may launch instances that are containers (a pod, a Vast.ai
instance: ``nested_containers=False``), each instance is its task's sandbox, launched from the
task's image: the tasks are batched per image and sandbox spec.  A burst wider than the
capacity (or the budget) launches what fits; the rest wait for this pool's instances to end.
Instances of tasks that end together are terminated in one call too.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import TYPE_CHECKING

from ..control.events import EventKind
from ..errors import BudgetExceededError, CapacityError, FlowMeshError
from ..lifecycle import InstanceState
from ..images import ImageInfo
from ..sandbox import Sandbox
from ..provider import ContainerRequest
from ..specs import SandboxSpec
from .base import COALESCE_S, MachinePool, TaskRun
from .instance import ManagedInstance

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..placement.ranking import Placement
    from ..provider import Provider
    from ..specs import PoolSpec
    from .base import PoolContext

_ENDED = (InstanceState.FAILED, InstanceState.TERMINATING, InstanceState.TERMINATED)


class EphemeralPool(MachinePool):
    def __init__(self, ctx: PoolContext, spec: PoolSpec, providers: Mapping[str, Provider],
                 placement: Placement) -> None:
        super().__init__(ctx, spec, providers, placement)
        # per container request's key (None: instances are machines, any task takes any)
        self._waiting: dict[Hashable, list[asyncio.Future[ManagedInstance]]] = {}
        self._flush: dict[Hashable, asyncio.Task[None]] = {}
        self._requests: dict[Hashable, ContainerRequest | None] = {}
        self._direct = any(not p.capabilities.nested_containers for p in self.machines.providers.values())
        self._ending: list[tuple[ManagedInstance, asyncio.Future[None]]] = []
        self._end_flush: asyncio.Task[None] | None = None

    def _capacity(self) -> int:
        return self.spec.concurrency or self.spec.max_instances or 1   # PoolSpec sets max_instances (>= 1)

    async def _place(self, spec: SandboxSpec, info: ImageInfo, run: TaskRun) -> ManagedInstance | None:
        return None  # the instance is made for this task in _provision

    async def _provision(self, spec: SandboxSpec, info: ImageInfo, inst: ManagedInstance | None,
                         run: TaskRun) -> Sandbox:
        mi = await self._instance(ContainerRequest(info.run_ref, spec) if self._direct else None)
        mi.active = 1
        try:
            return await self._new_sandbox(mi, spec, info, run.id)
        except BaseException:
            await self.machines.terminate([mi])
            raise

    async def _instance(self, container: ContainerRequest | None) -> ManagedInstance:
        fut: asyncio.Future[ManagedInstance] = asyncio.get_running_loop().create_future()
        key = None if container is None else container.key
        self._requests.setdefault(key, container)
        self._waiting.setdefault(key, []).append(fut)
        if key not in self._flush:
            self._flush[key] = asyncio.ensure_future(self._launch_batch(key))
        return await fut

    async def _launch_batch(self, key: Hashable) -> None:
        """Launch instances for the tasks waiting now: what fits (:meth:`Machines.launch`
        splits a launch no offer has room for), handed out as each is READY.  Tasks
        left without an instance wait for one of this pool's instances to end and are
        tried again then; only when the pool has none live is the capacity error theirs."""
        await asyncio.sleep(COALESCE_S)
        batch = [f for f in self._waiting.pop(key, []) if not f.done()]
        del self._flush[key]
        container = self._requests.pop(key, None)
        if not batch:
            return
        # the futures go out of the queue as they are handed an instance (a future keeps its
        # result: a list of them would hold every instance of a long launch until its end)
        queue, asked = collections.deque(batch), len(batch)
        del batch

        def hand_out(mi: ManagedInstance) -> None:
            """An instance is READY: it goes to the next task still waiting."""
            while queue:
                fut = queue.popleft()
                if not fut.done():         # not cancelled meanwhile
                    fut.set_result(mi)
                    return
            self._spawn(self.machines.terminate([mi]))   # nobody left to take it

        error: FlowMeshError | None = None
        try:
            await self.machines.launch(asked, on_ready=hand_out, container=container)   # what fits, >= 1
        except (CapacityError, BudgetExceededError) as exc:
            error = exc
        except BaseException as exc:
            for fut in queue:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        left = [f for f in queue if not f.done()]
        if not left:
            return
        if self._live():
            # capacity comes back (even while draining: these tasks were admitted before) as this pool's
            # instances end: wait for it
            self._waiting.setdefault(key, []).extend(left)
            self._requests.setdefault(key, container)
            self._publish(EventKind.POOL_SCALED, detail=f"{len(left)} task(s) wait for capacity "
                                                         f"({self._live()} instance(s) live)")
            return
        failure = error or CapacityError(f"pool {self.name!r}: {asked} instances asked, fewer came up",
                                         code="PartialLaunch")
        for fut in left:
            fut.set_exception(failure)

    def _live(self) -> int:
        return sum(mi.state not in _ENDED for mi in self.instances.values())

    def _retry_waiting(self) -> None:
        for key, waiting in self._waiting.items():
            if waiting and key not in self._flush:
                self._flush[key] = asyncio.ensure_future(self._launch_batch(key))

    async def _teardown(self, sandbox: Sandbox | None, inst: ManagedInstance | None) -> None:
        try:
            await self._close_sandbox(sandbox)
        finally:
            if inst is not None and inst.id in self.instances:
                await self._terminate_coalesced(inst)

    async def _terminate_coalesced(self, mi: ManagedInstance) -> None:
        """Terminate ``mi`` together with the others whose tasks end within ``COALESCE_S``:
        one terminate call (and one confirming describe) for a burst, not one each."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ending.append((mi, fut))
        if self._end_flush is None:
            self._end_flush = asyncio.ensure_future(self._terminate_batch())
        await asyncio.shield(fut)

    async def _terminate_batch(self) -> None:
        await asyncio.sleep(COALESCE_S)
        batch, self._ending, self._end_flush = self._ending, [], None
        try:
            await self.machines.terminate([mi for mi, _ in batch])
        except BaseException as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            raise
        finally:
            self._retry_waiting()   # their capacity is free again
        for _, fut in batch:
            if not fut.done():
                fut.set_result(None)
