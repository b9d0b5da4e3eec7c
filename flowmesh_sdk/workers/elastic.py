"""Elastic GPU workers (FlowMesh §5): a control loop that follows an inference role's
ready-work queue by renting and releasing workers.

:class:`ElasticWorkers` owns the role's queue.  ``await elastic.complete(prompt)`` puts a
request on it; a dispatcher hands each request to the READY worker with the fewest in
flight (at most ``ScalingPolicy.worker_concurrency`` each) through that worker's
:class:`~flowmesh_sdk.workers.endpoint.InferenceEndpoint` (rate limit, locality headers,
micro-batching).  Each tick (``interval_s``, or at once when the queue changes) the loop

1. **reconciles**: asks the provider to describe the workers' instances; one the cloud
   reports stopped or gone (a Vast.ai interruptible instance that was outbid is
   ``STOPPED``) is *outbid/lost*: its endpoint is closed, the requests it held are put
   back at the head of the queue (``TASK_REDISPATCHED``) and answered by another worker,
   exactly once, and the instance is released;
2. **scales**: ``desired = ceil(backlog / target_queue_per_worker)`` within
   ``[min_workers, max_workers]``, the backlog being the requests waiting plus those in
   flight.  Below it, it rents the difference: the providers' offers, priced
   (:func:`~flowmesh_sdk.placement.ranking.priced_offers`) and ranked by the bidder's
   U(j,B) for a GPU demand carrying the :class:`~flowmesh_sdk.bidder.ModelSpec` (the VRAM
   gate, decode throughput, expected cost after interruptions from the offer's
   reliability and market, and G_loc where the weights are resident), each rental
   failing over down that order (:class:`~flowmesh_sdk.provisioning.Provisioner`).  Above
   it, a worker idle for ``scale_down_idle_s`` is **drained** (admits nothing, finishes
   what it holds) and only then **released** (engine stopped, instance terminated).
   ``cooldown_s`` separates scaling actions; replacing a lost worker does not wait.

A rented worker joins the FlowMesh way: the instance is reached (``Runner.wait_reachable``),
the engine is started as the instance's own process (:class:`ServeCommand`; Vast.ai
instances are containers, ``nested_containers=False``), its ``/health`` and ``/v1/models``
are waited for (:func:`~flowmesh_sdk.workers.health.wait_until_healthy`), and only then is
it READY.  The rent-to-ready lag is measured in its parts (:class:`WorkerLag`) and
published on ``WORKER_READY``.

Only the provider contract is used: any provider whose offers have GPUs works; the tests
run it on Vast.ai (``flowmesh_sdk.testing.vast``) and on Kubernetes GPU pods
(``flowmesh_sdk.testing.k8s``, reached through port-forwards: docs/providers/k8s.md).  See
docs/workers.md.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from .. import clock
from ..bidder.demand import Demand, ModelSpec
from ..bidder.gates import NoFeasibleOffer
from ..bidder.policy import PRESETS, Policy
from ..control.backend import ControlBackend, InProcessBackend
from ..control.events import Event, EventBus, EventKind
from ..errors import FlowMeshError, PoolClosedError, ProviderUnavailableError, SpecError
from ..placement.infra import InfraEntry
from ..placement.ranking import Candidate, PriceBook, priced_offers, rank_demand
from ..provider import TAG_FLEET, TAG_OWNER, TAG_POOL, Provider, ProviderState
from ..provisioning import Provisioner, RetryPolicy
from ..specs import InstanceSpec
from .endpoint import Completion, DrainReport, InferenceEndpoint
from .errors import WorkerStartError
from .health import wait_until_healthy
from .specs import ClientLimits, SamplingParams
from .elastic_records import (ElasticStats, ElasticWorker, ScalingDecision, ScalingPolicy, ServeCommand,
                              WorkerLag)
from .state import WorkerState, worker_lifecycle

log = logging.getLogger("flowmesh.workers.elastic")

_SPOT = {"on-demand": "never", "spot": "only", "any": "prefer"}
ANYWHERE = (InfraEntry("*"),)


@dataclass(eq=False, slots=True)
class _Job:
    prompt: str
    params: SamplingParams
    timeout_s: float | None
    future: asyncio.Future[Completion]
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    dispatches: int = 0
    task: asyncio.Task[None] | None = None


class ElasticWorkers:
    """The control loop of one inference role (module docstring).

    ``providers``: one :class:`Provider` or a mapping name -> provider (the search space);
    ``spec``: the instance to ask offers for (its ``gpus`` per worker); ``model``: the
    :class:`ModelSpec` the bidder checks VRAM and throughput against; ``engine``: how the
    engine starts (:class:`ServeCommand`); ``scaling``: a :class:`ScalingPolicy`;
    ``weights``: the bidder's :class:`Policy` (w_t, w_c, w_l); ``resident``: where the
    weights are cached (``provider``, ``provider/region`` or ``provider/region/type``:
    G_loc = 1 there); ``book``: catalog prices for offers that carry none (marketplace
    quotes are kept); ``bus``: where events go (the fleet's bus)."""

    def __init__(self, providers: Provider | Mapping[str, Provider], spec: InstanceSpec, model: ModelSpec,
                 engine: ServeCommand, *, scaling: ScalingPolicy | None = None, weights: Policy | None = None,
                 resident: Sequence[str] = (), role: str = "inference", fleet: str = "elastic",
                 owner: str = "flowmesh", bus: EventBus | None = None, control: ControlBackend | None = None,
                 retry: RetryPolicy | None = None, limits: ClientLimits | None = None,
                 book: PriceBook | None = None) -> None:
        self.providers: dict[str, Provider] = ({providers.name: providers} if isinstance(providers, Provider)
                                               else dict(providers))
        if not self.providers or not all(isinstance(p, Provider) for p in self.providers.values()):
            raise SpecError("elastic.providers", "must be a Provider or a non-empty mapping of name -> Provider")
        if not isinstance(spec, InstanceSpec) or spec.gpus < 1:
            raise SpecError("elastic.spec", f"must be an InstanceSpec with gpus >= 1, got {spec!r}")
        if not any(p.capabilities.gpus for p in self.providers.values()):
            raise SpecError("elastic.providers", "no provider declares GPUs (Capabilities.gpus)")
        if not isinstance(model, ModelSpec):
            raise SpecError("elastic.model", f"must be a ModelSpec, got {type(model).__name__}")
        if not isinstance(engine, ServeCommand):
            raise SpecError("elastic.engine", f"must be a ServeCommand, got {type(engine).__name__}")
        self.spec, self.model, self.engine = spec, model, engine
        self.scaling = scaling or ScalingPolicy()
        if not isinstance(self.scaling, ScalingPolicy):
            raise SpecError("elastic.scaling", "must be a ScalingPolicy")
        self.weights = weights or PRESETS["balanced"]
        self.resident = tuple(resident)
        self.role, self.fleet, self.owner = role, fleet, owner
        self.bus = bus or EventBus()
        self.provisioner = Provisioner(control or InProcessBackend(), retry or RetryPolicy(attempts=5, backoff_s=0.2))
        self.limits = limits or ClientLimits()
        self.book = book or PriceBook(())
        self.workers: dict[str, ElasticWorker] = {}
        self.avoided: set[str] = set()           # offer ids that outbid or failed us
        self._queue: collections.deque[_Job] = collections.deque()
        self._wake = asyncio.Event()
        self._work = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()
        self._closed = False
        self._last_scale = -math.inf
        self._last_reconcile = -math.inf
        self._replace: list[str] = []
        self._http = httpx.AsyncClient()
        self._counts = collections.Counter[str]()
        self._lags: list[WorkerLag] = []

    def __repr__(self) -> str:
        return (f"ElasticWorkers({self.role}, providers={sorted(self.providers)}, "
                f"workers={len(self._live())}/{self.scaling.max_workers})")

    @property
    def tags(self) -> dict[str, str]:
        return {TAG_FLEET: self.fleet, TAG_POOL: self.role, TAG_OWNER: self.owner}

    # ---- public ---------------------------------------------------------------------
    async def start(self) -> ElasticWorkers:
        if self._tasks:
            return self
        self._tasks = [asyncio.ensure_future(self._control()), asyncio.ensure_future(self._dispatch())]
        self._wake.set()
        return self

    async def __aenter__(self) -> ElasticWorkers:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def complete(self, prompt: str, params: SamplingParams | None = None, *,
                       timeout_s: float | None = None) -> Completion:
        """Queue ``prompt`` for the role and return its answer, from whichever worker;
        re-dispatched (at most ``max_redispatch`` times) when its worker is lost or leaves."""
        if self._closed:
            raise PoolClosedError(f"elastic role {self.role} is closed")
        if not isinstance(prompt, str):
            raise SpecError("prompt", f"must be a string, got {type(prompt).__name__}")
        job = _Job(prompt, params or SamplingParams(), timeout_s, asyncio.get_running_loop().create_future())
        self._queue.append(job)
        self._work.set()
        self._wake.set()
        try:
            return await asyncio.shield(job.future)
        except asyncio.CancelledError:
            if not job.future.done():
                job.future.cancel()
            if job.task is not None:
                job.task.cancel()
            raise

    def backlog(self) -> int:
        """Requests waiting plus requests in flight: what the loop scales on."""
        return sum(1 for j in self._queue if not j.future.done()) + sum(w.assigned for w in self.workers.values())

    def stats(self) -> ElasticStats:
        live = self._live()
        return ElasticStats(
            waiting=sum(1 for j in self._queue if not j.future.done()),
            in_flight=sum(w.assigned for w in self.workers.values()),
            ready=sum(1 for w in live if w.state is WorkerState.READY),
            starting=sum(1 for w in live if w.state is WorkerState.STARTING),
            rented=self._counts["rented"], released=self._counts["released"], lost=self._counts["lost"],
            answered=self._counts["answered"], redispatched=self._counts["redispatched"], lags=tuple(self._lags))

    async def candidates(self) -> list[Candidate]:
        """The offers of every provider, priced and ranked by U for one worker (best first),
        the ones held or avoided left out.  :class:`NoFeasibleOffer` names the gates when
        none fits (VRAM, say)."""
        names = list(self.providers)
        found = await asyncio.gather(*(self.providers[n].offers(self.spec) for n in names))
        priced, excluded = priced_offers(
            dict(zip(names, found)), free={n: p.capabilities.free for n, p in self.providers.items()},
            spot_capable={n: p.capabilities.spot for n, p in self.providers.items()}, book=self.book,
            spot=_SPOT[self.scaling.market], space=ANYWHERE)
        for line in excluded:
            log.info("elastic %s: excluded %s", self.role, line)
        held = {w.offer_id for w in self._live() if w.offer_id} | self.avoided
        priced = [o for o in priced if o.offer_id is None or o.offer_id not in held]
        demand = Demand(count=1, cpus=self.spec.cpus, memory_gb=self.spec.memory_gb, gpus=self.spec.gpus,
                        gpu_name=self.spec.gpu_name, model=self.model, arch=self.spec.arch,
                        market=self.scaling.market, resident=self.resident, max_per_instance=1, gpu_hosts=True)
        return rank_demand(priced, demand, self.weights)

    async def aclose(self, timeout_s: float | None = None) -> None:
        """Stop the loop, fail what waits, drain and release every worker, and terminate
        anything left carrying this role's tags."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(PoolClosedError(f"elastic role {self.role} closed before it answered"))
        for w in list(self.workers.values()):
            if w.task is not None and w.state is WorkerState.STARTING:
                w.task.cancel()
        await asyncio.gather(*(w.task for w in self.workers.values() if w.task is not None), return_exceptions=True)
        await asyncio.gather(*(self._release(w, "closed", timeout_s) for w in self._live()), return_exceptions=True)
        await asyncio.gather(*self._side, return_exceptions=True)
        for name, prov in self.providers.items():
            try:
                left = [i.id for i in await prov.list_tagged(self.tags)
                        if i.state is not ProviderState.TERMINATED]
                if left:
                    log.warning("elastic %s: terminating %d instance(s) left on %s: %s", self.role, len(left),
                                name, left)
                    await self.provisioner.call(prov, "global", "terminate", lambda p=prov, ids=left: p.terminate(ids))
            except FlowMeshError as exc:
                log.warning("elastic %s: could not sweep %s: %s", self.role, name, exc)
        await self._http.aclose()

    # ---- events -----------------------------------------------------------------------
    def _emit(self, kind: EventKind, w: ElasticWorker | None = None, detail: object = "",
              task_id: str | None = None) -> None:
        text = detail if isinstance(detail, str) else json.dumps(detail, sort_keys=True)
        self.bus.publish(Event(kind, self.fleet, pool=self.role,
                               instance_id=w.instance.id if w is not None and w.instance else None,
                               task_name=w.name if w is not None else None, task_id=task_id, detail=text))

    # ---- the control loop ---------------------------------------------------------------
    def _live(self) -> list[ElasticWorker]:
        return [w for w in self.workers.values() if w.state in (WorkerState.STARTING, WorkerState.READY)]

    async def _control(self) -> None:
        while not self._closed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.scaling.interval_s)
            self._wake.clear()
            try:
                now = clock.monotonic()
                if now - self._last_reconcile >= self.scaling.interval_s:
                    self._last_reconcile = now
                    await self._reconcile()
                await self._scale()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop must outlive one bad tick; said in the log
                log.exception("elastic %s: control tick failed", self.role)

    async def _reconcile(self) -> None:
        """Ask the providers about the workers' instances; stopped or gone ones are lost."""
        by_provider: dict[str, list[ElasticWorker]] = collections.defaultdict(list)
        for w in self._live():
            if w.instance is not None:
                by_provider[w.instance.provider].append(w)
        for name, ws in by_provider.items():
            prov = self.providers[name]
            ids = [w.instance.id for w in ws if w.instance is not None]
            seen = {i.id: i for i in await self.provisioner.call(prov, "global", "describe",
                                                                 lambda p=prov, i=ids: p.describe(i))}
            for w in ws:
                assert w.instance is not None
                inst = seen.get(w.instance.id)
                if inst is None or inst.state in (ProviderState.STOPPED, ProviderState.STOPPING,
                                                  ProviderState.TERMINATED):
                    state = inst.state.value if inst is not None else "gone"
                    why = "outbid" if w.candidate.offer.spot and inst is not None else f"lost ({state})"
                    self._lose(w, why)

    def _lose(self, w: ElasticWorker, why: str) -> None:
        """Outbid or lost: fail the worker, hand its requests to others, release it, replace it."""
        if w.state not in (WorkerState.STARTING, WorkerState.READY, WorkerState.DRAINING):
            return
        held, was = w.assigned, w.state
        w.lost_reason = why
        w.lifecycle.to(WorkerState.FAILED)
        self._counts["lost"] += 1
        if w.offer_id:
            self.avoided.add(w.offer_id)
        log.warning("elastic %s: worker %s on %s %s; re-dispatching %d request(s)", self.role, w.name,
                    w.instance.id if w.instance else "?", why, held)
        self._emit(EventKind.WORKER_OUTBID, w, {"reason": why, "offer": w.candidate.offer.key,
                                                "offer_id": w.offer_id, "redispatched": held})
        if was is WorkerState.STARTING and w.task is not None and not w.task.done():
            w.task.cancel()    # stop joining it (a draining worker's release goes on)
        if w.endpoint is not None:   # its calls fail with PoolClosedError and go back on the queue
            self._side_task(w.endpoint.aclose())
        self._replace.append(w.name)
        self._side_task(self._dispose(w, why))
        self._wake.set()

    async def _scale(self) -> None:
        if self._closed:
            return
        live = self._live()
        backlog = self.backlog()
        desired = self.scaling.desired(backlog)
        now = clock.monotonic()
        replacing = bool(self._replace)
        cooled = now - self._last_scale >= self.scaling.cooldown_s
        if len(live) < desired and (cooled or replacing):
            count = desired - len(live)
            replaces = list(self._replace)
            self._replace.clear()
            try:
                cands = await self.candidates()
            except NoFeasibleOffer as exc:
                log.warning("elastic %s: no offer fits: %s", self.role, exc)
                return
            action = "replace" if replaces else "up"
            reason = (f"replace {', '.join(replaces)}" if replaces
                      else f"backlog {backlog} over {len(live)} worker(s) at {self.scaling.target_queue_per_worker:g} each")
            decision = ScalingDecision(action, count, backlog, len(live), desired, reason, tuple(cands))
            self._emit(EventKind.WORKERS_SCALED, detail=decision.to_json())
            self._last_scale = now
            for _ in range(count):
                if not await self._rent(cands, replaces.pop(0) if replaces else None):
                    break
            return
        if replacing:
            self._replace.clear()   # not needed any more: the backlog went down meanwhile
        if len(live) > desired and cooled:
            idle = sorted((w for w in live if w.state is WorkerState.READY and w.assigned == 0
                           and now - w.idle_since >= self.scaling.scale_down_idle_s and not self._queue),
                          key=lambda w: w.candidate.score.utility)
            going = idle[:len(live) - desired]
            if going:
                decision = ScalingDecision("down", len(going), backlog, len(live), desired,
                                           f"{len(going)} worker(s) idle for {self.scaling.scale_down_idle_s:g} s "
                                           f"or more: {', '.join(w.name for w in going)}")
                self._emit(EventKind.WORKERS_SCALED, detail=decision.to_json())
                self._last_scale = now
                for w in going:
                    w.task = asyncio.ensure_future(self._release(w, "idle"))

    async def _rent(self, cands: Sequence[Candidate], replaces: str | None) -> bool:
        """Rent one worker down the ranked offers (failover), then join it in the background."""
        held = {w.offer_id for w in self._live() if w.offer_id} | self.avoided
        usable = [c for c in cands if c.offer.offer_id is None or c.offer.offer_id not in held]
        if not usable:
            log.warning("elastic %s: no offer left to rent (%d ranked, all held or avoided)", self.role, len(cands))
            return False
        name = f"{self.role}-{uuid.uuid4().hex[:8]}"
        w = ElasticWorker(name, usable[0], worker_lifecycle(name), clock.monotonic(), replaces=replaces)
        self.workers[name] = w
        try:
            out = await self.provisioner.launch(self.providers, [c.offer for c in usable], self.spec, 1, self.tags,
                                                request_prefix=f"{self.fleet}-{self.role}"[:40])
        except FlowMeshError as exc:
            w.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, w, f"rent failed: {exc}"[:500])
            log.warning("elastic %s: could not rent a worker: %s", self.role, exc)
            return False
        w.candidate = next((c for c in usable if c.offer == out.offer), usable[0])
        (w.instance,) = out.instances[:1]
        rent_s = clock.monotonic() - w.requested_at
        self._counts["rented"] += 1
        self._emit(EventKind.WORKER_RENTED, w, {
            "offer": out.offer.key, "offer_id": out.offer.offer_id, "instance": w.instance.id,
            "spot": out.offer.spot, "price_per_hour": out.offer.price_per_hour, **w.candidate.terms,
            "failovers": [f.offer.key + ": " + f.reason for f in out.failovers], "replaces": replaces,
            "rent_s": round(rent_s, 3)})
        self._emit(EventKind.WORKER_STARTING, w, f"instance={w.instance.id} offer={out.offer.key}")
        w.task = asyncio.ensure_future(self._join(w, rent_s))
        return True

    async def _join(self, w: ElasticWorker, rent_s: float) -> None:
        assert w.instance is not None
        inst = w.instance
        prov = self.providers[inst.provider]
        deadline = w.requested_at + self.scaling.ready_timeout_s
        try:
            runner = prov.runner(inst)
            await runner.wait_reachable(max(1.0, deadline - clock.monotonic()))
            booted = clock.monotonic()
            base = self.engine.base_url(inst, runner)
            res = await runner.run(["sh", "-c", self.engine.shell(inst, runner, w.name)], timeout_s=60)
            if not res.ok or not res.stdout.strip().isdigit():
                raise WorkerStartError(f"worker {w.name}: the engine did not start: {res.describe()}")
            w.pid = int(res.stdout.strip())

            async def dead() -> str | None:
                # the shell's kill: an instance that is a container may have no kill binary (a pod's
                # exec runs argv as it is, with no shell, where SSH runs it through the login shell)
                r = await runner.run(["sh", "-c", f"kill -0 {w.pid}"], timeout_s=30)
                if r.ok:
                    return None
                tail = await runner.run(["tail", "-n", "15", self.engine.log_path.format(name=w.name)], timeout_s=30)
                return f"engine pid {w.pid} exited: {tail.stdout.decode(errors='replace')[-800:]}"

            await wait_until_healthy(self._http, base, self.engine.model,
                                     timeout_s=max(1.0, deadline - clock.monotonic()), alive=dead,
                                     what=f"elastic worker {w.name}")
        except asyncio.CancelledError:
            raise
        except FlowMeshError as exc:
            if w.state is WorkerState.STARTING:
                w.lifecycle.to(WorkerState.FAILED)
                self._emit(EventKind.WORKER_FAILED, w, str(exc)[:500])
                log.warning("elastic %s: worker %s did not join: %s", self.role, w.name, exc)
                if w.offer_id:
                    self.avoided.add(w.offer_id)
                self._side_task(self._dispose(w, "did not join"))
                self._wake.set()
            return
        if w.state is not WorkerState.STARTING:   # lost while it loaded
            return
        now = clock.monotonic()
        w.lag = WorkerLag(rent_s=round(rent_s, 4), boot_s=round(booted - w.requested_at - rent_s, 4),
                          load_s=round(now - booted, 4), total_s=round(now - w.requested_at, 4))
        self._lags.append(w.lag)
        w.endpoint = InferenceEndpoint(base, self.engine.model, worker=w.name, limits=self.limits)
        w.idle_since = now
        w.lifecycle.to(WorkerState.READY)
        self._emit(EventKind.WORKER_READY, w, {"url": base, "model": self.engine.model, "offer": w.candidate.offer.key,
                                               "lag_s": w.lag.total_s, "rent_s": w.lag.rent_s,
                                               "boot_s": w.lag.boot_s, "load_s": w.lag.load_s})
        log.info("elastic %s: worker %s ready at %s, %.2f s after it was rented", self.role, w.name, base,
                 w.lag.total_s)
        self._work.set()

    async def _release(self, w: ElasticWorker, reason: str, timeout_s: float | None = None) -> None:
        """Drain (no new requests; the ones it holds finish), then release the instance."""
        report = DrainReport(0, 0, 0.0)
        if w.state is WorkerState.READY:
            w.lifecycle.to(WorkerState.DRAINING)
            self._emit(EventKind.WORKER_DRAINING, w, reason)
            assert w.endpoint is not None
            report = await w.endpoint.drain(self.scaling.drain_timeout_s if timeout_s is None else timeout_s)
            await w.endpoint.aclose()
        elif w.state is WorkerState.STARTING:
            w.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, w, f"released while starting ({reason})")
        elif w.state is not WorkerState.DRAINING:
            return
        await self._dispose(w, reason)
        if w.state is WorkerState.DRAINING:
            w.lifecycle.to(WorkerState.STOPPED)
        self._counts["released"] += 1
        self._emit(EventKind.WORKER_RELEASED, w, {"reason": reason, "completed": report.completed,
                                                  "abandoned": report.abandoned,
                                                  "drained_s": round(report.waited_s, 4),
                                                  "lifetime_s": round(clock.monotonic() - w.requested_at, 4)})
        self._wake.set()

    async def _dispose(self, w: ElasticWorker, reason: str) -> None:
        """Stop the engine (best effort: an outbid instance may not answer) and terminate."""
        if w.instance is None:
            return
        prov = self.providers[w.instance.provider]
        if w.pid is not None:
            try:
                await prov.runner(w.instance).run(["sh", "-c", f"kill {w.pid}"], timeout_s=10)
            except FlowMeshError as exc:
                log.info("elastic %s: could not stop the engine of %s (%s): %s", self.role, w.name, reason, exc)
        inst_id = w.instance.id
        try:
            await self.provisioner.call(prov, "global", "terminate", lambda: prov.terminate([inst_id]))
        except FlowMeshError as exc:   # aclose sweeps by tag; flowmesh gc finds it too
            log.warning("elastic %s: terminating %s failed: %s", self.role, inst_id, exc)

    def _side_task(self, coro: object) -> None:
        t = asyncio.ensure_future(coro)
        self._side.add(t)
        t.add_done_callback(self._side.discard)

    # ---- dispatch ------------------------------------------------------------------------
    def _pick(self) -> ElasticWorker | None:
        ready = [w for w in self.workers.values() if w.state is WorkerState.READY and w.endpoint is not None
                 and w.assigned < self.scaling.worker_concurrency]
        return min(ready, key=lambda w: (w.assigned, -w.candidate.score.utility)) if ready else None

    async def _dispatch(self) -> None:
        while True:
            await self._work.wait()
            self._work.clear()
            while self._queue:
                if self._queue[0].future.done():
                    self._queue.popleft()
                    continue
                w = self._pick()
                if w is None:
                    break
                job = self._queue.popleft()
                w.assigned += 1
                job.dispatches += 1
                job.task = asyncio.ensure_future(self._run(job, w))

    async def _run(self, job: _Job, w: ElasticWorker) -> None:
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
            self._queue.appendleft(job)
            self._emit(EventKind.TASK_REDISPATCHED, w, {"from": w.name, "why": type(exc).__name__,
                                                        "dispatches": job.dispatches}, task_id=job.id)
            self._wake.set()
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


__all__ = ["ElasticStats", "ElasticWorker", "ElasticWorkers", "ScalingDecision", "ScalingPolicy", "ServeCommand",
           "WorkerLag"]
