"""The request side of an elastic role, a component :class:`~.elastic.ElasticWorkers`
composes: the role's queue of requests and the dispatcher that hands each to the READY
worker with the fewest in flight (at most ``worker_concurrency`` each), re-dispatching a
request whose worker is lost or leaves (at most ``max_redispatch`` times), exactly once.

It knows the workers only through what it is given: a callable listing them, the
scaling policy, a counter it adds ``answered``/``redispatched`` to, and callbacks (a
worker is lost, publish an event, wake the control loop)."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .. import clock
from ..control.events import EventKind
from ..errors import FlowMeshError, PoolClosedError, ProviderUnavailableError
from .elastic_records import ElasticWorker, ScalingPolicy
from .endpoint import Completion
from .specs import SamplingParams
from .state import WorkerState


@dataclass(eq=False, slots=True)
class Job:
    prompt: str
    params: SamplingParams
    timeout_s: float | None
    future: asyncio.Future[Completion]
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    dispatches: int = 0
    task: asyncio.Task[None] | None = None


class RequestQueue:
    """One role's requests and their dispatch (see the module docstring)."""

    def __init__(self, workers: Callable[[], Iterable[ElasticWorker]], scaling: ScalingPolicy,
                 counts: collections.Counter[str], *, lose: Callable[[ElasticWorker, str], None],
                 emit: Callable[..., None], wake: Callable[[], None]) -> None:
        self._workers = workers
        self.scaling = scaling
        self._counts = counts
        self._lose = lose
        self._emit = emit
        self._wake = wake
        self._jobs: collections.deque[Job] = collections.deque()
        self._work = asyncio.Event()

    def waiting(self) -> int:
        return sum(1 for j in self._jobs if not j.future.done())

    def notify(self) -> None:
        """A worker became READY or freed a place: dispatch again."""
        self._work.set()

    async def put(self, prompt: str, params: SamplingParams, timeout_s: float | None) -> Completion:
        """Queue one request and return its answer, from whichever worker."""
        job = Job(prompt, params, timeout_s, asyncio.get_running_loop().create_future())
        self._jobs.append(job)
        self._work.set()
        self._wake()
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not job.future.done():
                job.future.cancel()
            if job.task is not None:
                job.task.cancel()
            raise

    def fail_all(self, error: Callable[[], FlowMeshError]) -> None:
        """Answer every waiting request with ``error()`` (the role is closing)."""
        while self._jobs:
            job = self._jobs.popleft()
            if not job.future.done():
                job.future.set_exception(error())

    def _pick(self) -> ElasticWorker | None:
        ready = [w for w in self._workers() if w.state is WorkerState.READY and w.endpoint is not None
                 and w.assigned < self.scaling.worker_concurrency]
        return min(ready, key=lambda w: (w.assigned, -w.candidate.score.utility)) if ready else None

    async def dispatch(self) -> None:
        """The dispatcher (runs until cancelled)."""
        while True:
            await self._work.wait()
            self._work.clear()
            while self._jobs:
                if self._jobs[0].future.done():
                    self._jobs.popleft()
                    continue
                w = self._pick()
                if w is None:
                    break
                job = self._jobs.popleft()
                w.assigned += 1
                job.dispatches += 1
                job.task = asyncio.ensure_future(self._run(job, w))

    async def _run(self, job: Job, w: ElasticWorker) -> None:
        assert w.endpoint is not None
        try:
            answer = await w.endpoint.complete(job.prompt, job.params, timeout_s=job.timeout_s)
        except (PoolClosedError, ProviderUnavailableError) as exc:
            if isinstance(exc, ProviderUnavailableError) and w.state is WorkerState.READY:
                w.failures += 1
                if w.failures >= 3:
                    self._lose(w, f"unreachable ({exc})"[:200])
            if job.future.done():
                return
            if job.dispatches > self.scaling.max_redispatch:
                job.future.set_exception(exc)
                return
            self._counts["redispatched"] += 1
            self._jobs.appendleft(job)
            self._emit(EventKind.TASK_REDISPATCHED, w, {"from": w.name, "why": type(exc).__name__,
                                                        "dispatches": job.dispatches}, task_id=job.id)
            self._wake()
        except FlowMeshError as exc:
            if not job.future.done():
                job.future.set_exception(exc)
        else:
            w.failures = 0
            if not job.future.done():
                self._counts["answered"] += 1
                job.future.set_result(answer)
        finally:
            w.assigned -= 1
            if w.assigned == 0:
                w.idle_since = clock.monotonic()
            self._work.set()
