"""The launching side of a pool's instances, a component its :class:`~.machines.Machines`
composes: launching in rate-planned calls down the bidder's ranking (across providers),
each call filled down the ranked offers with failover, cut to what the budgets allow;
waiting until each instance runs, bootstrapping it (:mod:`.bootstrap`) and handing it out
the moment it is READY.

It knows the pool through what it is given: the pool's context, spec and name, its
providers and :class:`~flowmesh_sdk.placement.ranking.Placement`, a bootstrapper, the
shared :class:`~.inventory.Inventory`, the pool's :class:`~.terminating.Terminator`, and
callbacks (publish an event, give an instance up, an instance became READY)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import cast

from .. import clock, timers
from ..bidder.policy import Policy
from ..control.events import EventKind
from ..errors import BudgetExceededError, CapacityError, FlowMeshError, ImageNotFoundError, InstanceLost, SandboxTimeout
from ..lifecycle import InstanceState
from ..placement.ranking import Candidate, Placement
from ..provider import (TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_RUN, ContainerRequest, FaultKind, InstanceFault, Provider,
                        ProviderState)
from ..remote.direct import InstanceRuntime
from ..specs import InfraFailure, InstanceSpec, Offer, PoolSpec
from .bootstrap import Bootstrapper
from .instance import ManagedInstance
from .inventory import Inventory
from .records import PoolContext
from .terminating import GiveUp, Terminator

log = logging.getLogger("flowmesh.pools")


def fault_error(mi: ManagedInstance, fault: InstanceFault) -> FlowMeshError:
    """The error an instance's fault (its provider's word on why it cannot run) raises."""
    text = f"instance {mi.id}: {fault.message}"
    if fault.kind is FaultKind.IMAGE:
        image = mi.runtime.image if isinstance(mi.runtime, InstanceRuntime) else None
        return ImageNotFoundError(image or "?", text)
    if fault.kind is FaultKind.CAPACITY:
        return CapacityError(text, provider=mi.provider.name, code="Unschedulable")
    return InstanceLost(text)


class Launcher:
    """Launches and brings up one pool's instances (see the module docstring)."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, pool: str, providers: Mapping[str, Provider],
                 placement: Placement, bootstrapper: Bootstrapper, inventory: Inventory, terminator: Terminator, *,
                 publish: Callable[..., None], give_up: GiveUp,
                 became_ready: Callable[[ManagedInstance], None] = lambda mi: None) -> None:
        self.ctx = ctx
        self.spec = spec
        self.pool = pool
        self.providers = providers
        self.placement = placement
        self.bootstrapper = bootstrapper
        self.inventory = inventory
        self.terminator = terminator
        self._publish = publish
        self._give_up = give_up
        self._became_ready = became_ready
        self.closing = False
        self._pending_per_hour = 0.0    # launches decided, not yet recorded in the ledger
        self.budget_pools: tuple[str, ...] = (pool,)   # whose spend the pool's budgets cover

    @property
    def best(self) -> Candidate:
        return self.placement.candidates[0]

    def slots_hint(self) -> int:
        """Slots of an instance of the best offer (what scaling plans with)."""
        return self.best.slots

    def _affordable(self, count: int) -> tuple[list[Candidate], int]:
        """The candidates a launch of up to ``count`` may use under the budgets, and how many
        the best of them allows; :class:`BudgetExceededError` (and ``launch.refused``) when
        none allows one."""
        usable: list[Candidate] = []
        fit = 0
        first_error: BudgetExceededError | None = None
        for c in self.placement.candidates:
            if self.ctx.provisioner.usable(c.offer) is not None:
                continue   # its provider failed auth, or its region quota, earlier in this run
            try:
                n = self._admit(count, c)
            except BudgetExceededError as exc:
                first_error = first_error or exc
                continue
            if not usable:
                fit = n
            usable.append(c)
        if not usable and first_error is None:
            raise self.ctx.provisioner.exhausted([c.offer for c in self.placement.candidates], [], [],
                                                 f"{count} instance(s) for pool {self.pool!r} (every offer's "
                                                 "provider or region was skipped earlier in this run)")
        if not usable:
            assert first_error is not None
            self._publish(EventKind.LAUNCH_REFUSED, detail=json.dumps(
                {"which": first_error.which, "would_be": round(first_error.would_be, 6),
                 "cap": first_error.cap, "reason": str(first_error)}, sort_keys=True))
            raise first_error
        return usable, max(1, fit)

    async def launch(self, count: int, *, replace: bool = True,
                     on_ready: Callable[[ManagedInstance], None] | None = None,
                     container: ContainerRequest | None = None) -> int:
        """Launch ``count`` instances' worth of slots of the best offer, in the calls
        :meth:`Provisioner.launch_sizes` plans (they go out together; the rate limits space
        them), each filled down the ranked offers (:meth:`_fill`), cut to what the budgets
        allow.  Each instance is bootstrapped as soon as its provider says it runs and
        handed to ``on_ready`` the moment it is READY.  Instances that fail bootstrap are
        terminated and, with ``replace``, launched again once (not for an image their
        machine could not pull: another would fail the same way).  ``container``: what an
        instance that is a container runs (an ephemeral pool's task image and sandbox).
        Returns how many became READY; raises only when none came up.

        The instances reach the caller only through ``on_ready``: the launch keeps none of
        them, so an instance that has ended is freed while the rest of a long launch (a
        burst of 100,000 let out by a cloud's rate limit over hours) is still coming up."""
        usable, fit = self._affordable(count)
        count = min(count, fit)
        best = usable[0]
        provider = self.providers[best.offer.provider]
        sizes = self.ctx.provisioner.launch_sizes(provider, best.offer.region, count)
        policy = cast(Policy, self.spec.policy)   # typed object; PoolSpec makes a preset's name a Policy
        decision = self.placement.decide(self.pool, count, policy, usable)
        self._publish(EventKind.LAUNCH_DECIDED, detail=decision.to_json())
        log.info("pool %s: %s", self.pool, decision.explain())
        results = await asyncio.gather(*(self._fill(n * best.slots, usable, on_ready, container) for n in sizes),
                                       return_exceptions=True)
        ready = sum(r[0] for r in results if not isinstance(r, BaseException))
        errors = [e for r in results for e in ([r] if isinstance(r, BaseException) else r[1])]
        failed_boot = sum(not isinstance(e, ImageNotFoundError) for r in results if not isinstance(r, BaseException)
                          for e in r[1])
        if failed_boot and replace and not self.closing:
            try:
                ready += await self.launch(failed_boot, replace=False, on_ready=on_ready, container=container)
            except FlowMeshError as exc:
                log.warning("pool %s: replacing %d instance(s) that failed bootstrap: %s",
                            self.pool, failed_boot, exc)
        if errors and not ready:
            raise errors[0]
        for e in errors:
            if isinstance(e, asyncio.CancelledError):
                raise e
        return ready

    async def _fill(self, slots: int, usable: Sequence[Candidate],
                    on_ready: Callable[[ManagedInstance], None] | None, container: ContainerRequest | None = None
                    ) -> tuple[int, list[BaseException]]:
        """Launch instances holding ``slots`` sandboxes down the ranked offers
        (:meth:`Provisioner.fill`: the one walk, its failovers and halving), each call within
        the pool's ``max_instances`` and budgets, each instance brought up while the rest
        launch.  Returns (how many became READY, bootstrap errors); raises only when not one
        instance launched."""
        bring_ups: list[asyncio.Future[tuple[int, list[BaseException]]]] = []
        slots_of = {id(c.offer): c for c in usable}   # by identity: the offers handed to fill

        async def take(offer: Offer, n: int) -> int:
            cand = slots_of[id(offer)]
            n = min(n, max(0, (self.spec.max_instances or 1) - len(self.inventory.instances)))  # PoolSpec: >= 1
            if n < 1:
                return 0
            managed = await self._launch_call(self._admit(n, cand), cand, container)
            # brought up while the rest is launched
            bring_ups.append(asyncio.ensure_future(self._bring_up(managed, on_ready)))
            return len(managed) * cand.slots

        try:
            filled = await self.ctx.provisioner.fill([c.offer for c in usable], slots, take, label=self.pool,
                                                     what=f"{slots} sandbox slot(s)",
                                                     units=lambda o: slots_of[id(o)].slots)
        except BaseException:
            for b in bring_ups:
                b.cancel()
            raise
        ready = 0
        boot_errors: list[BaseException] = []
        try:
            for got, errs in await asyncio.gather(*bring_ups):
                ready += got
                boot_errors += errs
        except BaseException:
            for b in bring_ups:
                b.cancel()
            raise
        if filled.units < slots:
            log.info("pool %s: %d of %d slot(s) launched; no offer had room for the rest", self.pool,
                     filled.units, slots)
        return ready, boot_errors

    def _admit(self, n: int, cand: Candidate) -> int:
        """``n`` cut to what the pool's and the fleet's budgets allow at ``cand``'s price."""
        price = cand.offer.price_per_hour or 0.0
        ledger = self.ctx.spend
        n = ledger.admit(n, price, cand.offer.provider, pool=self.pool, counted=self.budget_pools,
                         budget_per_hour=self.spec.budget_per_hour, budget_total=self.spec.budget_total,
                         pending_per_hour=self._pending_per_hour)
        return ledger.admit(n, price, cand.offer.provider, pool=self.ctx.fleet, scope="fleet",
                            budget_per_hour=self.ctx.fleet_budget_per_hour, budget_total=self.ctx.fleet_budget_total,
                            pending_per_hour=self._pending_per_hour)

    async def _launch_call(self, count: int, cand: Candidate,
                           container: ContainerRequest | None = None) -> list[ManagedInstance]:
        """One launch call of ``cand``: the instances it returned, recorded (REQUESTED) and
        accruing cost.  ``container`` goes only to a provider whose instances are containers
        (each is then its sandbox: :class:`~flowmesh_sdk.remote.direct.InstanceRuntime`)."""
        tags = {TAG_FLEET: self.ctx.fleet, TAG_POOL: self.pool, TAG_OWNER: self.ctx.owner, TAG_RUN: self.ctx.run}
        offer = cand.offer
        provider = self.providers[offer.provider]
        direct = not provider.capabilities.nested_containers
        price = offer.price_per_hour or 0.0
        self._pending_per_hour += price * count
        try:
            launched = await self.ctx.provisioner.attempt(self.providers, offer, self._launch_spec(offer), count,
                                                          tags, request_prefix=self.pool,
                                                          container=container if direct else None)
        finally:
            self._pending_per_hour -= price * count
        for inst in launched:
            self.ctx.spend.start(inst.id, pool=self.pool, provider=provider.name, price_per_hour=price)
        try:
            runners = [provider.runner(inst) for inst in launched]
        except BaseException:
            # no way to reach them: give them back now rather than leave them to gc
            await self.terminator.terminate_ids(provider, offer.region, [i.id for i in launched])
            for inst in launched:
                self.ctx.spend.end(inst.id)
            raise
        managed = []
        for inst, runner in zip(launched, runners):
            runtime = (InstanceRuntime(runner, inst.id, container.image if container else None) if direct
                       else self.ctx.runtime_for(runner))
            mi = ManagedInstance(inst, runtime, cand.slots, provider=provider, offer=offer)
            self.inventory.add(mi)
            self._publish(EventKind.INSTANCE_REQUESTED, instance_id=mi.id, detail=json.dumps(
                {"provider": provider.name, "region": inst.region, "zone": inst.zone, "type": inst.instance_type,
                 "spot": offer.spot, "price_per_hour": price, "slots": cand.slots}, sort_keys=True))
            managed.append(mi)
        return managed

    async def _bring_up(self, managed: list[ManagedInstance], on_ready: Callable[[ManagedInstance], None] | None
                        ) -> tuple[int, list[BaseException]]:
        """Wait until each of one call's instances runs, bootstrap it, hand it to
        ``on_ready``: (how many became READY, bootstrap errors)."""
        provider = managed[0].provider
        running = {mi.id: asyncio.get_running_loop().create_future() for mi in managed}

        async def bring_up(mi: ManagedInstance) -> None:
            try:
                await running[mi.id]
            except BaseException:
                await self.terminator.terminate([mi])
                raise
            await self._bootstrap(mi)
            if on_ready is not None:
                on_ready(mi)

        poller = asyncio.ensure_future(self._await_running(provider, managed, running))
        try:
            results = await asyncio.gather(*(bring_up(mi) for mi in managed), return_exceptions=True)
        finally:
            poller.cancel()
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
        errors = [r for r in results if isinstance(r, BaseException)]
        return len(results) - len(errors), errors

    def _launch_spec(self, offer: Offer) -> InstanceSpec:
        """The instance size to ask a provider for: the pool's fixed size, or (when the bidder
        chooses the shape) the offer's own."""
        if self.spec.sandbox_size is None:
            return self.spec.instance
        inst = self.spec.instance
        return InstanceSpec(cpus=offer.cpus, memory_gb=offer.memory_gb, gpus=offer.gpus,
                            gpu_name=offer.gpu_name if offer.gpus else None, disk_gb=inst.disk_gb, arch=offer.arch)

    async def _await_running(self, provider: Provider, insts: list[ManagedInstance],
                             running: dict[str, asyncio.Future[None]]) -> None:
        """Resolve each instance's future as the provider reports it running: one batched
        describe per round for those still pending, backing off from 0.5 s to 5 s, up to
        the bootstrap deadline (clouds push no events; a provider that watches wakes the
        round early: :meth:`Provider.wait_changed`)."""
        deadline = clock.monotonic() + self.ctx.bootstrap_timeout_s
        delay = 0.5
        while True:
            pending = []
            for mi in insts:
                fut = running[mi.id]
                if fut.done():
                    continue
                if mi.instance.fault is not None:
                    fut.set_exception(fault_error(mi, mi.instance.fault))
                elif mi.instance.state is ProviderState.PENDING:
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
            await provider.wait_changed([mi.id for mi in pending], delay)   # a sleep, unless it watches
            delay = min(5.0, delay * 2)
            try:
                seen = {i.id: i for i in await self.ctx.provisioner.call(
                    provider, pending[0].instance.region, "describe",
                    lambda: provider.describe([mi.id for mi in pending]))}
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
            async with timers.timeout(self.ctx.bootstrap_timeout_s):
                report = await self.bootstrapper.run(mi, warm)
            mi.bootstrap = report
            mi.lifecycle.to(InstanceState.READY)
            mi.last_used = clock.monotonic()
            self._became_ready(mi)   # the pool's heartbeat starts with its first machine that needs one
            self._publish(EventKind.INSTANCE_READY, instance_id=mi.id, detail=report.summary(),
                          bootstrap=report)
        except BaseException as exc:
            if isinstance(exc, asyncio.TimeoutError):
                exc = SandboxTimeout(f"instance {mi.id} bootstrap exceeded "
                                     f"{self.ctx.bootstrap_timeout_s:g} s")
            log.warning("instance %s failed bootstrap: %s", mi.id, exc)
            self._give_up(mi, f"{type(exc).__name__}: {exc}", terminate=False, failure=InfraFailure.SANDBOX_START)
            await self.terminator.terminate([mi])
            raise exc

