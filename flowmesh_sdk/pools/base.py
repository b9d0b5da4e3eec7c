"""What both pool kinds share: admission, identity of a task run, launching and
bootstrapping instances, creating sandboxes, phase timings and events.

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
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

from .. import clock
from ..control.backend import ControlBackend
from ..control.events import Event, EventBus, EventKind
from ..control.limits import Quota, Semaphore
from ..errors import (ContainerRuntimeError, FlowMeshError, ImageNotFoundError, InstanceLost,
                      PoolClosedError, ProviderUnavailableError, SandboxClosedError, SandboxTimeout,
                      SpecError)
from ..images import ImageInfo, ImageResolver, PullBudget
from ..lifecycle import InstanceState, Lifecycle, TaskState, task_lifecycle
from ..provider import (LABEL_FLEET, LABEL_INSTANCE, LABEL_OWNER, LABEL_POOL, LABEL_TASK, TAG_FLEET,
                        TAG_OWNER, TAG_POOL, Offer, Provider, ProviderState)
from ..provisioning import Provisioner
from ..remote.runner import Runner
from ..remote.runtime import ContainerRuntime
from ..sandbox import Sandbox
from ..specs import ExecResult, PhaseTimings, PoolSpec, SandboxSpec, Task, TaskResult
from .bootstrap import BootstrapPolicy, Bootstrapper, RegistryLogins
from .images import InstanceImages
from .instance import ManagedInstance

log = logging.getLogger("flowmesh.pools")

COALESCE_S = 0.02   # how long a launch (or scaling decision, or termination) waits for company


# errors under a task after which the instance itself is checked (a dead connection, a
# container runtime that stopped answering, a sandbox channel that died)
_MAYBE_LOST = (InstanceLost, ProviderUnavailableError, SandboxClosedError, SandboxTimeout,
               ContainerRuntimeError)


@dataclass(frozen=True, slots=True)
class PoolContext:
    """What a fleet lends each of its pools."""

    fleet: str
    owner: str
    bus: EventBus
    images: ImageResolver
    quota: Quota
    control: ControlBackend
    pulls: PullBudget
    provisioner: Provisioner
    authfile_for: Callable[[str], str | None]
    runtime_for: Callable[[Runner], ContainerRuntime]
    bootstrap_timeout_s: float = 600.0
    bootstrap: BootstrapPolicy = field(default_factory=BootstrapPolicy)


@dataclass(slots=True)
class TaskRun:
    """One pass of a task through the pool, with the marks its phases are cut from."""

    id: str
    name: str
    tenant: str
    lifecycle: Lifecycle[TaskState]
    marks: dict[str, float] = field(default_factory=dict)
    instance_id: str | None = None
    result: ExecResult | None = None
    error: str | None = None
    cancelled: bool = False
    image_digest: str | None = None
    attempts_left: int = 0   # further dispatches allowed if its instance is lost under it

    def mark(self, what: str) -> None:
        self.marks[what] = clock.monotonic()

    def _span(self, a: str, b: str) -> float:
        m = self.marks
        return max(0.0, m[b] - m[a]) if a in m and b in m else 0.0

    def phases(self) -> PhaseTimings:
        """queued: waiting for the semaphore; scheduling: dispatch checks (image, quota)
        plus finding a slot; env_startup: instance and sandbox ready; execution: the work;
        teardown: sandbox destroyed and slot (or instance) given back."""
        return PhaseTimings(
            queued=self._span("checked", "admitted"),
            scheduling=self._span("submitted", "checked") + self._span("admitted", "placed"),
            env_startup=self._span("placed", "started"),
            execution=self._span("started", "finished"),
            teardown=self._span("finished", "torn_down"))


@dataclass(frozen=True, slots=True)
class PoolStats:
    name: str
    mode: str
    instances: int
    ready: int
    launching: int
    in_flight: int
    waiting: int
    free_slots: int
    warm: int
    warming: int


class Pool(abc.ABC):
    """A pool of instances of one size on one provider.  See the two kinds."""

    def __init__(self, ctx: PoolContext, spec: PoolSpec, provider: Provider,
                 offers: Sequence[Offer]) -> None:
        self.ctx = ctx
        self.spec = spec
        self.name = spec.name
        self.provider = provider
        self.offers = tuple(offers)   # in preference order: failover walks down the list
        self.instances: dict[str, ManagedInstance] = {}
        self._closing = False
        self._closed = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._sem: Semaphore = ctx.control.semaphore(f"fleet:{ctx.fleet}:pool:{spec.name}",
                                                     self._capacity())
        self._bg: set[asyncio.Task[object]] = set()
        self._terminating: set[str] = set()
        self._daemons: set[asyncio.Task[object]] = set()   # long-lived: cancelled at drain
        self.logins = RegistryLogins(ctx.authfile_for)
        self.image_cache = InstanceImages(ctx.pulls, spec.image_cache_bytes,
                                          authfile_on=self.logins.authfile, publish=self._publish)
        self.bootstrapper = Bootstrapper(ctx.bootstrap, self.logins, self.image_cache)
        self._publish(EventKind.POOL_CREATED, detail=json.dumps(_spec_json(spec), sort_keys=True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, provider={self.provider.name})"

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

    async def start(self) -> Pool:
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
        """A sandbox of at most 1 cpu and 2 GB that fits this pool's slots."""
        inst = self.spec.instance
        slots = self.spec.sandboxes_per_instance if self.spec.mode.value == "persistent" else 1
        return SandboxSpec(image=image, cpus=min(1.0, float(inst.cpus)),
                           memory_gb=min(2.0, inst.memory_gb / slots))

    async def run_task(self, task: Task) -> TaskResult:
        """Write the task's files, run its command, record and return the result.

        Errors (missing image, quota, lost instance) are returned in ``error``, not raised,
        so one bad task does not sink a batch.
        """
        run = self._new_run(task.name, task.tenant)
        run.attempts_left = self.spec.task_attempts
        while True:
            run.attempts_left -= 1
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
                          image_digest=run.image_digest)

    async def map(self, tasks: Iterable[Task], *,
                  on_result: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
        """Run every task (at most the pool's capacity at once); results in input order."""
        items = list(tasks)
        results: list[TaskResult | None] = [None] * len(items)

        async def one(i: int, task: Task) -> None:
            results[i] = res = await self.run_task(task)
            if on_result is not None:
                on_result(res)

        await asyncio.gather(*(one(i, t) for i, t in enumerate(items)))
        return [r for r in results if r is not None]

    def stats(self) -> PoolStats:
        insts = list(self.instances.values())
        return PoolStats(
            name=self.name, mode=self.spec.mode.value, instances=len(insts),
            ready=sum(i.state is InstanceState.READY for i in insts),
            launching=sum(i.state in (InstanceState.REQUESTED, InstanceState.RUNNING) for i in insts),
            in_flight=self._in_flight, waiting=self._sem.waiting,
            free_slots=sum(i.free for i in insts),
            warm=sum(len(v) for i in insts for v in i.warm.values()),
            warming=sum(n for i in insts for n in i.warming.values()))

    async def drain(self, timeout_s: float | None = None) -> None:
        """Admit nothing new, let in-flight tasks finish, then terminate every instance."""
        if self._closed:
            return
        self._closing = True
        self._on_closing()
        if timeout_s is None:
            await self._idle.wait()
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout_s)
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
        await self._terminate(list(self.instances.values()))
        self._closed = True
        self._publish(EventKind.POOL_DRAINED)

    close = drain

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.drain()

    def _on_closing(self) -> None:
        """Hook: wake waiters so they see the pool is closing."""

    # ---- the journey of one task ---------------------------------------------------
    def _new_run(self, name: str, tenant: str) -> TaskRun:
        run = TaskRun(id=uuid.uuid4().hex[:16], name=name, tenant=tenant,
                      lifecycle=task_lifecycle(name))
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
            self.spec.check_fits(spec)
            info = await self.ctx.images.resolve(spec.image, arch=self.spec.instance.arch)
            self.ctx.quota.admit(tenant)
        except FlowMeshError as exc:
            self._reject(run, exc)
        run.mark("checked")
        self._in_flight += 1
        self._idle.clear()
        inst: ManagedInstance | None = None
        sandbox: Sandbox | None = None
        admitted = False
        redispatch = False
        try:
            if lc.state is not TaskState.QUEUED:   # a re-dispatch is queued already
                lc.to(TaskState.QUEUED)
            await self._sem.acquire()
            admitted = True
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
            lc.to(TaskState.RUNNING)
            self._publish(EventKind.TASK_STARTED, task_id=run.id, task_name=name,
                          instance_id=run.instance_id)
            try:
                yield sandbox
            finally:
                run.mark("finished")
        except BaseException as exc:
            run.cancelled = isinstance(exc, asyncio.CancelledError)
            lost = (not run.cancelled and isinstance(exc, FlowMeshError) and inst is not None
                    and await self._lost(inst, exc))
            redispatch = lost and run.attempts_left > 0
            if not redispatch:
                run.error = run.error or ("cancelled" if run.cancelled else f"{type(exc).__name__}: {exc}")
            if lost:
                raise InstanceLost(f"instance {inst.id} was lost under task {name}: {exc}") from exc
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
                if admitted:
                    self._sem.release()
                self.ctx.quota.release(tenant)
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()
                if redispatch:
                    run.result, run.instance_id, run.image_digest = None, None, None
                    lc.to(TaskState.QUEUED)
                    self._publish(EventKind.TASK_REDISPATCHED, task_id=run.id, task_name=name,
                                  instance_id=inst.id if inst else None,
                                  detail=f"instance lost; {run.attempts_left} dispatch(es) left")
                else:
                    self._finish(run)

    def _reject(self, run: TaskRun, exc: FlowMeshError) -> None:
        run.lifecycle.to(TaskState.REJECTED)
        run.error = f"{type(exc).__name__}: {exc}"
        run.mark("torn_down")
        self._publish(EventKind.TASK_REJECTED, task_id=run.id, task_name=run.name,
                      detail=run.error, phases=run.phases())
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
                      phases=run.phases())

    # ---- instances -------------------------------------------------------------
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

    async def _close_sandbox(self, sandbox: Sandbox | None) -> None:
        if sandbox is None:
            return
        try:
            await sandbox.close()
        finally:
            self.image_cache.release(self.instances.get(sandbox.instance_id), sandbox.image_id)
        self._publish(EventKind.SANDBOX_CLOSED, instance_id=sandbox.instance_id, detail=sandbox.name)

    async def _new_sandbox(self, mi: ManagedInstance, spec: SandboxSpec, info: ImageInfo,
                           task_id: str) -> Sandbox:
        """A container from the pinned image on ``mi``, its channel open."""
        name = f"fm-{self.name}-{uuid.uuid4().hex[:10]}"
        labels = {LABEL_FLEET: self.ctx.fleet, LABEL_POOL: self.name, LABEL_INSTANCE: mi.id,
                  LABEL_OWNER: self.ctx.owner, LABEL_TASK: task_id}
        # wanted from before its pull until its container holds it: eviction never takes an
        # image a sandbox on its way needs (another task's pull may cross the high-water mark)
        mi.wanted[info.digest] = mi.wanted.get(info.digest, 0) + 1
        try:
            await self.image_cache.ensure(mi, info)
            try:
                cid = await mi.runtime.create(name, spec, labels, image=info.run_ref)
            except ImageNotFoundError:
                # removed behind our back (a store shared with other pools): pull it again, once
                mi.images.pop(info.digest, None)
                await self.image_cache.ensure(mi, info)
                cid = await mi.runtime.create(name, spec, labels, image=info.run_ref)
            self.image_cache.acquire(mi, info.digest)
        finally:
            mi.wanted[info.digest] -= 1
            if not mi.wanted[info.digest]:
                del mi.wanted[info.digest]
        sb = Sandbox(mi.runtime, cid, name, spec, instance_id=mi.id, image_id=info.digest)
        try:
            await sb.start()
        except BaseException:
            self.image_cache.release(mi, info.digest)
            await mi.runtime.remove([cid])
            raise
        self._publish(EventKind.SANDBOX_READY, instance_id=mi.id, detail=name)
        return sb

    async def prefetch(self, images: Iterable[str]) -> list[ImageInfo]:
        """Resolve ``images`` (failing fast) and pull them onto every READY instance,
        ahead of an RL step.  Returns what they resolved to."""
        infos = [await self.ctx.images.resolve(image, arch=self.spec.instance.arch) for image in images]
        ready = [mi for mi in self.instances.values() if mi.state is InstanceState.READY]
        await asyncio.gather(*(self.image_cache.ensure(mi, info) for mi in ready for info in infos))
        return infos

    def _spawn(self, coro, *, daemon: bool = False) -> asyncio.Task[object]:
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
        self.ctx.bus.publish(Event(kind=kind, fleet=self.ctx.fleet, pool=self.name, **kw))  # type: ignore[arg-type]


def _spec_json(spec: PoolSpec) -> dict[str, object]:
    d = asdict(spec)
    d["mode"] = spec.mode.value
    return d
