"""The instance side of a pool, as a component the pool owns and calls.  It is made of
two parts it composes and one it keeps:

- launching (:mod:`.launching`, :class:`~.launching.Launcher`): in rate-planned calls
  down the bidder's ranking (across providers), waiting until each instance runs,
  bootstrapping it (:mod:`.bootstrap`), handing it out the moment it is READY;
- terminating and reconciling (:mod:`.terminating`, :class:`~.terminating.Terminator`):
  in batches, retried until the provider no longer lists them, accruing what they cost
  until then; what the providers list against what the pool believes;
- here, losing instances: giving up on instances that fail or are lost (reported
  unhealthy to their provider, terminated, replaced once).

It knows the pool only through what it is given: the pool's context and spec, its
providers and :class:`~flowmesh_sdk.placement.ranking.Placement`, a bootstrapper, and
three callbacks (publish an event, spawn background work, an instance was given up).
It holds the pool's :class:`~.heartbeat.Heartbeat` (started with the first READY
instance whose machine needs one) and the sandboxes in tasks' hands
(:meth:`Machines.hold`), which are aborted when their instance is given up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..control.events import EventKind
from ..errors import (ContainerRuntimeError, FlowMeshError, InstanceLost, ProviderUnavailableError,
                      SandboxClosedError, SandboxTimeout)
from ..lifecycle import InstanceState
from ..placement.ranking import Candidate, Placement
from ..provider import ContainerRequest, Provider
from ..specs import InfraFailure, PoolSpec
from .bootstrap import Bootstrapper
from .heartbeat import Heartbeat
from .instance import ManagedInstance
from .inventory import Inventory
from .launching import Launcher, fault_error
from .records import PoolContext
from .terminating import TERMINATE_ATTEMPTS, ReconcileResult, Terminator, preempted_or_lost

if TYPE_CHECKING:
    from ..sandbox import Sandbox

__all__ = ["TERMINATE_ATTEMPTS", "Machines", "ReconcileResult", "fault_error", "preempted_or_lost"]

# errors under a task after which the instance itself is checked (a dead connection, a
# container runtime that stopped answering, a sandbox channel that died)
_MAYBE_LOST = (InstanceLost, ProviderUnavailableError, SandboxClosedError, SandboxTimeout,
               ContainerRuntimeError)


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
        self.inventory = Inventory()
        self.instances: dict[str, ManagedInstance] = self.inventory.instances
        self.terminator = Terminator(ctx, pool, self.inventory, publish=publish, spawn=spawn, give_up=self.give_up)
        self.launcher = Launcher(ctx, spec, pool, self.providers, placement, bootstrapper, self.inventory,
                                 self.terminator, publish=publish, give_up=self.give_up,
                                 became_ready=self._became_ready)
        self.heartbeat = (Heartbeat(self, spec.heartbeat_s, spec.heartbeat_misses)
                          if spec.heartbeat_s is not None else None)
        self._beating = False
        self._held: dict[str, set[Sandbox]] = {}   # instance id -> sandboxes in tasks' hands

    @property
    def closing(self) -> bool:
        """Set when the pool drains: no replacements are launched, no heartbeat started."""
        return self.launcher.closing

    @closing.setter
    def closing(self, value: bool) -> None:
        self.launcher.closing = value

    @property
    def budget_pools(self) -> tuple[str, ...]:
        """The pools whose spend this pool's budgets cover (its own; an auto pool's halves share)."""
        return self.launcher.budget_pools

    @budget_pools.setter
    def budget_pools(self, value: tuple[str, ...]) -> None:
        self.launcher.budget_pools = value

    # ---- launching (:mod:`.launching`) -------------------------------------------------
    @property
    def best(self) -> Candidate:
        return self.launcher.best

    def slots_hint(self) -> int:
        """Slots of an instance of the best offer (what scaling plans with)."""
        return self.launcher.slots_hint()

    async def launch(self, count: int, *, replace: bool = True,
                     on_ready: Callable[[ManagedInstance], None] | None = None,
                     container: ContainerRequest | None = None) -> int:
        """Launch ``count`` instances' worth of slots, bring them up, hand each to ``on_ready``
        the moment it is READY; how many became READY: :meth:`.launching.Launcher.launch`."""
        return await self.launcher.launch(count, replace=replace, on_ready=on_ready, container=container)

    def _became_ready(self, mi: ManagedInstance) -> None:
        """``mi`` is READY: the heartbeat starts with the first whose machine needs one."""
        if (self.heartbeat is not None and not self._beating and not self.closing
                and mi.runtime.runner.needs_heartbeat):
            self._beating = True
            self._spawn(self.heartbeat.run(), daemon=True)

    # ---- terminating and reconciling (:mod:`.terminating`) -------------------------------
    async def terminate(self, insts: list[ManagedInstance]) -> None:
        """Terminate ``insts`` until their provider no longer lists them (else
        TERMINATION_FAILED), then drop them: :meth:`.terminating.Terminator.terminate`."""
        await self.terminator.terminate(insts)

    async def reconcile(self) -> ReconcileResult:
        """What the providers list against what the pool holds:
        :meth:`.terminating.Terminator.reconcile`."""
        return await self.terminator.reconcile()

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
        except (FlowMeshError, OSError) as probed:   # its provider's word (evicted, ...) when it has one
            why = probed if isinstance(probed, InstanceLost) else exc
        self.give_up(mi, f"lost: {type(why).__name__}: {why}", failure=await self._why_gone(mi))
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
            mi.loss_detail = detail
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
