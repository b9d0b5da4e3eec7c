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
   failing over down that order (:meth:`~flowmesh_sdk.provisioning.Provisioner.fill`, the walk
   pools use; terminated until confirmed by :meth:`~flowmesh_sdk.provisioning.Provisioner.terminate`).  Above
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
import functools
import json
import logging
import math
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import httpx

from .. import clock
from ..bidder.demand import ModelSpec
from ..bidder.gates import NoFeasibleOffer
from ..bidder.policy import PRESETS, Policy
from ..control.backend import ControlBackend, InProcessBackend
from ..control.events import Event, EventBus, EventKind
from ..control.spend import SpendLedger
from ..errors import FlowMeshError, PoolClosedError, SpecError
from ..placement.ranking import Candidate, PriceBook
from ..provider import TAG_FLEET, TAG_OWNER, TAG_POOL, Instance, Provider, ProviderState
from ..pools.terminating import ReconcileResult
from ..provisioning import TERMINATE_ATTEMPTS, Provisioner, RetryPolicy
from ..specs import InstanceSpec, Offer
from .endpoint import Completion, DrainReport, InferenceEndpoint
from .specs import ClientLimits, SamplingParams
from .elastic_engine import start_engine
from .elastic_offers import ANYWHERE, check_role, rank_for_role  # noqa: F401 (ANYWHERE: its old home)
from .elastic_queue import RequestQueue
from .elastic_records import (ElasticStats, ElasticWorker, ScalingDecision, ScalingPolicy, ServeCommand,
                              WorkerLag)
from .state import WorkerState, worker_lifecycle

log = logging.getLogger("flowmesh.workers.elastic")



class ElasticWorkers:
    """The control loop of one inference role (module docstring).

    ``providers``: one :class:`Provider` or a mapping name -> provider (the search space);
    ``spec``: the instance to ask offers for (its ``gpus`` per worker); ``model``: the
    :class:`ModelSpec` the bidder checks VRAM and throughput against; ``engine``: how the
    engine starts (:class:`ServeCommand`); ``scaling``: a :class:`ScalingPolicy`;
    ``weights``: the bidder's :class:`Policy` (w_t, w_c, w_l); ``resident``: where the
    weights are cached (``provider``, ``provider/region`` or ``provider/region/type``:
    G_loc = 1 there); ``book``: catalog prices for offers that carry none (marketplace
    quotes are kept); ``bus``: where events go.  Made by :meth:`Fleet.elastic
    <flowmesh_sdk.fleet.Fleet.elastic>`, a role shares the fleet's bus, ``provisioner`` (its
    rate limits and the providers skipped this run), spend ``ledger`` (each worker is
    charged under the role's name) and budgets (``budget_per_hour``, ``budget_total``: a
    rental the fleet cannot afford is refused like a pool's launch)."""

    def __init__(self, providers: Provider | Mapping[str, Provider], spec: InstanceSpec, model: ModelSpec,
                 engine: ServeCommand, *, scaling: ScalingPolicy | None = None, weights: Policy | None = None,
                 resident: Sequence[str] = (), role: str = "inference", fleet: str = "elastic",
                 owner: str = "flowmesh", bus: EventBus | None = None, control: ControlBackend | None = None,
                 retry: RetryPolicy | None = None, limits: ClientLimits | None = None,
                 book: PriceBook | None = None, provisioner: Provisioner | None = None,
                 ledger: SpendLedger | None = None, budget_per_hour: float | None = None,
                 budget_total: float | None = None) -> None:
        self.providers = check_role(providers, spec, model, engine)
        self.spec, self.model, self.engine = spec, model, engine
        self.scaling = scaling or ScalingPolicy()
        if not isinstance(self.scaling, ScalingPolicy):
            raise SpecError("elastic.scaling", "must be a ScalingPolicy")
        self.weights = weights or PRESETS["balanced"]
        self.resident = tuple(resident)
        self.role, self.fleet, self.owner = role, fleet, owner
        self.bus = bus or EventBus()
        self.provisioner = provisioner or Provisioner(control or InProcessBackend(),
                                                      retry or RetryPolicy(attempts=5, backoff_s=0.2))
        self.ledger = ledger or SpendLedger()
        self.budget_per_hour, self.budget_total = budget_per_hour, budget_total
        self.limits = limits or ClientLimits()
        self.book = book or PriceBook(())
        self.workers: dict[str, ElasticWorker] = {}
        self.avoided: set[str] = set()           # offer ids that outbid or failed us
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()
        self._closed = False
        self._last_scale = -math.inf
        self._last_reconcile = -math.inf
        self._replace: list[str] = []
        self._http = httpx.AsyncClient()
        self._counts = collections.Counter[str]()
        self._lags: list[WorkerLag] = []
        self._requests = RequestQueue(lambda: self.workers.values(), self.scaling, self._counts, lose=self._lose,
                                      emit=self._emit, wake=self._wake.set)

    def __repr__(self) -> str:
        return (f"ElasticWorkers({self.role}, providers={sorted(self.providers)}, "
                f"workers={len(self._live())}/{self.scaling.max_workers})")

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tags(self) -> dict[str, str]:
        return {TAG_FLEET: self.fleet, TAG_POOL: self.role, TAG_OWNER: self.owner}

    # ---- public ---------------------------------------------------------------------
    async def start(self) -> ElasticWorkers:
        if self._tasks:
            return self
        self._tasks = [asyncio.ensure_future(self._control()), asyncio.ensure_future(self._requests.dispatch())]
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
        return await self._requests.put(prompt, params or SamplingParams(), timeout_s)

    def backlog(self) -> int:
        """Requests waiting plus requests in flight: what the loop scales on."""
        return self._requests.waiting() + sum(w.assigned for w in self.workers.values())

    def stats(self) -> ElasticStats:
        live = self._live()
        return ElasticStats(
            waiting=self._requests.waiting(),
            in_flight=sum(w.assigned for w in self.workers.values()),
            ready=sum(1 for w in live if w.state is WorkerState.READY),
            starting=sum(1 for w in live if w.state is WorkerState.STARTING),
            rented=self._counts["rented"], released=self._counts["released"], lost=self._counts["lost"],
            answered=self._counts["answered"], redispatched=self._counts["redispatched"], lags=tuple(self._lags))

    async def candidates(self) -> list[Candidate]:
        """The offers of every provider, priced and ranked by U for one worker (best first),
        the ones held or avoided left out.  :class:`NoFeasibleOffer` names the gates when
        none fits (VRAM, say)."""
        held = {w.offer_id for w in self._live() if w.offer_id} | self.avoided
        return await rank_for_role(self.providers, self.spec, self.model, self.scaling, self.weights,
                                   resident=self.resident, book=self.book, held=held, role=self.role)

    async def aclose(self, timeout_s: float | None = None) -> None:
        """Stop the loop, fail what waits, drain and release every worker, and terminate
        anything left carrying this role's tags."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._requests.fail_all(lambda: PoolClosedError(f"elastic role {self.role} closed before it answered"))
        for w in list(self.workers.values()):
            if w.task is not None and w.state is WorkerState.STARTING:
                w.task.cancel()
        await asyncio.gather(*(w.task for w in self.workers.values() if w.task is not None), return_exceptions=True)
        await asyncio.gather(*(self._release(w, "closed", timeout_s) for w in self._live()), return_exceptions=True)
        await asyncio.gather(*self._side, return_exceptions=True)
        for name, prov in self.providers.items():
            try:
                by_region: dict[str, list[str]] = collections.defaultdict(list)
                for i in await prov.list_tagged(self.tags):
                    if i.state is not ProviderState.TERMINATED:
                        by_region[i.region].append(i.id)
                for region, left in by_region.items():
                    log.warning("elastic %s: terminating %d instance(s) left on %s/%s: %s", self.role, len(left),
                                name, region, left)
                    still = await self.provisioner.terminate(prov, region, left, label=f"elastic {self.role}")
                    for gone in set(left) - still:
                        self.ledger.end(gone)
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
                    await self.reconcile()
                await self._scale()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop must outlive one bad tick; said in the log
                log.exception("elastic %s: control tick failed", self.role)

    async def reconcile(self) -> ReconcileResult:
        """Ask the providers about the workers' instances; stopped or gone ones are lost (the
        loop does this every tick, and the fleet's reconciler with its pools)."""
        by_place: dict[tuple[str, str], list[ElasticWorker]] = collections.defaultdict(list)
        for w in self._live():
            if w.instance is not None:
                by_place[(w.instance.provider, w.instance.region)].append(w)
        gone: list[str] = []
        stopped: list[str] = []
        for (name, region), ws in by_place.items():
            prov = self.providers[name]
            ids = [w.instance.id for w in ws if w.instance is not None]
            seen = {i.id: i for i in await self.provisioner.call(prov, region, "describe",
                                                                 functools.partial(prov.describe, ids))}
            for w in ws:
                assert w.instance is not None
                inst = seen.get(w.instance.id)
                if inst is None or inst.state in (ProviderState.STOPPED, ProviderState.STOPPING,
                                                  ProviderState.TERMINATED):
                    state = inst.state.value if inst is not None else "gone"
                    why = "outbid" if w.candidate.offer.spot and inst is not None else f"lost ({state})"
                    (stopped if inst is not None and inst.state is not ProviderState.TERMINATED
                     else gone).append(w.instance.id)
                    self._lose(w, why)
        return ReconcileResult(tuple(gone), tuple(stopped))

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
                           and now - w.idle_since >= self.scaling.scale_down_idle_s and not self._requests.waiting()),
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
        prefix = f"{self.fleet}-{self.role}"[:40]
        got: list[tuple[Candidate, Instance]] = []
        by_offer = {id(c.offer): c for c in usable}   # by identity: the offers handed to fill

        async def take(offer: Offer, n: int) -> int:
            # one worker: within the fleet's budgets, charged to its ledger under the role's name
            price = offer.price_per_hour or 0.0
            self.ledger.admit(1, price, offer.provider, pool=self.fleet, scope="fleet",
                              budget_per_hour=self.budget_per_hour, budget_total=self.budget_total)
            launched = await self.provisioner.attempt(self.providers, offer, self.spec, 1, self.tags,
                                                      request_prefix=prefix)
            for inst in launched:
                self.ledger.start(inst.id, pool=self.role, provider=offer.provider, price_per_hour=price)
            got.extend((by_offer[id(offer)], inst) for inst in launched)
            return len(launched)

        try:
            filled = await self.provisioner.fill([c.offer for c in usable], 1, take, label=prefix,
                                                 what=f"one {self.role} worker ({self.spec.gpus} GPU(s))")
        except FlowMeshError as exc:
            w.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, w, f"rent failed: {exc}"[:500])
            log.warning("elastic %s: could not rent a worker: %s", self.role, exc)
            return False
        w.candidate, w.instance = got[0]
        offer = w.candidate.offer
        rent_s = clock.monotonic() - w.requested_at
        self._counts["rented"] += 1
        self._emit(EventKind.WORKER_RENTED, w, {
            "offer": offer.key, "offer_id": offer.offer_id, "instance": w.instance.id,
            "spot": offer.spot, "price_per_hour": offer.price_per_hour, **w.candidate.terms,
            "failovers": [f.offer.key + ": " + f.reason for f in filled.failovers], "replaces": replaces,
            "rent_s": round(rent_s, 3)})
        # the instance as the fleet's store and `flowmesh status` keep it (and its charge)
        self._emit(EventKind.INSTANCE_REQUESTED, w, {
            "provider": offer.provider, "region": w.instance.region, "zone": w.instance.zone,
            "type": w.instance.instance_type, "spot": offer.spot, "price_per_hour": offer.price_per_hour or 0.0})
        self._emit(EventKind.WORKER_STARTING, w, f"instance={w.instance.id} offer={offer.key}")
        w.task = asyncio.ensure_future(self._join(w, rent_s))
        return True

    async def _join(self, w: ElasticWorker, rent_s: float) -> None:
        assert w.instance is not None
        inst = w.instance
        prov = self.providers[inst.provider]
        deadline = w.requested_at + self.scaling.ready_timeout_s
        try:
            base, booted = await start_engine(self.engine, prov.runner(inst), w, self._http, deadline)
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
        self._emit(EventKind.INSTANCE_READY, w, f"worker {w.name} serves {self.engine.model}")
        self._emit(EventKind.WORKER_READY, w, {"url": base, "model": self.engine.model, "offer": w.candidate.offer.key,
                                               "lag_s": w.lag.total_s, "rent_s": w.lag.rent_s,
                                               "boot_s": w.lag.boot_s, "load_s": w.lag.load_s})
        log.info("elastic %s: worker %s ready at %s, %.2f s after it was rented", self.role, w.name, base,
                 w.lag.total_s)
        self._requests.notify()

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
        inst = w.instance
        try:
            still = await self.provisioner.terminate(prov, inst.region, [inst.id], label=f"elastic {self.role}")
        except FlowMeshError as exc:   # aclose sweeps by tag; flowmesh gc finds it too
            log.warning("elastic %s: terminating %s failed: %s", self.role, inst.id, exc)
            return
        if still:   # TERMINATION_FAILED: still accruing; aclose's sweep by tag and flowmesh gc retry it
            self._emit(EventKind.INSTANCE_TERMINATION_FAILED, w,
                       f"still listed by {prov.name} after {TERMINATE_ATTEMPTS} terminate calls ({reason})")
        else:
            self.ledger.end(inst.id)
            self._emit(EventKind.INSTANCE_TERMINATED, w, f"released ({reason})")

    def _side_task(self, coro: Coroutine[Any, Any, Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._side.add(t)
        t.add_done_callback(self._side.discard)


__all__ = ["ElasticStats", "ElasticWorker", "ElasticWorkers", "ScalingDecision", "ScalingPolicy", "ServeCommand",
           "WorkerLag"]
