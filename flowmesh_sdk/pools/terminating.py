"""The ending side of a pool's instances, a component its :class:`~.machines.Machines`
composes: terminating in batches (one call per provider and region, retried until the
provider no longer lists them, else TERMINATION_FAILED), dropping what is gone (its cost
ended in the ledger), and reconciling what the providers list with what the pool
believes (:class:`ReconcileResult`).

It knows the pool through what it is given: the pool's context and name, the shared
:class:`~.inventory.Inventory`, and callbacks (publish an event, spawn background work,
give an instance up)."""

from __future__ import annotations

import asyncio
import json
import logging
import operator
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Any, Protocol

from ..control.events import EventKind
from ..errors import FlowMeshError
from ..lifecycle import InstanceState
from ..provisioning import TERMINATE_ATTEMPTS
from ..provider import Instance, Provider, ProviderState
from ..specs import InfraFailure
from .instance import ManagedInstance
from .inventory import Inventory
from .records import PoolContext

log = logging.getLogger("flowmesh.pools")

_GONE = (ProviderState.TERMINATED,)
_ID, _STATE = operator.attrgetter("id"), operator.attrgetter("state")
_RECONCILED = frozenset({InstanceState.READY, InstanceState.RUNNING, InstanceState.TERMINATION_FAILED,
                         InstanceState.STOPPED})   # the states a reconcile asks the provider about


class GiveUp(Protocol):
    """How an instance is given up (:meth:`~.machines.Machines.give_up`)."""

    def __call__(self, mi: ManagedInstance, detail: str, *, terminate: bool = True,
                 failure: InfraFailure | None = None) -> None: ...


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


class Terminator:
    """Terminates and reconciles one pool's instances (see the module docstring)."""

    def __init__(self, ctx: PoolContext, pool: str, inventory: Inventory, *, publish: Callable[..., None],
                 spawn: Callable[..., asyncio.Task[Any]], give_up: GiveUp) -> None:
        self.ctx = ctx
        self.pool = pool
        self.inventory = inventory
        self._publish = publish
        self._spawn = spawn
        self._give_up = give_up

    # ---- terminating -----------------------------------------------------------------
    async def terminate(self, insts: list[ManagedInstance]) -> None:
        """Destroy warm sandboxes, terminate the instances (one call per provider and
        region), retried until their provider no longer lists them, then drop them --
        each once, however many callers ask.  An instance still listed after
        ``TERMINATE_ATTEMPTS`` rounds is TERMINATION_FAILED (kept, still accruing cost, and
        retried by the reconciler)."""
        terminating = self.inventory.terminating
        insts = [mi for mi in insts if mi.id not in terminating]
        if not insts:
            return
        terminating.update(mi.id for mi in insts)
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
            terminating.difference_update(mi.id for mi in insts)

    async def _terminate_group(self, insts: list[ManagedInstance]) -> None:
        provider = insts[0].provider
        region = insts[0].instance.region
        for mi in insts:
            if mi.lifecycle.can(InstanceState.TERMINATING):
                mi.lifecycle.to(InstanceState.TERMINATING)
                self._publish(EventKind.INSTANCE_TERMINATING, instance_id=mi.id)
        still = await self.terminate_ids(provider, region, [mi.id for mi in insts])
        for mi in insts:
            if mi.id in still:
                if mi.lifecycle.can(InstanceState.TERMINATION_FAILED):
                    mi.lifecycle.to(InstanceState.TERMINATION_FAILED)
                self.inventory.termination_failed.add(mi.id)
                self._publish(EventKind.INSTANCE_TERMINATION_FAILED, instance_id=mi.id,
                              detail=f"still listed by {provider.name} after {TERMINATE_ATTEMPTS} terminate calls")
                continue
            self.gone(mi, "")

    async def terminate_ids(self, provider: Provider, region: str, ids: list[str]) -> set[str]:
        """Terminate ``ids`` until confirmed (:meth:`Provisioner.terminate`); returns those
        still listed at the end."""
        return await self.ctx.provisioner.terminate(provider, region, ids, label=f"pool {self.pool}")

    def gone(self, mi: ManagedInstance, detail: str) -> None:
        """``mi`` is no more: TERMINATED, dropped, its cost ended (``instance.terminated``)."""
        if mi.lifecycle.can(InstanceState.TERMINATED):
            mi.lifecycle.to(InstanceState.TERMINATED)
        self.inventory.drop(mi)
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
        inv = self.inventory
        for (_, region), group in list(inv.where.items()):
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
            # the common case -- listed running, as the pool thinks -- in C loops (map,
            # compress): this runs over every instance each reconcile (issue 29)
            states = list(map(_STATE, described))
            listed = list(map(_ID, described))
            seen: dict[str, Instance] | None = None   # the listing of each suspect
            if listed == ids:   # each one listed, in the order asked: those not running are the suspects
                seen = dict(compress(zip(listed, described), map(operator.is_not, states, repeat(running))))
                suspects = set(seen)
            else:
                suspects = set(ids)
                suspects.difference_update(compress(listed, map(operator.is_, states, repeat(running))))
            # one whose termination failed is looked at again, listed running or not
            again = [i for i in inv.termination_failed if i in group]
            if again:
                suspects.update(again)
                seen = None
            if not suspects:
                continue
            if seen is None:
                seen = dict(zip(listed, described))
            for iid in suspects:
                mi = group.get(iid)
                if mi is None or iid in inv.terminating or mi.lifecycle.state not in _RECONCILED:
                    continue   # gone, being terminated, or not one a reconcile asks about
                now, state = seen.get(iid), mi.lifecycle.state
                if state is failed:
                    if now is None or now.state in _GONE:
                        self.gone(mi, "reconciled: no longer listed")
                    else:
                        retried.append(mi.id)
                    continue
                if now is None or now.state in _GONE:
                    gone.append(mi.id)
                    self._give_up(mi, "reconciled: its provider no longer lists it (preempted or removed)",
                                  terminate=False, failure=preempted_or_lost(mi, now))
                    self.gone(mi, "reconciled: no longer listed by its provider")
                elif now.state is ProviderState.STOPPED and state is not InstanceState.STOPPED:
                    stopped.append(mi.id)
                    mi.lifecycle.to(InstanceState.STOPPED)
                    self._publish(EventKind.INSTANCE_STOPPED, instance_id=mi.id, detail="reported stopped")
                    self._give_up(mi, "stopped by its provider", failure=preempted_or_lost(mi, now))
        if retried:
            self._spawn(self.terminate([inv.instances[i] for i in retried if i in inv.instances]))
        return ReconcileResult(tuple(gone), tuple(stopped), tuple(retried))
