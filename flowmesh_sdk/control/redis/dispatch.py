"""Running a pool's shared queue from many coordinators, each task's result published once.

:meth:`SharedQueue.submit` admits each task against its tenant's quota -- a tenant over
its quota is rejected right there, with the numbers -- and queues it; the tenant slot
belongs to the queued task, not to the submitter, so a submitter that dies leaks nothing.
:meth:`SharedQueue.serve` is one coordinator's share of the work: claim from the front,
take a permit of the queue's fleet-wide semaphore, run, publish, acknowledge.

Exactly once: a task is dispatched at least once (a dead coordinator's claims come back
to the front of the queue and run again elsewhere), and its result is published at most
once: the result goes into the content-addressed store and the ref
``tasks/<queue>/<task id>`` is created with the store's atomic create-if-absent.  A second
run of the same task (after an adoption) finds the ref and publishes nothing.

A coordinator fenced (its lease lapsed: paused or cut off for longer than the lease)
cancels what it was running -- it has been adopted -- and carries on under a new id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from ...cas.base import ContentStore
from ...errors import FlowMeshError
from ...specs import check_number
from ..limits import QuotaLimits
from .backend import RedisBackend
from .queue import Claim

log = logging.getLogger("flowmesh.control.redis")


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    tenant: str
    body: bytes
    attempt: int = 1


@dataclass(slots=True)
class ServeStats:
    executed: int = 0                       # runs (a re-dispatched task may run twice)
    published: list[str] = field(default_factory=list)   # task ids this coordinator published
    already: int = 0                        # runs whose result another run had published
    redispatched: int = 0                   # claims with attempt > 1 (adopted work)
    fenced: int = 0


Execute = Callable[[Job], Awaitable[bytes]]


def _encode(tenant: str, body: bytes) -> bytes:
    return tenant.encode() + b"\n" + body


def _decode(c: Claim) -> Job:
    tenant, _, body = c.payload.partition(b"\n")
    return Job(c.id, tenant.decode(), body, c.attempt)


class SharedQueue:
    """``name``: the queue (one per pool name in the backend's fleet: its keys, cap and
    quota are that fleet's); ``capacity``: tasks running at once across every coordinator
    of the fleet; ``quotas``: per-tenant limits (``"*"``: the default), the same on every
    coordinator; ``results``: the store results are published to (shared by every
    coordinator: a shared directory or S3)."""

    def __init__(self, backend: RedisBackend, name: str, *, results: ContentStore, capacity: int = 64,
                 quotas: dict[str, QuotaLimits] | None = None) -> None:
        check_number("queue.capacity", capacity, lo=1, integer=True)
        self.backend = backend
        self.name = name
        self.queue = backend.queue(name)
        self.results = results
        quotas = dict(quotas or {})
        self.quota = backend.quota(f"queue:{name}:tenants", quotas.pop("*", None))
        for tenant, lim in quotas.items():
            self.quota.set(tenant, lim)
        self.sem = backend.semaphore(f"queue:{name}", capacity)
        self.stats = ServeStats()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._migrated = False
        backend.on_fenced(self._fenced)

    async def _migrate(self) -> None:
        """Once: take in what an older version queued under this name without the fleet."""
        if not self._migrated:
            await self.queue.migrate()
            self._migrated = True

    def ref(self, task_id: str) -> str:
        return f"tasks/{self.name}/{task_id}"

    async def submit(self, bodies: Iterable[bytes], *, tenant: str = "default") -> list[str]:
        """Admit and queue each body as a task; its id back.  QuotaError (with the
        numbers) at the first one over ``tenant``'s quota: those before it are queued."""
        await self._migrate()
        ids: list[str] = []
        items = [(uuid.uuid4().hex, b) for b in bodies]
        try:
            for task_id, _ in items:
                await self.quota.admit_async(tenant, task_id=task_id)
                ids.append(task_id)
        finally:
            await self.queue.push((tid, _encode(tenant, b)) for tid, b in items[:len(ids)])
        return ids

    async def result(self, task_id: str) -> bytes | None:
        """The published result of a task (None until it is published)."""
        body = await self.results.read_ref(self.ref(task_id))
        return None if body is None else await self.results.get(body.decode())

    async def serve(self, execute: Execute, *, concurrency: int = 64, until_empty: bool = False,
                    idle_s: float = 0.5) -> ServeStats:
        """Run tasks from the queue until cancelled (or, ``until_empty``, until the queue has
        nothing queued or claimed)."""
        check_number("serve.concurrency", concurrency, lo=1, integer=True)
        await self._migrate()
        free = asyncio.Event()
        be = self.backend
        try:
            while True:
                room = concurrency - len(self._running)
                if room <= 0:
                    free.clear()
                    await free.wait()
                    continue
                ready = be.event(self.queue._ready)
                ready.clear()
                claims = await self.queue.claim(room)
                for c in claims:
                    job = _decode(c)
                    if job.attempt > 1:
                        self.stats.redispatched += 1
                    t = asyncio.ensure_future(self._one(job, execute))
                    self._running[job.id] = t
                    t.add_done_callback(functools.partial(self._done, job.id, free))
                if claims:
                    continue
                if until_empty and not self._running and await self.queue.depth() == (0, 0):
                    return self.stats
                free.clear()
                waiters = [asyncio.ensure_future(ready.wait()), asyncio.ensure_future(free.wait())]
                try:
                    await asyncio.wait(waiters, timeout=idle_s, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            for t in list(self._running.values()):
                t.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    def _done(self, task_id: str, free: asyncio.Event, _task: object) -> None:
        self._running.pop(task_id, None)
        free.set()

    async def _one(self, job: Job, execute: Execute) -> None:
        await self.sem.acquire()
        try:
            try:
                out = await execute(job)
            except FlowMeshError as exc:
                out = f"error: {type(exc).__name__}: {exc}".encode()
            self.stats.executed += 1
            digest = await self.results.put(out)
            created, _ = await self.results.create_ref(self.ref(job.id), digest.encode())
            if created:
                self.stats.published.append(job.id)
            else:
                self.stats.already += 1
            await self.queue.ack([job.id], slots=[self.quota.slot_key(job.tenant)])
        finally:
            with contextlib.suppress(FlowMeshError):
                await self.sem.release_async()

    def _fenced(self, reason: str) -> None:
        self.stats.fenced += 1
        log.warning("queue %s: fenced (%s); cancelling %d running task(s), adopted elsewhere",
                    self.name, reason, len(self._running))
        for t in list(self._running.values()):
            t.cancel()
