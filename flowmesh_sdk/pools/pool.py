"""What every pool presents, whatever runs it: the two kinds on machines
(:class:`~.base.MachinePool`: :class:`~.persistent.PersistentPool`,
:class:`~.ephemeral.EphemeralPool`, :class:`~.warm_pods.WarmPodPool`) and the automatic
mode (:class:`~.auto.AutoPool`, which routes each task to a pool of each kind).
:meth:`Fleet.pool <flowmesh_sdk.fleet.Fleet.pool>` returns a :class:`Pool`."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterable

from ..images import ImageInfo
from ..provider import Offer
from ..sandbox import Sandbox
from ..specs import PoolSpec, SandboxSpec, Task, TaskResult
from .batch import run_tasks
from .instance import ManagedInstance
from .records import AutoStats, PoolContext, PoolStats
from .terminating import ReconcileResult


class Pool(abc.ABC):
    """A pool: sandboxes for tasks, on instances it launches and terminates."""

    ctx: PoolContext
    spec: PoolSpec
    name: str

    @abc.abstractmethod
    async def start(self) -> Pool:
        """Launch what the pool keeps warm (``min_instances``); returns the pool."""

    @abc.abstractmethod
    def sandbox(self, spec: SandboxSpec | None = None, *, image: str | None = None, tenant: str = "default",
                name: str | None = None) -> contextlib.AbstractAsyncContextManager[Sandbox]:
        """A sandbox for the body of an ``async with``; destroyed (and its slot freed) after."""

    @abc.abstractmethod
    async def run_task(self, task: Task) -> TaskResult:
        """Run one task; its errors are in the result, not raised."""

    async def map(self, tasks: Iterable[Task], *,
                  on_result: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
        """Run every task (at most the pool's capacity at once); results in input order.
        See :func:`~.batch.run_tasks` for what happens when something raises."""
        return await run_tasks(self.run_task, tasks, on_result)

    @abc.abstractmethod
    def default_sandbox(self, image: str) -> SandboxSpec:
        """A sandbox of ``image`` that fits this pool's slots."""

    @abc.abstractmethod
    async def prefetch(self, images: Iterable[str]) -> list[ImageInfo]:
        """Resolve ``images`` and pull them onto the READY instances; what they resolved to."""

    @property
    @abc.abstractmethod
    def instances(self) -> dict[str, ManagedInstance]:
        """The pool's instances by id."""

    @property
    @abc.abstractmethod
    def offers(self) -> tuple[Offer, ...]:
        """The ranked offers, in the order failover walks them."""

    @property
    @abc.abstractmethod
    def capacity(self) -> int:
        """Most tasks (sandboxes) in flight at once."""

    @abc.abstractmethod
    def stats(self) -> PoolStats | AutoStats:
        """What the pool holds and has spent now."""

    @abc.abstractmethod
    async def reconcile(self) -> ReconcileResult:
        """The pool's instances against what their providers list."""

    @abc.abstractmethod
    async def drain(self, timeout_s: float | None = None) -> None:
        """Admit nothing new, let in-flight tasks finish, then terminate every instance."""

    async def close(self, timeout_s: float | None = None) -> None:
        await self.drain(timeout_s)

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """Drained."""

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        await self.drain(None if exc_type is None else 0)   # as Fleet's: an exception waits for nothing
