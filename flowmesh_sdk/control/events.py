"""The event bus: lifecycle and task events, pushed to subscribers (no polling).

``publish`` never blocks: each subscriber has its own queue.  ``wait_for`` waits on a
predicate with a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from .. import clock
from ..specs import BootstrapReport, PhaseTimings

log = logging.getLogger("flowmesh.events")


class EventKind(str, enum.Enum):
    POOL_CREATED = "pool.created"
    POOL_SCALED = "pool.scaled"
    POOL_DRAINED = "pool.drained"
    LAUNCH_FAILOVER = "launch.failover"
    # placement (flowmesh_sdk.placement): ``detail`` is JSON -- decided: count, winner and
    # runner-up with T, C, G_loc, U, price; refused: the budget, its cap and the spend
    LAUNCH_DECIDED = "launch.decided"
    LAUNCH_REFUSED = "launch.refused"
    PROVIDER_RETRY = "provider.retry"   # a provider call retried; detail JSON: provider, region, api, reason, wait_s
    INSTANCE_REQUESTED = "instance.requested"
    INSTANCE_RUNNING = "instance.running"
    INSTANCE_READY = "instance.ready"
    INSTANCE_DRAINING = "instance.draining"
    INSTANCE_FAILED = "instance.failed"
    INSTANCE_STOPPED = "instance.stopped"
    INSTANCE_TERMINATING = "instance.terminating"
    INSTANCE_TERMINATION_FAILED = "instance.termination_failed"
    INSTANCE_TERMINATED = "instance.terminated"
    IMAGE_PULLED = "image.pulled"
    IMAGE_PULL_RETRY = "image.pull_retry"
    IMAGE_EVICTED = "image.evicted"
    SANDBOX_READY = "sandbox.ready"
    SANDBOX_CLOSED = "sandbox.closed"
    TASK_SUBMITTED = "task.submitted"
    TASK_STARTED = "task.started"
    TASK_SUCCEEDED = "task.succeeded"
    TASK_FAILED = "task.failed"
    TASK_TIMED_OUT = "task.timed_out"
    TASK_REJECTED = "task.rejected"
    TASK_CANCELLED = "task.cancelled"
    TASK_REDISPATCHED = "task.redispatched"
    TASK_ROUTED = "task.routed"     # mode auto: which path (strict | shared) and why
    # result reuse (flowmesh_sdk.reuse); ``detail`` is JSON: h_task, tenant, workflow, result,
    # computed_by, saved_s
    REUSE_HIT = "reuse.hit"
    REUSE_JOINED = "reuse.joined"
    REUSE_EXECUTED = "reuse.executed"
    REUSE_CORRUPT = "reuse.corrupt"
    # GPU workers (flowmesh_sdk.workers); ``task_name`` is the worker's name, ``detail`` says
    # what (endpoint URL, model, tensor-parallel size; or a checkpoint's name and digest)
    WORKER_STARTING = "worker.starting"
    WORKER_READY = "worker.ready"
    WORKER_DRAINING = "worker.draining"
    WORKER_STOPPED = "worker.stopped"
    WORKER_FAILED = "worker.failed"
    # elastic GPU workers (flowmesh_sdk.workers.elastic); ``detail`` is JSON: the offer and its
    # U terms (rented), the reason and the requests re-dispatched (outbid), the drain (released),
    # the backlog, the target and the ranked candidates (scaled)
    WORKER_RENTED = "worker.rented"
    WORKER_OUTBID = "worker.outbid"
    WORKER_RELEASED = "worker.released"
    WORKERS_SCALED = "workers.scaled"
    CHECKPOINT_PUBLISHED = "checkpoint.published"


TASK_END = frozenset({EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED, EventKind.TASK_TIMED_OUT,
                      EventKind.TASK_REJECTED, EventKind.TASK_CANCELLED})


@dataclass(frozen=True, slots=True)
class Event:
    kind: EventKind
    fleet: str
    pool: str = ""
    instance_id: str | None = None
    task_id: str | None = None
    task_name: str | None = None
    detail: str = ""
    exit_code: int | None = None
    phases: PhaseTimings | None = None
    bootstrap: BootstrapReport | None = None   # on instance.ready and instance.failed
    at: float = field(default_factory=time.time)
    run: str = ""                              # the fleet's run id (the bus stamps it)
    tenant: str | None = None                  # on a task's end: whose task
    cost: float | None = None                  # on a task's end: TaskResult.cost ($)
    infra_failure: str | None = None           # on a task's end: TaskResult.infra_failure's value


Handler = Callable[[Event], None]


class Subscription:
    def __init__(self, bus: EventBus, kinds: frozenset[EventKind] | None) -> None:
        self._bus = bus
        self.kinds = kinds
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iter()

    async def _iter(self) -> AsyncIterator[Event]:
        while True:
            yield await self.queue.get()

    async def next(self, timeout_s: float) -> Event:
        return await asyncio.wait_for(self.queue.get(), timeout_s)

    def close(self) -> None:
        self._bus._subs.discard(self)
        self._bus._taken()


class EventBus:
    """``run``: stamped on every event published without one (the fleet's run id)."""

    def __init__(self, run: str = "") -> None:
        self.run = run
        self._subs: set[Subscription] = set()
        # replaced, not appended to, by on(): a handler that adds one while called is safe
        self._handlers: tuple[tuple[frozenset[EventKind] | None, Handler], ...] = ()
        self._wanted: frozenset[EventKind] | None = frozenset()   # what anyone takes; None: every kind

    def subscribe(self, *kinds: EventKind) -> Subscription:
        sub = Subscription(self, frozenset(kinds) or None)
        self._subs.add(sub)
        self._taken()
        return sub

    def on(self, handler: Handler, *kinds: EventKind) -> None:
        """Call ``handler(event)`` synchronously on publish (keep it quick)."""
        self._handlers += ((frozenset(kinds) or None, handler),)
        self._taken()

    def wants(self, kind: EventKind) -> bool:
        """Whether an event of ``kind`` would reach a handler or a subscription now: a
        publisher may skip making one that nobody takes."""
        wanted = self._wanted
        return wanted is None or kind in wanted

    def _taken(self) -> None:
        wanted: set[EventKind] = set()
        for kinds in [k for k, _ in self._handlers] + [sub.kinds for sub in self._subs]:
            if kinds is None:
                self._wanted = None
                return
            wanted |= kinds
        self._wanted = frozenset(wanted)

    def publish(self, event: Event) -> None:
        if self.run and not event.run:   # the pools stamp their own; this is for the rest
            event = dataclasses.replace(event, run=self.run)
        for kinds, handler in self._handlers:
            if kinds is None or event.kind in kinds:
                try:
                    handler(event)
                except Exception:  # a broken subscriber must not break the publisher
                    log.exception("event handler failed for %s", event.kind.value)
        for sub in list(self._subs):
            if sub.kinds is None or event.kind in sub.kinds:
                sub.queue.put_nowait(event)

    async def wait_for(self, predicate: Callable[[Event], bool], timeout_s: float) -> Event:
        """The next event matching ``predicate``; asyncio.TimeoutError past the deadline."""
        sub = self.subscribe()
        try:
            deadline = clock.monotonic() + timeout_s
            while True:
                ev = await sub.next(max(0.0, deadline - clock.monotonic()))
                if predicate(ev):
                    return ev
        finally:
            sub.close()
