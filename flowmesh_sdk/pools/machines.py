"""The instance side of a pool: launching in rate-planned calls, waiting until the
provider reports each instance running, bootstrapping it (:mod:`.bootstrap`), handing it
out the moment it is READY, giving up on instances that fail or are lost (reported
unhealthy to the provider, terminated, replaced once), and terminating in batches.

:class:`Machines` is a mixin of :class:`~flowmesh_sdk.pools.base.Pool`; it uses the
pool's context, provider, offers, instance table, event publishing and background tasks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import clock
from ..control.events import EventKind
from ..errors import (ContainerRuntimeError, FlowMeshError, InstanceLost, ProviderUnavailableError,
                      SandboxClosedError, SandboxTimeout)
from ..lifecycle import InstanceState
from ..provider import TAG_FLEET, TAG_OWNER, TAG_POOL, Offer, Provider, ProviderState
from ..specs import PoolSpec
from .bootstrap import Bootstrapper
from .instance import ManagedInstance

if TYPE_CHECKING:
    from .base import PoolContext

log = logging.getLogger("flowmesh.pools")

# errors under a task after which the instance itself is checked (a dead connection, a
# container runtime that stopped answering, a sandbox channel that died)
_MAYBE_LOST = (InstanceLost, ProviderUnavailableError, SandboxClosedError, SandboxTimeout,
               ContainerRuntimeError)


class Machines:
    ctx: PoolContext
    spec: PoolSpec
    name: str
    provider: Provider
    offers: tuple[Offer, ...]
    instances: dict[str, ManagedInstance]
    bootstrapper: Bootstrapper
    _closing: bool
    _terminating: set[str]

    if TYPE_CHECKING:   # provided by Pool
        def _publish(self, kind: EventKind, **kw: object) -> None: ...
        def _spawn(self, coro, *, daemon: bool = False) -> asyncio.Task[object]: ...  # type: ignore[no-untyped-def]

    async def _launch(self, count: int, *, replace: bool = True,
                      on_ready: Callable[[ManagedInstance], None] | None = None) -> list[ManagedInstance]:
        """Launch ``count`` instances in the calls :meth:`Provisioner.launch_sizes` plans (they
        go out together; the rate limits space them), failing over down the offers.  Each
        instance is bootstrapped as soon as the provider says it runs and handed to
        ``on_ready`` the moment it is READY, so the first instances serve while the last
        still boot.  Instances that fail bootstrap are terminated and, with ``replace``,
        launched again once.  Returns the READY ones; raises only when none came up."""
        sizes = self.ctx.provisioner.launch_sizes(self.provider, self.offers[0].region, count)
        results = await asyncio.gather(*(self._launch_call(n, on_ready) for n in sizes),
                                       return_exceptions=True)
        ready = [mi for r in results if not isinstance(r, BaseException) for mi in r[0]]
        errors = [e for r in results for e in ([r] if isinstance(r, BaseException) else r[1])]
        failed_boot = sum(len(r[1]) for r in results if not isinstance(r, BaseException))
        if failed_boot and replace and not self._closing:
            try:
                ready += await self._launch(failed_boot, replace=False, on_ready=on_ready)
            except FlowMeshError as exc:
                log.warning("pool %s: replacing %d instance(s) that failed bootstrap: %s",
                            self.name, failed_boot, exc)
        if errors and not ready:
            raise errors[0]
        for e in errors:
            if isinstance(e, asyncio.CancelledError):
                raise e
        return ready

    async def _launch_call(self, count: int, on_ready: Callable[[ManagedInstance], None] | None
                           ) -> tuple[list[ManagedInstance], list[BaseException]]:
        """One launch call and the bring-up of what it returned: (ready, bootstrap errors)."""
        tags = {TAG_FLEET: self.ctx.fleet, TAG_POOL: self.name, TAG_OWNER: self.ctx.owner}
        outcome = await self.ctx.provisioner.launch({self.provider.name: self.provider}, self.offers,
                                                    self.spec.instance, count, tags,
                                                    request_prefix=self.name)
        launched = list(outcome.instances)
        try:
            runners = [self.provider.runner(inst) for inst in launched]
        except BaseException:
            # no way to reach them: give them back now rather than leave them to gc
            ids = [i.id for i in launched]
            await self.ctx.provisioner.call(self.provider, outcome.offer.region, "terminate",
                                            lambda: self.provider.terminate(ids), instances=len(ids))
            raise
        managed = []
        for inst, runner in zip(launched, runners):
            mi = ManagedInstance(inst, self.ctx.runtime_for(runner), self._slots_per_instance())
            self.instances[mi.id] = mi
            self._publish(EventKind.INSTANCE_REQUESTED, instance_id=mi.id, detail=inst.instance_type)
            managed.append(mi)
        running = {mi.id: asyncio.get_running_loop().create_future() for mi in managed}

        async def bring_up(mi: ManagedInstance) -> ManagedInstance:
            try:
                await running[mi.id]
            except BaseException:
                await self._terminate([mi])
                raise
            await self._bootstrap(mi)
            if on_ready is not None:
                on_ready(mi)
            return mi

        poller = asyncio.ensure_future(self._await_running(managed, running))
        try:
            results = await asyncio.gather(*(bring_up(mi) for mi in managed), return_exceptions=True)
        finally:
            poller.cancel()
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
        return ([r for r in results if not isinstance(r, BaseException)],
                [r for r in results if isinstance(r, BaseException)])

    def _slots_per_instance(self) -> int:
        return 1

    async def _await_running(self, insts: list[ManagedInstance],
                             running: dict[str, asyncio.Future[None]]) -> None:
        """Resolve each instance's future as the provider reports it running: one batched
        describe per round for those still pending, backing off from 0.5 s to 5 s, up to
        the bootstrap deadline (clouds push no events)."""
        deadline = clock.monotonic() + self.ctx.bootstrap_timeout_s
        delay = 0.5
        while True:
            pending = []
            for mi in insts:
                fut = running[mi.id]
                if fut.done():
                    continue
                if mi.instance.state is ProviderState.PENDING:
                    pending.append(mi)
                elif mi.instance.state is ProviderState.TERMINATED:
                    fut.set_exception(InstanceLost(f"instance {mi.id} was terminated before it ran"))
                else:
                    fut.set_result(None)
            if not pending:
                return
            if clock.monotonic() + delay > deadline:
                for mi in pending:
                    running[mi.id].set_exception(SandboxTimeout(
                        f"instance {mi.id} still pending after {self.ctx.bootstrap_timeout_s:g} s"))
                return
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)
            try:
                seen = {i.id: i for i in await self.ctx.provisioner.call(
                    self.provider, pending[0].instance.region, "describe",
                    lambda: self.provider.describe([mi.id for mi in pending]))}
            except FlowMeshError as exc:
                for mi in pending:
                    running[mi.id].set_exception(exc)
                return
            for mi in pending:
                if mi.id in seen:
                    mi.instance = seen[mi.id]

    async def _bootstrap(self, mi: ManagedInstance) -> None:
        """RUNNING -> the bootstrap steps -> READY (or FAILED: terminated, its machine
        reported unhealthy to the provider)."""
        try:
            mi.lifecycle.to(InstanceState.RUNNING)
            self._publish(EventKind.INSTANCE_RUNNING, instance_id=mi.id)
            warm = [await self.ctx.images.resolve(image, arch=self.spec.instance.arch)
                    for image in self.spec.warm_images]
            async with asyncio.timeout(self.ctx.bootstrap_timeout_s):
                report = await self.bootstrapper.run(mi, warm)
            mi.bootstrap = report
            mi.lifecycle.to(InstanceState.READY)
            mi.last_used = clock.monotonic()
            self._publish(EventKind.INSTANCE_READY, instance_id=mi.id, detail=report.summary(),
                          bootstrap=report)
        except BaseException as exc:
            if isinstance(exc, asyncio.TimeoutError):
                exc = SandboxTimeout(f"instance {mi.id} bootstrap exceeded "
                                     f"{self.ctx.bootstrap_timeout_s:g} s")
            log.warning("instance %s failed bootstrap: %s", mi.id, exc)
            self._give_up(mi, f"{type(exc).__name__}: {exc}", terminate=False)
            await self._terminate([mi])
            raise exc

    async def _lost(self, mi: ManagedInstance, exc: FlowMeshError) -> bool:
        """After an error under a task: is ``mi`` gone?  It is when a trivial command no
        longer runs there; then it is given up (failed, reported, terminated)."""
        if mi.state is InstanceState.FAILED:
            return True
        if mi.state is not InstanceState.READY or not isinstance(exc, _MAYBE_LOST):
            return False
        try:
            res = await asyncio.wait_for(mi.runtime.runner.run(["true"], timeout_s=10), 30)
            if res.ok:
                return False
        except (FlowMeshError, OSError, asyncio.TimeoutError):
            pass
        self._give_up(mi, f"lost: {type(exc).__name__}: {exc}")
        return True

    def _give_up(self, mi: ManagedInstance, detail: str, *, terminate: bool = True) -> None:
        """Mark ``mi`` failed, tell the provider its machine is unhealthy, and (unless the
        caller does it) terminate it in the background."""
        if mi.lifecycle.can(InstanceState.FAILED):
            mi.lifecycle.to(InstanceState.FAILED)
        self._publish(EventKind.INSTANCE_FAILED, instance_id=mi.id, detail=detail)
        self.provider.mark_unhealthy([mi.instance], detail)
        if terminate:
            self._spawn(self._terminate([mi]))
        self._on_instance_failed()

    def _on_instance_failed(self) -> None:
        """Hook: wake waiters so they see the capacity change."""

    async def _terminate(self, insts: list[ManagedInstance]) -> None:
        """Destroy warm sandboxes, terminate the instances in one call, drop them (each
        once, however many callers ask)."""
        insts = [mi for mi in insts if mi.id not in self._terminating]
        if not insts:
            return
        self._terminating.update(mi.id for mi in insts)
        try:
            await self._terminate_now(insts)
        finally:
            self._terminating.difference_update(mi.id for mi in insts)

    async def _terminate_now(self, insts: list[ManagedInstance]) -> None:
        for mi in insts:
            if mi.lifecycle.can(InstanceState.DRAINING):
                mi.lifecycle.to(InstanceState.DRAINING)
                self._publish(EventKind.INSTANCE_DRAINING, instance_id=mi.id)
        warm = [sb for mi in insts for sb in mi.all_warm()]
        await asyncio.gather(*(sb.close() for sb in warm), return_exceptions=True)
        ids = [mi.id for mi in insts]
        region = insts[0].instance.region
        await self.ctx.provisioner.call(self.provider, region, "terminate",
                                        lambda: self.provider.terminate(ids), instances=len(ids))
        # confirmed by describe before the records go: absent or terminated
        still = [i.id for i in await self.ctx.provisioner.call(
            self.provider, region, "describe", lambda: self.provider.describe(ids))
            if i.state is not ProviderState.TERMINATED and i.state is not ProviderState.STOPPING]
        if still:
            log.warning("pool %s: %s not yet terminated after the call; gc will find them if they "
                        "linger", self.name, still)
        for mi in insts:
            if mi.lifecycle.can(InstanceState.TERMINATED):
                mi.lifecycle.to(InstanceState.TERMINATED)
            self.instances.pop(mi.id, None)
            self._publish(EventKind.INSTANCE_TERMINATED, instance_id=mi.id)

