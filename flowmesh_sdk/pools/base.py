"""What both pool kinds share: admission, the journey of a task (with re-dispatch when its
instance is lost), creating sandboxes, phase timings and events.  Launching,
bootstrapping and terminating instances is :mod:`.machines`.

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
from ..errors import FlowMeshError, ImageNotFoundError, InstanceLost, PoolClosedError, SpecError
from ..images import ImageInfo, ImageResolver, PullBudget
from ..lifecycle import InstanceState, Lifecycle, TaskState, task_lifecycle
from ..provider import (LABEL_FLEET, LABEL_INSTANCE, LABEL_OWNER, LABEL_POOL, LABEL_TASK, Offer,
                        Provider)
from ..provisioning import Provisioner
from ..remote.runner import Runner
from ..remote.runtime import ContainerRuntime
from ..sandbox import Sandbox
from ..specs import ExecResult, PhaseTimings, PoolSpec, SandboxSpec, Task, TaskResult
from .bootstrap import BootstrapPolicy, Bootstrapper, RegistryLogins
from .images import InstanceImages
from .instance import ManagedInstance
from .machines import Machines

log = logging.getLogger("flowmesh.pools")

COALESCE_S = 0.02   # how long a launch (or scaling decision, or termination) waits for company


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


class Pool(Machines, abc.ABC):
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
