"""What both pool kinds share: the journey of a task (with re-dispatch when its instance
is lost), phase timings and events.  The pool composes its parts: admission
(:class:`~.admission.Admission`: the checks, the tenant's quota, the pool's semaphore),
creating sandboxes (:class:`~.sandboxes.Sandboxes`), and launching, bootstrapping,
terminating and reconciling instances (:class:`~.machines.Machines`); where they go is
its :class:`~flowmesh_sdk.placement.ranking.Placement`.  The records it is made of and
reports (:class:`PoolContext`, :class:`TaskRun`, :class:`PoolStats`) are in
:mod:`.records`, imported here too.

Admission runs the three tiers in order: the tenant's quota (rejects at once), then
the pool's semaphore (in-flight <= capacity, FIFO queue), then placement.  An image is
resolved before any of it, so a task with a missing image takes no slot and launches
nothing.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from dataclasses import asdict
from typing import Any

from .. import clock
from ..control.events import Event, EventKind
from ..control.spend import SpendSummary
from ..errors import FlowMeshError, InstanceLost, PoolClosedError, SpecError
from ..images import ImageInfo
from ..lifecycle import InstanceState, TaskState, task_lifecycle
from ..observe import tracing
from ..placement.ranking import Placement
from ..provider import Offer, Provider
from ..sandbox import Sandbox
from ..specs import PoolSpec, SandboxSpec, Task, TaskResult
from .admission import Admission
from .batch import run_tasks
from .bootstrap import Bootstrapper, RegistryLogins
from .failures import infra_failure
from .images import InstanceImages
from .instance import ManagedInstance
from .machines import Machines, ReconcileResult
from .pool import Pool
from .records import AutoStats, PoolContext, PoolStats, TaskRun
from .sandboxes import Sandboxes

__all__ = ["COALESCE_S", "AutoStats", "MachinePool", "Pool", "PoolContext", "PoolStats", "ReconcileResult",
           "TaskRun", "run_tasks"]

log = logging.getLogger("flowmesh.pools")
DRAIN_NOTICE_S = 30.0   # how often a drain without a deadline says what it still waits for

COALESCE_S = 0.02   # how long a launch (or scaling decision, or termination) waits for company


class MachinePool(Pool):
    """A pool of sandboxes on the instances its :class:`Machines` keeps, placed across
    the providers of its search space: what the two kinds share."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, providers: Mapping[str, Provider],
                 placement: Placement) -> None:
        self.ctx = ctx
        self.spec = spec
        self.name = spec.name
        self.providers = dict(providers)
        self.placement = placement
        self._closing = False
        self._closed = False
        self.admission = Admission(ctx, spec, self._capacity())
        self._bg: set[asyncio.Task[object]] = set()
        self._daemons: set[asyncio.Task[object]] = set()   # long-lived: cancelled at drain
        self.logins = RegistryLogins(ctx.authfile_for)
        self.image_cache = InstanceImages(ctx.pulls, spec.image_cache_bytes,
                                          authfile_on=self.logins.authfile, publish=self._publish)
        self.bootstrapper = Bootstrapper(ctx.bootstrap, self.logins, self.image_cache)
        self.sandboxes = Sandboxes(ctx, spec.name, self.image_cache, instances=lambda: self.instances,
                                   publish=self._publish)
        self.machines = Machines(ctx, spec, spec.name, self.providers, placement, self.bootstrapper,
                                 publish=self._publish, spawn=self._spawn, on_failed=self._on_instance_failed)
        self._publish(EventKind.POOL_CREATED, detail=json.dumps(_spec_json(spec), sort_keys=True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, providers={sorted(self.providers)})"

    @property
    def instances(self) -> dict[str, ManagedInstance]:
        return self.machines.instances

    @property
    def offers(self) -> tuple[Offer, ...]:
        """The ranked offers, in the order failover walks them."""
        return tuple(self.placement.offers())

    @property
    def capacity(self) -> int:
        """Most tasks (sandboxes) in flight at once: ``concurrency``, else its instances
        times the slots of each (the best-ranked offer's, for a bidder-shaped pool)."""
        return self._capacity()

    @property
    def provider(self) -> Provider:
        """The provider of the best-ranked offer (a pool may span several: :attr:`providers`)."""
        return self.providers[self.placement.candidates[0].offer.provider]

    # ---- to be provided by each kind -------------------------------------------
    @abc.abstractmethod
    def _capacity(self) -> int:
        """Most tasks in flight at once."""

    @abc.abstractmethod
    async def _place(self, spec: SandboxSpec, info: ImageInfo, run: TaskRun) -> ManagedInstance | None:
        """Reserve a slot (scheduling phase)."""

    @abc.abstractmethod
    async def _provision(self, spec: SandboxSpec, info: ImageInfo, inst: ManagedInstance | None,
                         run: TaskRun) -> Sandbox:
        """Make the sandbox ready (env startup phase)."""

    @abc.abstractmethod
    async def _teardown(self, sandbox: Sandbox | None, inst: ManagedInstance | None) -> None:
        """Give the slot back (teardown phase)."""

    async def start(self) -> MachinePool:
        return self

    # ---- public API --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def sandbox(self, spec: SandboxSpec | None = None, *, image: str | None = None,
                      tenant: str = "default", name: str | None = None) -> AsyncIterator[Sandbox]:
        """A sandbox for the body of an ``async with``; destroyed (and its slot freed) after.

        The task run is recorded: it succeeds when the body returns, fails when it raises.
        """
        if spec is None:
            if image is None:
                raise SpecError("sandbox.image", "give a SandboxSpec or image=")
            spec = self.default_sandbox(image)
        async with self._lease(spec, self._new_run(name or "sandbox", tenant)) as sb:
            yield sb

    def default_sandbox(self, image: str) -> SandboxSpec:
        """A sandbox of at most 1 cpu and 2 GB that fits this pool's slots, on its kernel."""
        inst = self.spec.instance
        slots = self.spec.sandboxes_per_instance if self.spec.mode.value == "persistent" else 1
        return SandboxSpec(image=image, cpus=min(1.0, float(inst.cpus)),
                           memory_gb=min(2.0, inst.memory_gb / slots), kernel=self.spec.kernel)

    async def run_task(self, task: Task) -> TaskResult:
        """Write the task's files, run its command, record and return the result.

        Errors (missing image, quota, lost instance) are returned in ``error``, not raised,
        so one bad task does not sink a batch.
        """
        run = self._new_run(task.name, task.tenant)
        if run.trace is not None:
            run.trace.task = task   # for its H_task
        run.attempts_left = self.spec.retry_infra_failures + 1
        while True:
            run.attempts_left -= 1
            run.attempts += 1
            try:
                async with self._lease(task.sandbox, run) as sb:
                    for path, data in task.files.items():
                        await sb.write_file(path, data)
                    run.result = await sb.exec(task.command, timeout_s=task.timeout_s)
                break
            except FlowMeshError:
                if not run.lifecycle.terminal:
                    continue   # its instance was lost: _lease queued it again for another
                break          # recorded in run.error by _lease
        return TaskResult(task_id=run.id, name=task.name, pool=self.name, result=run.result,
                          phases=run.phases(), error=run.error, instance_id=run.instance_id,
                          image_digest=run.image_digest, infra_failure=run.failure, attempts=run.attempts,
                          cost=run.cost, run=self.ctx.run)

    def _on_instance_failed(self) -> None:
        """Hook: an instance was given up (wake waiters so they see the capacity change)."""

    async def reconcile(self) -> ReconcileResult:
        """This pool's instances against what their providers list (see
        :meth:`Machines.reconcile`), then :meth:`_after_reconcile` (a persistent pool
        launches replacements up to ``min_instances``)."""
        if self._closing:
            return ReconcileResult()
        result = await self.machines.reconcile()
        if result.gone or result.stopped:
            self._after_reconcile(result)
        return result

    def _after_reconcile(self, result: ReconcileResult) -> None:
        """Hook: instances were found gone or stopped."""

    def spend(self) -> SpendSummary:
        """What this pool's instances cost so far, and its burn rate now."""
        return self.ctx.spend.summary(pool=self.name)

    def stats(self) -> PoolStats:
        insts = list(self.instances.values())
        spend = self.spend()
        return PoolStats(
            spent=spend.spent, burn_per_hour=spend.burn_per_hour,
            by_provider=tuple(self.ctx.spend.by_provider(self.name).items()),
            name=self.name, mode=self.spec.mode.value, instances=len(insts),
            ready=sum(i.state is InstanceState.READY for i in insts),
            launching=sum(i.state in (InstanceState.REQUESTED, InstanceState.RUNNING) for i in insts),
            in_flight=self.admission.in_flight, waiting=self.admission.sem.waiting,
            free_slots=sum(i.free for i in insts),
            warm=sum(len(v) for i in insts for v in i.warm.values()),
            warming=sum(n for i in insts for n in i.warming.values()))

    async def drain(self, timeout_s: float | None = None) -> None:
        """Admit nothing new, let in-flight tasks finish, then terminate every instance."""
        if self._closed:
            return
        self._closing = True
        self.machines.closing = True
        self._on_closing()
        idle = self.admission.idle
        if timeout_s is None:
            waited = 0.0
            while not idle.is_set():   # no deadline: say every DRAIN_NOTICE_S what it waits for
                try:
                    await asyncio.wait_for(idle.wait(), DRAIN_NOTICE_S)
                except asyncio.TimeoutError:
                    waited += DRAIN_NOTICE_S
                    log.warning("pool %s: drain has waited %.0f s for %d task(s) or sandbox(es) in flight "
                                "(one left open, or a deployment never stopped?); drain(timeout_s=...) or "
                                "fleet.close(timeout_s=...) stops waiting and terminates them",
                                self.name, waited, self.admission.in_flight)
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(idle.wait(), timeout_s)
        # Timers (the reaper) are cancelled; short work in flight (a warm container being
        # started, a launch) is let finish, so nothing it creates escapes the termination.
        for t in list(self._bg):
            if t in self._daemons:
                t.cancel()
        pending = list(self._bg)
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.ctx.bootstrap_timeout_s)
            for t in late:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.machines.terminate(list(self.instances.values()))
        self._closed = True
        self._publish(EventKind.POOL_DRAINED)

    @property
    def closed(self) -> bool:
        return self._closed

    def _on_closing(self) -> None:
        """Hook: wake waiters so they see the pool is closing."""

    # ---- the journey of one task ---------------------------------------------------
    def _new_run(self, name: str, tenant: str) -> TaskRun:
        run = TaskRun(id=secrets.token_hex(8), name=name, tenant=tenant,
                      lifecycle=task_lifecycle(name))
        run.trace = tracing.journey(self.name, run.id, name, tenant)
        run.mark("submitted")
        self._publish(EventKind.TASK_SUBMITTED, task_id=run.id, task_name=name)
        return run

    @contextlib.asynccontextmanager
    async def _lease(self, spec: SandboxSpec, run: TaskRun) -> AsyncIterator[Sandbox]:
        lc = run.lifecycle
        tenant, name = run.tenant, run.name
        if self._closing:
            self._reject(run, PoolClosedError(f"pool {self.name!r} is draining"))
        try:
            spec, info = await self.admission.check(spec, tenant)
        except FlowMeshError as exc:
            self._reject(run, exc)
        run.mark("checked")
        self.admission.enter()
        inst: ManagedInstance | None = None
        sandbox: Sandbox | None = None
        admitted = False
        redispatch = False
        started = False
        since = clock.monotonic()
        try:
            if lc.state is not TaskState.QUEUED:   # a re-dispatch is queued already
                lc.to(TaskState.QUEUED)
            await self.admission.acquire()
            admitted = True
            since = clock.monotonic()
            run.mark("admitted")
            lc.to(TaskState.SCHEDULED)
            inst = await self._place(spec, info, run)
            run.mark("placed")
            lc.to(TaskState.STARTING)
            sandbox = await self._provision(spec, info, inst, run)
            inst = self.instances.get(sandbox.instance_id, inst)
            run.instance_id = sandbox.instance_id
            run.image_digest = sandbox.image_id
            run.mark("started")
            started = True
            lc.to(TaskState.RUNNING)
            self._publish(EventKind.TASK_STARTED, task_id=run.id, task_name=name,
                          instance_id=run.instance_id)
            self.machines.hold(sandbox)   # aborted if its instance is given up (the heartbeat)
            try:
                yield sandbox
            finally:
                self.machines.release(sandbox)
                run.mark("finished")
        except BaseException as exc:
            run.cancelled = isinstance(exc, asyncio.CancelledError)
            lost = (not run.cancelled and isinstance(exc, FlowMeshError) and inst is not None
                    and await self.machines.lost(inst, exc))
            redispatch = lost and run.attempts_left > 0
            gone = (InstanceLost(f"instance {inst.id} was lost under task {name}: {inst.loss_detail or exc}")
                    if lost and inst is not None else None)   # lost is never true without an instance
            if not redispatch:
                ended = gone or exc
                run.error = run.error or ("cancelled" if run.cancelled else f"{type(ended).__name__}: {ended}")
                if not run.cancelled:
                    run.failure = infra_failure(exc, inst, started=started)
            if gone is not None:
                raise gone from exc
            raise
        finally:
            try:
                await asyncio.shield(self._teardown(sandbox, inst))
            except FlowMeshError as exc:
                if inst is None or inst.state is InstanceState.READY:
                    raise
                log.info("pool %s: teardown on lost instance %s: %s", self.name, inst.id, exc)
            finally:
                run.mark("torn_down")
                if inst is not None:
                    run.cost += self.ctx.spend.share(inst.id, since, inst.slots)
                cancelled: asyncio.CancelledError | None = None
                try:   # shielded: a task cancelled here still gives its permit and tenant slot back
                    if not self.admission.release_now(tenant, admitted):
                        await asyncio.shield(self.admission.release(tenant, admitted))
                except asyncio.CancelledError as exc:
                    cancelled = exc
                except FlowMeshError as exc:   # a shared backend out of reach: the leases lapse
                    log.warning("pool %s: releasing %s's slot: %s", self.name, name, exc)
                self.admission.leave()
                me = asyncio.current_task()   # the task running this lease (never None here)
                if redispatch and (cancelled is not None or (me is not None and me.cancelling())):
                    # cancelled while its lost instance was torn down: it ends cancelled, not queued again
                    redispatch, run.cancelled, run.error, run.failure = False, True, "cancelled", None
                if redispatch:
                    run.result, run.instance_id, run.image_digest = None, None, None
                    lc.to(TaskState.QUEUED)
                    self._publish(EventKind.TASK_REDISPATCHED, task_id=run.id, task_name=name,
                                  instance_id=inst.id if inst else None,
                                  detail=f"instance lost; {run.attempts_left} dispatch(es) left")
                else:
                    self._finish(run)
                if cancelled is not None:
                    raise cancelled

    def _reject(self, run: TaskRun, exc: FlowMeshError) -> None:
        run.lifecycle.to(TaskState.REJECTED)
        run.error = f"{type(exc).__name__}: {exc}"
        run.failure = infra_failure(exc, None, started=False)
        run.mark("torn_down")
        self._publish(EventKind.TASK_REJECTED, task_id=run.id, task_name=run.name,
                      detail=run.error, phases=run.phases(), tenant=run.tenant, cost=0.0,
                      infra_failure=run.failure.value if run.failure else None)
        raise exc

    def _finish(self, run: TaskRun) -> None:
        lc = run.lifecycle
        res = run.result
        if run.cancelled:
            kind, state = EventKind.TASK_CANCELLED, TaskState.CANCELLED
        elif run.error is None and (res is None or res.exit_code == 0) and not (res and res.timed_out):
            kind, state = EventKind.TASK_SUCCEEDED, TaskState.SUCCEEDED
        elif res is not None and res.timed_out:
            kind, state = EventKind.TASK_TIMED_OUT, TaskState.TIMED_OUT
        else:
            kind, state = EventKind.TASK_FAILED, TaskState.FAILED
        if lc.can(state):
            lc.to(state)
        elif not lc.terminal:
            lc.to(TaskState.FAILED)
            kind = EventKind.TASK_FAILED
        self._publish(kind, task_id=run.id, task_name=run.name, instance_id=run.instance_id,
                      exit_code=res.exit_code if res else None, detail=run.error or "",
                      phases=run.phases(), tenant=run.tenant, cost=run.cost,
                      infra_failure=run.failure.value if run.failure else None)

    async def _close_sandbox(self, sandbox: Sandbox | None) -> None:
        await self.sandboxes.close(sandbox)

    async def _new_sandbox(self, mi: ManagedInstance, spec: SandboxSpec, info: ImageInfo,
                           task_id: str) -> Sandbox:
        """A container from the pinned image on ``mi``, its channel open (:meth:`.sandboxes.Sandboxes.new`)."""
        return await self.sandboxes.new(mi, spec, info, task_id)

    async def prefetch(self, images: Iterable[str]) -> list[ImageInfo]:
        """Resolve ``images`` (failing fast) and pull them onto every READY instance,
        ahead of an RL step.  Returns what they resolved to."""
        infos = [await self.ctx.images.resolve(image, arch=self.spec.instance.arch) for image in images]
        ready = [mi for mi in self.instances.values() if mi.state is InstanceState.READY]
        await asyncio.gather(*(self.image_cache.ensure(mi, info) for mi in ready for info in infos))
        return infos

    def _spawn(self, coro: Coroutine[Any, Any, object], *, daemon: bool = False) -> asyncio.Task[object]:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        if daemon:
            self._daemons.add(task)
        task.add_done_callback(self._bg_done)
        return task

    def _bg_done(self, task: asyncio.Task[object]) -> None:
        self._bg.discard(task)
        self._daemons.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("pool %s background work failed: %s", self.name, task.exception())

    def _publish(self, kind: EventKind, **kw: object) -> None:
        bus = self.ctx.bus
        if bus.wants(kind):   # one that nobody takes is not made: by default, three of a task's dozen
            bus.publish(Event(kind=kind, fleet=self.ctx.fleet, pool=self.name, run=self.ctx.run,
                              **kw))  # type: ignore[arg-type]  # kw: Event's own fields, each its type


def _spec_json(spec: PoolSpec) -> dict[str, object]:
    d = asdict(spec)
    d["mode"] = spec.mode.value
    return d
