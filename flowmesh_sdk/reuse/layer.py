"""The reuse layer itself: :class:`ResultReuse` answers a sandbox task (:meth:`~ResultReuse.run`)
or an in-process operator (:meth:`~ResultReuse.call`) from the store, from the same work in
flight, or by running it and publishing the result once (:mod:`flowmesh_sdk.reuse`)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .. import clock
from ..cas.base import ContentStore
from ..control.events import EventBus
from ..errors import FlowMeshError, SpecError
from ..identity import call_identity, check_digest, task_identity
from ..images import ImageResolver
from ..registry.reference import ImageRef
from ..specs import PhaseTimings, Provenance, ReuseKind, Task, TaskResult
from .flight import SingleFlight
from .lineage import Ledger
from .model import CallResult, Fresh, LineageEntry, Request, ReuseCounts, ReusePolicy, TaskRunner
from .records import exec_result, fresh_from_task
from .store import ResultIndex

__all__ = ["ResultReuse"]

log = logging.getLogger("flowmesh.reuse")


class ResultReuse:
    """The reuse layer over one content-addressable store.  Share one per process (the
    fleet's ``fleet.results``): single-flight works among the requests it sees.

    The in-memory lineage keeps the last ``lineage_limit`` requests (the metadata store,
    fed by the ``REUSE_*`` events, keeps them all)."""

    def __init__(self, cas: ContentStore, *, resolver: ImageResolver | None = None,
                 bus: EventBus | None = None, fleet: str = "default",
                 policy: ReusePolicy | None = None, host: str | None = None,
                 lineage_limit: int = 100_000) -> None:
        if isinstance(lineage_limit, bool) or not isinstance(lineage_limit, int) or lineage_limit < 1:
            raise SpecError("reuse.lineage_limit", f"must be an integer >= 1, got {lineage_limit!r}")
        if not isinstance(cas, ContentStore):
            raise SpecError("reuse.cas", f"must be a ContentStore (e.g. LocalDirStore), got {type(cas).__name__}")
        if policy is not None and not isinstance(policy, ReusePolicy):
            raise SpecError("reuse.policy", f"must be a ReusePolicy, got {type(policy).__name__}")
        self.resolver = resolver
        self.policy = policy or ReusePolicy()
        self.ledger = Ledger(bus=bus, fleet=fleet, lineage_limit=lineage_limit)
        self.index = ResultIndex(cas, self.ledger, host=host or socket.gethostname())
        self.flight = SingleFlight(self.index, self.ledger)

    def __repr__(self) -> str:
        return f"ResultReuse({self.cas!r}, in_flight={self.flight.in_flight()})"

    # ---- its parts' state, as attributes of the layer ------------------------------------
    @property
    def cas(self) -> ContentStore:
        return self.index.cas

    @cas.setter
    def cas(self, value: ContentStore) -> None:
        self.index.cas = value

    @property
    def host(self) -> str:
        return self.index.host

    @host.setter
    def host(self, value: str) -> None:
        self.index.host = value

    @property
    def bus(self) -> EventBus | None:
        return self.ledger.bus

    @bus.setter
    def bus(self, value: EventBus | None) -> None:
        self.ledger.bus = value

    @property
    def fleet(self) -> str:
        return self.ledger.fleet

    @fleet.setter
    def fleet(self, value: str) -> None:
        self.ledger.fleet = value

    # ---- visibility ------------------------------------------------------------------
    def counts(self) -> ReuseCounts:
        """What this layer did since it was made (this process)."""
        return self.ledger.counts()

    def lineage(self, *, workflow: str | None = None, tenant: str | None = None) -> list[LineageEntry]:
        """The requests answered so far, oldest first, optionally of one workflow / tenant."""
        return self.ledger.lineage(workflow=workflow, tenant=tenant)

    def in_flight(self) -> int:
        """Distinct works running now (one leader each)."""
        return self.flight.in_flight()

    def waiting(self) -> int:
        """Requests waiting on a work in flight (would-be joins)."""
        return self.flight.waiting()

    async def stored(self, key: str) -> Provenance | None:
        """The provenance of the published result of ``H_task`` ``key``, None when there is
        none (or it was corrupt: then it is dropped, as on any lookup)."""
        return await self.index.stored(key)

    # ---- sandbox tasks -------------------------------------------------------------------
    async def run(self, task: Task, pool: TaskRunner, *, workflow: str | None = None,
                  cache_failures: bool | None = None, request_id: str | None = None) -> TaskResult:
        """Run ``task`` on ``pool`` unless its result is stored or in flight.  Errors come back
        in ``TaskResult.error`` as with ``pool.run_task``; ``reuse`` and ``provenance`` say
        how the answer was obtained.  ``request_id`` (default: a fresh one) names this
        request in the lineage."""
        if not isinstance(task, Task):
            raise SpecError("task", f"must be a Task, got {type(task).__name__}")
        if not callable(getattr(pool, "run_task", None)):
            raise SpecError("pool", f"must be a pool (something with run_task), got {type(pool).__name__}")
        _check_flag("cache_failures", cache_failures)
        _check_request_id(request_id)
        pool_name = str(getattr(pool, "name", "?"))
        request_id = request_id or secrets.token_hex(8)
        if not (task.deterministic or task.seed is not None):
            return await self._bypass(task, pool, request_id, workflow)
        try:
            digest = await self._image_digest(task, pool)
        except FlowMeshError as exc:
            # a missing image, a registry down: the pool reports it the usual way
            log.info("reuse: %s not resolved (%s); running it without reuse", task.sandbox.image, exc)
            return await self._bypass(task, pool, request_id, workflow)
        ident = task_identity(task, digest)
        req = Request(request_id, task.name, task.tenant, workflow, pool_name, ident.h_task, ident.h_exec)
        failures = self.policy.cache_failures if cache_failures is None else cache_failures

        async def execute() -> Fresh:
            tr = await pool.run_task(task)
            return fresh_from_task(tr, digest, failures, task.files)

        outcome, answer, fresh = await self.flight.resolve(req, execute)
        if fresh is not None and (answer is None or fresh.native.task_id == answer.provenance.task_id):
            tr: TaskResult = fresh.native           # the run is the answer (or nothing to share)
            return dataclasses.replace(tr, reuse=outcome,
                                       provenance=answer.provenance if answer else None)
        assert answer is not None
        rec, prov = answer.record, answer.provenance
        result = exec_result(rec)
        if fresh is not None:                       # ran, but lost the publish race: winner's bytes
            tr = fresh.native
            return dataclasses.replace(tr, result=result, error=None, reuse=outcome, provenance=prov)
        return TaskResult(task_id=request_id, name=task.name, pool=pool_name, result=result,
                          phases=PhaseTimings(), error=None, instance_id=None,
                          image_digest=str(rec.get("image_digest") or digest), reuse=outcome,
                          provenance=prov, attempts=0, run=self.bus.run if self.bus else "")

    async def _bypass(self, task: Task, pool: TaskRunner, request_id: str,
                      workflow: str | None) -> TaskResult:
        tr = await pool.run_task(task)
        self.ledger.bypassed(request_id, task.name, task.tenant, workflow, str(getattr(pool, "name", "?")), tr.task_id)
        return dataclasses.replace(tr, reuse=ReuseKind.BYPASSED)

    async def _image_digest(self, task: Task, pool: TaskRunner) -> str:
        image = task.sandbox.image
        pinned = ImageRef.parse(image).digest
        if pinned and not image.startswith("localhost/"):
            return pinned
        if self.resolver is None:
            raise SpecError("task.sandbox.image", f"{image!r} is not pinned by digest and this reuse "
                                                  "layer has no image resolver to resolve it")
        spec = getattr(pool, "spec", None)
        arch = getattr(getattr(spec, "instance", None), "arch", "x86_64")
        info = await self.resolver.resolve(image, arch=arch)
        return check_digest("image digest", info.digest)

    # ---- in-process operators (inference calls, training steps, reward functions) -------
    async def call(self, name: str, fn: Callable[[Mapping[str, bytes]], bytes | Awaitable[bytes]], *,
                   image_or_model: str, params: Mapping[str, Any] | None = None,
                   inputs: Mapping[str, bytes] | None = None, resource_class: Any = "cpu",
                   kind: str = "call", tenant: str = "default", workflow: str | None = None,
                   deterministic: bool = False, seed: int | None = None,
                   request_id: str | None = None) -> CallResult:
        """Run ``fn(inputs)`` unless the result of the same work is stored or in flight.

        The work is identified by ``image_or_model`` (a digest: model weights in the CAS, an
        image, or :func:`~flowmesh_sdk.identity.label_digest` of a code version), ``kind``,
        ``params`` and ``seed`` plus the digest of each input.  ``fn`` may be sync (run in a
        worker thread) or async, and must return bytes.  ``H_exec`` (the micro-batching key
        of an inference endpoint) leaves out the inputs and the seed."""
        if not isinstance(name, str) or not name:
            raise SpecError("name", f"must be a non-empty string, got {name!r}")
        if not callable(fn):
            raise SpecError("fn", f"must be a function of the inputs returning bytes, got {type(fn).__name__}")
        if params is not None and not isinstance(params, Mapping):
            raise SpecError("params", f"must be a mapping, got {type(params).__name__}")
        if inputs is not None and not isinstance(inputs, Mapping):
            raise SpecError("inputs", f"must be a {{name: bytes}} mapping, got {type(inputs).__name__}")
        for k, v in (inputs or {}).items():
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise SpecError(f"inputs[{k!r}]", f"must be bytes, got {type(v).__name__}")
        if not isinstance(tenant, str) or not tenant:
            raise SpecError("tenant", f"must be a non-empty tenant name, got {tenant!r}")
        if not isinstance(deterministic, bool):
            raise SpecError("deterministic", f"must be true or false, got {deterministic!r}")
        if workflow is not None and not isinstance(workflow, str):
            raise SpecError("workflow", f"must be a string or None, got {workflow!r}")
        _check_request_id(request_id)
        params = dict(params or {})
        inputs = {k: bytes(v) for k, v in (inputs or {}).items()}
        ident = call_identity(kind, image_or_model, params, inputs, resource_class, seed)
        request_id = request_id or secrets.token_hex(8)
        t0 = clock.monotonic()

        async def run_fn() -> CallResult:
            start = clock.monotonic()
            try:
                if inspect.iscoroutinefunction(fn):
                    out: Any = await fn(inputs)
                else:   # a plain function may block: keep it off the event loop
                    out = await asyncio.to_thread(fn, inputs)
                    if inspect.isawaitable(out):
                        out = await out
                if not isinstance(out, (bytes, bytearray)):
                    raise TypeError(f"{name}: fn must return bytes, got {type(out).__name__}")
                return CallResult(request_id, name, bytes(out), None, ReuseKind.EXECUTED, None,
                                  clock.monotonic() - start)
            except Exception as exc:  # noqa: BLE001 - reported in the result, like run_task
                return CallResult(request_id, name, None, f"{type(exc).__name__}: {exc}",
                                  ReuseKind.EXECUTED, None, clock.monotonic() - start)

        if not (deterministic or seed is not None):
            res = await run_fn()
            self.ledger.bypassed(request_id, name, tenant, workflow, "in-process", request_id)
            return dataclasses.replace(res, reuse=ReuseKind.BYPASSED)
        req = Request(request_id, name, tenant, workflow, "in-process", ident.h_task, ident.h_exec)

        async def execute() -> Fresh:
            res = await run_fn()
            ok = res.error is None
            return Fresh(record={"kind": "call", "output": res.output} if ok else None,
                          publish=ok, share=ok, compute_s=res.duration_s, task_id=request_id,
                          pool="in-process", instance_id=None, inputs=inputs, native=res)

        outcome, answer, fresh = await self.flight.resolve(req, execute)
        if fresh is not None and answer is None:
            return dataclasses.replace(fresh.native, reuse=outcome)
        assert answer is not None
        out = answer.record.get("output")
        return CallResult(request_id, name, bytes(out) if isinstance(out, (bytes, bytearray)) else None,
                          None, outcome, answer.provenance,
                          fresh.native.duration_s if fresh is not None else clock.monotonic() - t0)


def _check_flag(field_name: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise SpecError(field_name, f"must be true, false or None, got {value!r}")


def _check_request_id(value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError("request_id", f"must be a non-empty string or None, got {value!r}")
