"""A pool's tasks through a shared fleet's queue (``Fleet(state="redis://...")`` or
``FLOWMESH_STATE``): any coordinator of the fleet submits them, every coordinator of the
same fleet with a pool of that name runs them (another fleet on the same Redis, pool names
alike, never sees them: the queue's keys are the fleet's), each result is published once to
the shared content-addressed store, and the tasks a coordinator had claimed when it died run
on the others.

    tasks = SharedTasks(fleet, pool, results=LocalDirStore("/shared/cas"))   # or an S3Store
    ids = await tasks.submit([Task(...), ...])
    serving = asyncio.ensure_future(tasks.serve())      # on every coordinator of the pool
    results = await tasks.gather(ids)                    # one TaskResult per id, in order

This is :class:`~flowmesh_sdk.control.redis.dispatch.SharedQueue` (admission against the
tenant's quota at submission, a fleet-wide cap on tasks running at once, claims held
under the claimer's lease, publication by create-if-absent) with a :class:`Task` as the
job and :meth:`Pool.run_task` as the work.  ``pool.run``/``pool.map`` stay in-process:
what they run dies with their coordinator.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..cas.base import ContentStore
from ..errors import FlowMeshError, SpecError
from ..specs import ExecResult, InfraFailure, PhaseTimings, SandboxSpec, Task, TaskResult, check_number

if TYPE_CHECKING:
    from ..control.backend import ControlBackend
    from ..control.redis.dispatch import Job, ServeStats
    from .base import Pool

_VERSION = 1


def encode_task(task: Task) -> bytes:
    """``task`` as JSON (files base64); :func:`decode_task` gives it back."""
    d: dict[str, Any] = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    sb = task.sandbox
    d["sandbox"] = {f.name: getattr(sb, f.name) for f in dataclasses.fields(sb)}
    d["sandbox"]["env"] = dict(sb.env)
    if isinstance(sb.network, tuple):
        d["sandbox"]["network"] = {"allow": list(sb.network)}
    d["files"] = {path: base64.b64encode(bytes(data)).decode() for path, data in task.files.items()}
    return json.dumps({"v": _VERSION, "task": d}, sort_keys=True).encode()


def decode_task(body: bytes) -> Task:
    d = dict(json.loads(body)["task"])
    sb = dict(d.pop("sandbox"))
    if isinstance(sb.get("network"), dict):
        sb["network"] = tuple(sb["network"]["allow"])
    d["files"] = {path: base64.b64decode(data) for path, data in d["files"].items()}
    return Task(sandbox=SandboxSpec(**sb), **d)


def encode_result(res: TaskResult) -> bytes:
    d = {"task_id": res.task_id, "name": res.name, "pool": res.pool, "error": res.error,
         "instance_id": res.instance_id, "image_digest": res.image_digest,
         "phases": dataclasses.asdict(res.phases),
         "result": None if res.result is None else dataclasses.asdict(res.result),
         "infra_failure": res.infra_failure.value if res.infra_failure else None,
         "attempts": res.attempts, "cost": res.cost, "run": res.run}
    return json.dumps({"v": _VERSION, "result": d}, sort_keys=True).encode()


def decode_result(body: bytes) -> TaskResult:
    d = dict(json.loads(body)["result"])
    r = d.pop("result")
    failure = d.pop("infra_failure", None)
    return TaskResult(result=None if r is None else ExecResult(**r), phases=PhaseTimings(**d.pop("phases")),
                      infra_failure=None if failure is None else InfraFailure(failure), **d)


class HasControl(Protocol):
    """What :class:`SharedTasks` needs of a fleet (a :class:`~flowmesh_sdk.fleet.Fleet` is one):
    its control backend, which must be a shared one (``RedisBackend``) with the queues."""

    @property
    def control(self) -> ControlBackend: ...


class SharedTasks:
    """``pool``'s tasks on the shared queue ``queue`` (default: the pool's name; one per
    pool name in the fleet -- ``fleet``'s keys, so another fleet's pool of the same name
    on the same Redis has a queue of its own); ``results``: the content-addressed store every
    coordinator publishes to and reads from (a shared directory or S3); ``capacity``: tasks
    of this queue running at once, fleet-wide."""

    def __init__(self, fleet: HasControl, pool: Pool, *, results: ContentStore, queue: str | None = None,
                 capacity: int = 64) -> None:
        from ..control.redis import RedisBackend
        from ..control.redis.dispatch import SharedQueue

        if not isinstance(fleet.control, RedisBackend):
            raise SpecError("fleet.state", "shared tasks need a fleet on shared state: Fleet(state='redis://"
                                           "host:port/db') or FLOWMESH_STATE (see docs/operations.md)")
        self.pool = pool
        self.queue = SharedQueue(fleet.control, queue or pool.name, results=results, capacity=capacity)

    def __repr__(self) -> str:
        return f"SharedTasks({self.queue.name!r}, pool={self.pool.name!r})"

    async def submit(self, tasks: Sequence[Task]) -> list[str]:
        """Queue ``tasks`` (each admitted against its tenant's quota: a QuotaError, with the
        numbers, at the first one over it -- those before it are queued); their ids."""
        ids: list[str] = []
        for tenant, run in itertools.groupby(tasks, key=lambda t: t.tenant):   # in order, a run per tenant
            ids += await self.queue.submit((encode_task(t) for t in run), tenant=tenant)
        return ids

    async def serve(self, *, concurrency: int = 32, until_empty: bool = False) -> ServeStats:
        """Run the queue's tasks on this coordinator's pool until cancelled (or, with
        ``until_empty``, until nothing is queued or claimed fleet-wide)."""
        return await self.queue.serve(self._execute, concurrency=concurrency, until_empty=until_empty)

    async def _execute(self, job: Job) -> bytes:
        try:
            task = decode_task(job.body)
        except (ValueError, KeyError, TypeError, FlowMeshError) as exc:   # published as a failed result
            return encode_result(TaskResult(job.id, "?", self.pool.name, None, PhaseTimings(),
                                            error=f"the queued task cannot be read: {type(exc).__name__}: {exc}"))
        retries = self.pool.spec.retry_infra_failures
        if job.attempt > retries + 1:   # its coordinators died under it more often than its pool retries
            return encode_result(TaskResult(
                job.id, task.name, self.pool.name, None, PhaseTimings(), attempts=job.attempt - 1,
                infra_failure=InfraFailure.COORDINATOR_LOST, run=self.pool.ctx.run,
                error=f"InstanceLost: the coordinators running it were lost {job.attempt - 1} time(s); "
                      f"its pool retries infrastructure failures {retries} time(s) (retry_infra_failures)"))
        res = await self.pool.run_task(task)
        return encode_result(dataclasses.replace(res, task_id=job.id, attempts=res.attempts + job.attempt - 1))

    async def result(self, task_id: str) -> TaskResult | None:
        """The published result of one task (None until it is published)."""
        body = await self.queue.result(task_id)
        return None if body is None else decode_result(body)

    async def gather(self, ids: Sequence[str], *, poll_s: float = 0.2) -> list[TaskResult]:
        """Every task's result, in the order of ``ids``, once all are published (polling the
        store every ``poll_s``; bound the wait with ``asyncio.timeout``)."""
        check_number("poll_s", poll_s, lo=0, lo_open=True)
        got: dict[str, TaskResult] = {}
        while True:
            for tid in ids:
                if tid not in got and (r := await self.result(tid)) is not None:
                    got[tid] = r
            if len(got) == len(set(ids)):
                return [got[tid] for tid in ids]
            await asyncio.sleep(poll_s)
