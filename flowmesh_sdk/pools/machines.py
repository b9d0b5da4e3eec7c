"""The instance side of a pool, as a component the pool owns and calls: launching in
rate-planned calls down the bidder's ranking (across providers), waiting until each
instance runs, bootstrapping it (:mod:`.bootstrap`), handing it out the moment it is
READY, giving up on instances that fail or are lost (reported unhealthy to their
provider, terminated, replaced once), terminating in batches (retried until the provider
no longer lists them), accruing what they cost, and reconciling what the providers list
with what the pool believes.

It knows the pool only through what it is given: the pool's context and spec, its
providers and :class:`~flowmesh_sdk.placement.ranking.Placement`, a bootstrapper, and
three callbacks (publish an event, spawn background work, an instance was given up).
It holds the pool's :class:`~.heartbeat.Heartbeat` (started with the first READY
instance whose machine needs one) and the sandboxes in tasks' hands
(:meth:`Machines.hold`), which are aborted when their instance is given up.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import clock
from ..backoff import backoff_delay
from ..control.events import EventKind
from ..errors import (AuthError, BudgetExceededError, CapacityError, ContainerRuntimeError, FlowMeshError,
                      ImageNotFoundError, InstanceLost, ProviderUnavailableError, QuotaError, SandboxClosedError,
                      SandboxTimeout, ThrottledError)
from ..lifecycle import InstanceState
from ..placement.ranking import Candidate, Placement
from ..provider import (TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_RUN, ContainerRequest, FaultKind, Instance, InstanceFault,
                        Provider, ProviderState)
from ..provisioning import Failover, price_delta, reason_of
from ..remote.direct import InstanceRuntime
from ..specs import InfraFailure, InstanceSpec, Offer, PoolSpec
from .bootstrap import Bootstrapper
from .heartbeat import Heartbeat
from .instance import ManagedInstance

if TYPE_CHECKING:
    from ..sandbox import Sandbox
    from .base import PoolContext

log = logging.getLogger("flowmesh.pools")

# errors under a task after which the instance itself is checked (a dead connection, a
# container runtime that stopped answering, a sandbox channel that died)
_MAYBE_LOST = (InstanceLost, ProviderUnavailableError, SandboxClosedError, SandboxTimeout,
               ContainerRuntimeError)
TERMINATE_ATTEMPTS = 5          # terminate + confirming describe, until the provider no longer lists it
_GONE = (ProviderState.TERMINATED,)
_RECONCILED = frozenset({InstanceState.READY, InstanceState.RUNNING, InstanceState.TERMINATION_FAILED,
                         InstanceState.STOPPED})   # the states a reconcile asks the provider about


def fault_error(mi: ManagedInstance, fault: InstanceFault) -> FlowMeshError:
    """The error an instance's fault (its provider's word on why it cannot run) raises."""
    text = f"instance {mi.id}: {fault.message}"
    if fault.kind is FaultKind.IMAGE:
        image = mi.runtime.image if isinstance(mi.runtime, InstanceRuntime) else None
        return ImageNotFoundError(image or "?", text)
    if fault.kind is FaultKind.CAPACITY:
        return CapacityError(text, provider=mi.provider.name, code="Unschedulable")
    return InstanceLost(text)


def preempted_or_lost(mi: ManagedInstance, now: Instance | None) -> InfraFailure:
    """How a task reports ``mi`` gone (``now``: what its provider lists, None when nothing):
    a spot instance that its provider ended or stopped was preempted; otherwise it was lost."""
    ended = now is None or now.state in (*_GONE, ProviderState.STOPPED)
    if mi.offer is not None and mi.offer.spot and ended:
        return InfraFailure.PREEMPTED
    return InfraFailure.INSTANCE_LOST


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    """One reconciliation: instances found gone (preempted, removed behind the pool's
    back) or stopped, and terminations retried."""

    gone: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()
    retried: tuple[str, ...] = ()


class Machines:
    """The instances of one pool (see the module docstring)."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, pool: str, providers: Mapping[str, Provider],
                 placement: Placement, bootstrapper: Bootstrapper, *,
                 publish: Callable[..., None], spawn: Callable[..., asyncio.Task[Any]],
                 on_failed: Callable[[], None] = lambda: None) -> None:
        self.ctx = ctx
        self.spec = spec
        self.pool = pool
        self.providers = dict(providers)
        self.placement = placement
        self.bootstrapper = bootstrapper
        self._publish = publish
        self._spawn = spawn
        self._on_failed = on_failed
        self.instances: dict[str, ManagedInstance] = {}
        # the same instances by (provider, region): one describe each; and those whose
        # termination failed (a reconcile terminates them again)
        self._where: dict[tuple[str, str], dict[str, ManagedInstance]] = {}
        self._termination_failed: set[str] = set()
        self.closing = False
        self._terminating: set[str] = set()
        self._pending_per_hour = 0.0    # launches decided, not yet recorded in the ledger
        self.budget_pools: tuple[str, ...] = (pool,)   # whose spend the pool's budgets cover
        self.heartbeat = (Heartbeat(self, spec.heartbeat_s, spec.heartbeat_misses)
                          if spec.heartbeat_s is not None else None)
        self._beating = False
        self._held: dict[str, set[Sandbox]] = {}   # instance id -> sandboxes in tasks' hands

    # ---- launching ----------------------------------------------------------------
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
                     container: ContainerRequest | None = None) -> list[ManagedInstance]:
        """Launch ``count`` instances' worth of slots of the best offer, in the calls
        :meth:`Provisioner.launch_sizes` plans (they go out together; the rate limits space
        them), each filled down the ranked offers (:meth:`_fill`), cut to what the budgets
        allow.  Each instance is bootstrapped as soon as its provider says it runs and
        handed to ``on_ready`` the moment it is READY.  Instances that fail bootstrap are
        terminated and, with ``replace``, launched again once (not for an image their
        machine could not pull: another would fail the same way).  ``container``: what an
        instance that is a container runs (an ephemeral pool's task image and sandbox).
        Returns the READY ones; raises only when none came up."""
        usable, fit = self._affordable(count)
        count = min(count, fit)
        best = usable[0]
        provider = self.providers[best.offer.provider]
        sizes = self.ctx.provisioner.launch_sizes(provider, best.offer.region, count)
        decision = self.placement.decide(self.pool, count, self.spec.policy, usable)  # type: ignore[arg-type]
        self._publish(EventKind.LAUNCH_DECIDED, detail=decision.to_json())
        log.info("pool %s: %s", self.pool, decision.explain())
        results = await asyncio.gather(*(self._fill(n * best.slots, usable, on_ready, container) for n in sizes),
                                       return_exceptions=True)
        ready = [mi for r in results if not isinstance(r, BaseException) for mi in r[0]]
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
                    ) -> tuple[list[ManagedInstance], list[BaseException]]:
        """Launch instances holding ``slots`` sandboxes, best offer first: as many of it as
        it has room for (a launch refused for capacity is halved until one goes through or
        one is refused), then the next offer for the rest -- so one burst may land on
        several offers and providers, cheapest first, as the ranking wants.  Each offer
        given up on is a failover (reason, price delta).  Returns (READY instances,
        bootstrap errors); raises only when not one instance launched."""
        remaining = slots
        bring_ups: list[asyncio.Future[tuple[list[ManagedInstance], list[BaseException]]]] = []
        failovers: list[Failover] = []
        errors: list[FlowMeshError] = []
        launched = 0
        for i, cand in enumerate(usable):
            if remaining <= 0:
                break
            nxt = usable[i + 1].offer if i + 1 < len(usable) else None
            skipped = self.ctx.provisioner.usable(cand.offer)
            if skipped is not None:
                self.ctx.provisioner.failed_over(failovers, Failover(self.pool, cand.offer, skipped,
                                                                     "skipped for this run", price_delta(cand.offer, nxt)),
                                                 nxt)
                continue
            n = -(-remaining // cand.slots)
            error: FlowMeshError | None = None
            while remaining > 0 and n >= 1:
                n = min(n, max(0, self.spec.max_instances - len(self.instances)))  # type: ignore[operator]
                if n < 1:
                    break
                try:
                    n = self._admit(n, cand)
                    managed = await self._launch_call(n, cand, container)
                except CapacityError as exc:
                    error = exc
                    n //= 2          # what fits of this offer
                    continue
                except (BudgetExceededError, AuthError, QuotaError, ThrottledError, ProviderUnavailableError) as exc:
                    error = exc
                    break
                # brought up while the rest is launched
                bring_ups.append(asyncio.ensure_future(self._bring_up(managed, on_ready)))
                launched += len(managed)
                remaining -= len(managed) * cand.slots
                n = min(n, -(-remaining // cand.slots))
            if remaining > 0 and error is not None:
                errors.append(error)
                reason = "budget" if isinstance(error, BudgetExceededError) else reason_of(error)
                self.ctx.provisioner.failed_over(failovers, Failover(self.pool, cand.offer, reason, str(error),
                                                                     price_delta(cand.offer, nxt)), nxt)
        ready: list[ManagedInstance] = []
        boot_errors: list[BaseException] = []
        try:
            for got, errs in await asyncio.gather(*bring_ups):
                ready += got
                boot_errors += errs
        except BaseException:
            for b in bring_ups:
                b.cancel()
            raise
        if not launched:
            budget = [e for e in errors if isinstance(e, BudgetExceededError)]
            if budget and len(budget) == len(errors):
                raise budget[0]
            raise self.ctx.provisioner.exhausted([c.offer for c in usable], failovers, errors,
                                                 f"{slots} sandbox slot(s)")
        if remaining > 0:
            log.info("pool %s: %d of %d slot(s) launched; no offer had room for the rest", self.pool,
                     slots - remaining, slots)
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
            await self._terminate_ids(provider, offer.region, [i.id for i in launched])
            for inst in launched:
                self.ctx.spend.end(inst.id)
            raise
        managed = []
        for inst, runner in zip(launched, runners):
            runtime = (InstanceRuntime(runner, inst.id, container.image if container else None) if direct
                       else self.ctx.runtime_for(runner))
            mi = ManagedInstance(inst, runtime, cand.slots, provider=provider, offer=offer)
            self.instances[mi.id] = mi
            self._where.setdefault(mi.where, {})[mi.id] = mi
            self._publish(EventKind.INSTANCE_REQUESTED, instance_id=mi.id, detail=json.dumps(
                {"provider": provider.name, "region": inst.region, "zone": inst.zone, "type": inst.instance_type,
                 "spot": offer.spot, "price_per_hour": price, "slots": cand.slots}, sort_keys=True))
            managed.append(mi)
        return managed

    async def _bring_up(self, managed: list[ManagedInstance], on_ready: Callable[[ManagedInstance], None] | None
                        ) -> tuple[list[ManagedInstance], list[BaseException]]:
        """Wait until each of one call's instances runs, bootstrap it, hand it to
        ``on_ready``: (READY instances, bootstrap errors)."""
        provider = managed[0].provider
        running = {mi.id: asyncio.get_running_loop().create_future() for mi in managed}

        async def bring_up(mi: ManagedInstance) -> ManagedInstance:
            try:
                await running[mi.id]
            except BaseException:
                await self.terminate([mi])
                raise
            await self._bootstrap(mi)
            if on_ready is not None:
                on_ready(mi)
            return mi

        poller = asyncio.ensure_future(self._await_running(provider, managed, running))
        try:
            results = await asyncio.gather(*(bring_up(mi) for mi in managed), return_exceptions=True)
        finally:
            poller.cancel()
        for r in results:
            if isinstance(r, asyncio.CancelledError):
                raise r
        return ([r for r in results if not isinstance(r, BaseException)],
                [r for r in results if isinstance(r, BaseException)])

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
            async with asyncio.timeout(self.ctx.bootstrap_timeout_s):
                report = await self.bootstrapper.run(mi, warm)
            mi.bootstrap = report
            mi.lifecycle.to(InstanceState.READY)
            mi.last_used = clock.monotonic()
            if (self.heartbeat is not None and not self._beating and not self.closing
                    and mi.runtime.runner.needs_heartbeat):
                self._beating = True
                self._spawn(self.heartbeat.run(), daemon=True)
            self._publish(EventKind.INSTANCE_READY, instance_id=mi.id, detail=report.summary(),
                          bootstrap=report)
        except BaseException as exc:
            if isinstance(exc, asyncio.TimeoutError):
                exc = SandboxTimeout(f"instance {mi.id} bootstrap exceeded "
                                     f"{self.ctx.bootstrap_timeout_s:g} s")
            log.warning("instance %s failed bootstrap: %s", mi.id, exc)
            self.give_up(mi, f"{type(exc).__name__}: {exc}", terminate=False, failure=InfraFailure.SANDBOX_START)
            await self.terminate([mi])
            raise exc

    # ---- losing instances --------------------------------------------------------------
    async def lost(self, mi: ManagedInstance, exc: FlowMeshError) -> bool:
        """After an error under a task: is ``mi`` gone?  It is when a trivial command no
        longer runs there; then it is given up (failed, reported, terminated)."""
        if mi.state is InstanceState.FAILED or mi.lifecycle.entered(InstanceState.FAILED) is not None:
            if mi.loss_check is not None:   # is it preempted?  (what the task will report)
                await asyncio.shield(mi.loss_check)
            return True   # given up already (by another task, the reconciler, a failed bootstrap)
        if mi.state is not InstanceState.READY or not isinstance(exc, _MAYBE_LOST):
            return False
        try:
            await mi.runtime.runner.probe(30.0)
            return False
        except (FlowMeshError, OSError):
            pass
        self.give_up(mi, f"lost: {type(exc).__name__}: {exc}", failure=await self._why_gone(mi))
        return True

    async def _why_gone(self, mi: ManagedInstance) -> InfraFailure:
        """A machine that stopped answering: PREEMPTED when it was spot and its provider
        lists it terminated (or no longer at all), else INSTANCE_LOST."""
        if mi.offer is None or not mi.offer.spot:
            return InfraFailure.INSTANCE_LOST
        try:
            described = await self.ctx.provisioner.call(mi.provider, mi.instance.region, "describe",
                                                        lambda: mi.provider.describe([mi.id]))
        except FlowMeshError:
            return InfraFailure.INSTANCE_LOST
        now = next((i for i in described if i.id == mi.id), None)
        return preempted_or_lost(mi, now)

    def hold(self, sb: Sandbox) -> None:
        """``sb`` is in a task's hands until :meth:`release`: if its instance is given up
        meanwhile (or was already), ``sb`` is aborted, so the call waiting on it raises."""
        mi = self.instances.get(sb.instance_id)
        if mi is not None and mi.lifecycle.entered(InstanceState.FAILED) is not None:
            sb.abort(InstanceLost(f"instance {mi.id} was given up", preempted=mi.loss is InfraFailure.PREEMPTED))
            return
        self._held.setdefault(sb.instance_id, set()).add(sb)

    def release(self, sb: Sandbox) -> None:
        held = self._held.get(sb.instance_id)
        if held is not None:
            held.discard(sb)
            if not held:
                del self._held[sb.instance_id]

    def give_up(self, mi: ManagedInstance, detail: str, *, terminate: bool = True,
                failure: InfraFailure | None = None) -> None:
        """Mark ``mi`` failed (``failure``: what its tasks report; None: a machine that
        stopped answering, which a spot instance's provider is asked about first -- see
        :meth:`_why_gone` -- before it is terminated), abort the sandboxes on it in tasks'
        hands, tell its provider the machine is unhealthy, and (unless the caller does it)
        terminate it in the background."""
        if mi.lifecycle.can(InstanceState.FAILED):
            mi.lifecycle.to(InstanceState.FAILED)
        ask = failure is None and mi.loss is None and mi.offer is not None and mi.offer.spot
        if mi.loss is None:
            mi.loss = failure or InfraFailure.INSTANCE_LOST
        for sb in self._held.pop(mi.id, ()):
            sb.abort(InstanceLost(f"instance {mi.id} was given up: {detail}",
                                  preempted=mi.loss is InfraFailure.PREEMPTED))
        self._publish(EventKind.INSTANCE_FAILED, instance_id=mi.id, detail=detail)
        mi.provider.mark_unhealthy([mi.instance], detail)
        if ask:
            mi.loss_check = self._spawn(self._ask_then_end(mi, terminate))
        elif terminate:
            self._spawn(self.terminate([mi]))
        self._on_failed()

    async def _ask_then_end(self, mi: ManagedInstance, terminate: bool) -> None:
        """A spot instance given up for not answering: was it preempted?  Asked before our
        own terminate, which would make its provider list it terminated either way."""
        mi.loss = await self._why_gone(mi)
        if terminate:
            await self.terminate([mi])

    # ---- terminating -----------------------------------------------------------------
    async def terminate(self, insts: list[ManagedInstance]) -> None:
        """Destroy warm sandboxes, terminate the instances (one call per provider and
        region), retried until their provider no longer lists them, then drop them --
        each once, however many callers ask.  An instance still listed after
        ``TERMINATE_ATTEMPTS`` rounds is TERMINATION_FAILED (kept, still accruing cost, and
        retried by the reconciler)."""
        insts = [mi for mi in insts if mi.id not in self._terminating]
        if not insts:
            return
        self._terminating.update(mi.id for mi in insts)
        try:
            for mi in insts:
                if mi.lifecycle.can(InstanceState.DRAINING) and mi.state is not InstanceState.FAILED:
                    mi.lifecycle.to(InstanceState.DRAINING)
                    self._publish(EventKind.INSTANCE_DRAINING, instance_id=mi.id)
            warm = [sb for mi in insts for sb in mi.all_warm()]
            await asyncio.gather(*(sb.close() for sb in warm), return_exceptions=True)
            groups: dict[tuple[str, str], list[ManagedInstance]] = defaultdict(list)
            for mi in insts:
                groups[(mi.provider.name, mi.instance.region)].append(mi)
            outcomes = await asyncio.gather(*(self._terminate_group(g) for g in groups.values()),
                                            return_exceptions=True)
            errors = [o for o in outcomes if isinstance(o, BaseException)]
            if errors:
                raise errors[0]
        finally:
            self._terminating.difference_update(mi.id for mi in insts)

    async def _terminate_group(self, insts: list[ManagedInstance]) -> None:
        provider = insts[0].provider
        region = insts[0].instance.region
        for mi in insts:
            if mi.lifecycle.can(InstanceState.TERMINATING):
                mi.lifecycle.to(InstanceState.TERMINATING)
                self._publish(EventKind.INSTANCE_TERMINATING, instance_id=mi.id)
        still = await self._terminate_ids(provider, region, [mi.id for mi in insts])
        for mi in insts:
            if mi.id in still:
                if mi.lifecycle.can(InstanceState.TERMINATION_FAILED):
                    mi.lifecycle.to(InstanceState.TERMINATION_FAILED)
                self._termination_failed.add(mi.id)
                self._publish(EventKind.INSTANCE_TERMINATION_FAILED, instance_id=mi.id,
                              detail=f"still listed by {provider.name} after {TERMINATE_ATTEMPTS} terminate calls")
                continue
            self._gone(mi, "")

    async def _terminate_ids(self, provider: Provider, region: str, ids: list[str]) -> set[str]:
        """Terminate ``ids`` and confirm by describe, retried (backing off) while any is
        still listed; returns those still listed at the end."""
        left = list(ids)
        for attempt in range(TERMINATE_ATTEMPTS):
            batch = list(left)
            await self.ctx.provisioner.call(provider, region, "terminate", lambda: provider.terminate(batch),
                                            instances=len(batch))
            seen = await self.ctx.provisioner.call(provider, region, "describe", lambda: provider.describe(batch))
            left = [i.id for i in seen if i.state not in _GONE]
            if not left:
                return set()
            if attempt + 1 < TERMINATE_ATTEMPTS:
                log.info("pool %s: %s still listed after terminate (attempt %d); retrying",
                         self.pool, left, attempt + 1)
                await asyncio.sleep(backoff_delay(attempt + 1, 0.5, 10.0))
        log.warning("pool %s: %s still listed after %d terminate calls: TERMINATION_FAILED (the reconciler "
                    "and gc retry)", self.pool, left, TERMINATE_ATTEMPTS)
        return set(left)

    def _gone(self, mi: ManagedInstance, detail: str) -> None:
        if mi.lifecycle.can(InstanceState.TERMINATED):
            mi.lifecycle.to(InstanceState.TERMINATED)
        self.instances.pop(mi.id, None)
        self._termination_failed.discard(mi.id)
        group = self._where.get(mi.where)
        if group is not None:
            group.pop(mi.id, None)
            if not group:
                del self._where[mi.where]
        self.ctx.spend.end(mi.id)
        pool = self.ctx.spend.summary(pool=self.pool)
        self._publish(EventKind.INSTANCE_TERMINATED, instance_id=mi.id, detail=json.dumps(
            {"reason": detail or "terminated", "cost": round(self.ctx.spend.cost(mi.id), 6),
             "pool_spent": round(pool.spent, 6), "pool_burn_per_hour": round(pool.burn_per_hour, 6)},
            sort_keys=True))

    # ---- reconciling -------------------------------------------------------------------
    async def reconcile(self) -> ReconcileResult:
        """Ask each provider (one batched describe per provider and region, within its rate
        limits) about every instance this pool holds.  One it no longer lists, or lists
        terminated (a spot preemption, a deletion behind the pool's back), is given up and
        dropped; a stopped one is STOPPED and given up; a TERMINATION_FAILED one is
        terminated again."""
        gone: list[str] = []
        stopped: list[str] = []
        retried: list[str] = []
        running, failed = ProviderState.RUNNING, InstanceState.TERMINATION_FAILED
        for (_, region), group in list(self._where.items()):
            ids = list(group)   # each instance once: those in other states are skipped below
            if not ids:
                continue
            provider = group[ids[0]].provider
            try:
                described = await self.ctx.provisioner.call(provider, region, "describe",
                                                            lambda: provider.describe(ids))
            except FlowMeshError as exc:
                log.warning("pool %s: reconcile describe on %s/%s failed: %s", self.pool, provider.name,
                            region, exc)
                continue
            # the common case -- listed running, as the pool thinks -- is a set difference away
            fine = {i.id for i in described if i.state is running}
            suspects = (set(ids) - fine) | (self._termination_failed & fine)
            if not suspects:
                continue
            seen: dict[str, Instance] = {i.id: i for i in described if i.id in suspects}
            for iid in suspects:
                mi = group.get(iid)
                if mi is None or iid in self._terminating or mi.lifecycle.state not in _RECONCILED:
                    continue   # gone, being terminated, or not one a reconcile asks about
                now, state = seen.get(iid), mi.lifecycle.state
                if state is failed:
                    if now is None or now.state in _GONE:
                        self._gone(mi, "reconciled: no longer listed")
                    else:
                        retried.append(mi.id)
                    continue
                if now is None or now.state in _GONE:
                    gone.append(mi.id)
                    self.give_up(mi, "reconciled: its provider no longer lists it (preempted or removed)",
                                 terminate=False, failure=preempted_or_lost(mi, now))
                    self._gone(mi, "reconciled: no longer listed by its provider")
                elif now.state is ProviderState.STOPPED and state is not InstanceState.STOPPED:
                    stopped.append(mi.id)
                    mi.lifecycle.to(InstanceState.STOPPED)
                    self._publish(EventKind.INSTANCE_STOPPED, instance_id=mi.id, detail="reported stopped")
                    self.give_up(mi, "stopped by its provider", failure=preempted_or_lost(mi, now))
        if retried:
            self._spawn(self.terminate([self.instances[i] for i in retried if i in self.instances]))
        return ReconcileResult(tuple(gone), tuple(stopped), tuple(retried))
