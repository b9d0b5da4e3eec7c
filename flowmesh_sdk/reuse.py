"""Result reuse: identical work runs once, across pools, tenants, workflows and processes.

:class:`ResultReuse` sits *above* the pools.  Given a :class:`~flowmesh_sdk.specs.Task`
and a pool (anything with ``async run_task(task) -> TaskResult``), it

1. resolves the task's image to its digest (a tag is never hashed) and computes
   ``H_task`` / ``H_exec`` (:mod:`flowmesh_sdk.identity`);
2. looks ``H_task`` up in the content-addressable store: a **hit** returns the stored
   result with the provenance of the run that computed it, and nothing runs;
3. otherwise, if the same ``H_task`` is in flight in this process (any pool, any tenant),
   **joins** it: one execution, each requester's lineage recorded;
4. otherwise **executes** it through the pool and publishes the result once: the result
   record goes into the CAS by content hash, and the index ref ``results/<H_task>`` is
   created with an atomic create-if-absent.  Of two processes publishing the same
   ``H_task`` one wins; the other discards its own copy and returns the winner's, so every
   requester sees the same bytes.

Only reusable work takes part.  A task is reusable when it is ``deterministic`` or pinned
by a ``seed`` (the seed goes into ``H_task``); anything else is **bypassed**: it runs
every time and nothing is stored.

What is stored, and what is shared with requests already waiting (the failure policy):

=============================================  ==========  ==============================
outcome of the run                              published   shared with joined requests
=============================================  ==========  ==============================
exit 0                                          yes         yes
exit 1..127 (a verdict: tests failed)           only with   yes (same work, same moment)
                                                ``cache_failures``
exit >= 128 without timeout (killed by signal,  no          no (each runs its own)
e.g. the OOM killer)
timed out                                       no          no
infra error (image, quota, lost instance,       no          no
pool closed), or the image moved under the tag
=============================================  ==========  ==============================

Every read is verified (objects by their hash, refs by their checksum, the record by the
``H_task`` it names).  A corrupt entry is reported (``REUSE_CORRUPT``), dropped, and the
work is computed again and republished.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import clock
from .cas.base import CasCorruptError, CasError, CasNotFoundError, ContentStore
from .control.events import Event, EventBus, EventKind
from .errors import FlowMeshError, SpecError
from .identity import call_identity, canonical, check_digest, decode, digest_bytes, task_identity
from .images import ImageResolver
from .registry.reference import ImageRef
from .specs import ExecResult, PhaseTimings, Provenance, ReuseKind, Task, TaskResult

__all__ = ["CallResult", "LineageEntry", "ResultReuse", "ReuseCounts", "ReusePolicy", "TaskRunner"]

log = logging.getLogger("flowmesh.reuse")
_RECORD_VERSION = 1


class TaskRunner(Protocol):
    """What the reuse layer needs of a pool."""

    name: str

    async def run_task(self, task: Task) -> TaskResult: ...


@dataclass(frozen=True, slots=True)
class ReusePolicy:
    """``cache_failures``: also publish a deterministic non-zero exit (1..127) -- a test
    run that fails on a patch is a real verdict worth keeping.  Timeouts, kills by signal
    and infra errors are never published, whatever this says."""

    cache_failures: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cache_failures, bool):
            raise SpecError("reuse.cache_failures", f"must be true or false, got {self.cache_failures!r}")


@dataclass(frozen=True, slots=True)
class ReuseCounts:
    """What the reuse layer did since it was made (this process)."""

    hits: int = 0
    joins: int = 0
    executions: int = 0
    bypassed: int = 0
    published: int = 0
    lost_races: int = 0         # executions whose publish lost to another writer
    corrupt: int = 0            # corrupt store entries detected (each recomputed)
    compute_saved_s: float = 0.0

    @property
    def requests(self) -> int:
        return self.hits + self.joins + self.executions + self.bypassed


@dataclass(frozen=True, slots=True)
class LineageEntry:
    """One request as the reuse layer answered it: who asked (tenant, workflow, name) for
    which work (``h_task``), how it was answered, and which result it got."""

    request_id: str
    name: str
    tenant: str
    workflow: str | None
    pool: str
    h_task: str | None              # None for a bypassed request
    outcome: ReuseKind
    result_digest: str | None       # the result record it got (None: nothing to store)
    computed_by: str | None         # task id of the run that computed that result
    saved_s: float                  # compute this request did not spend (hit or join)
    at: float


@dataclass(frozen=True, slots=True)
class CallResult:
    """The result of an in-process operator (an inference call, a training step, a reward
    function) run through :meth:`ResultReuse.call`."""

    request_id: str
    name: str
    output: bytes | None
    error: str | None
    reuse: ReuseKind
    provenance: Provenance | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None and self.output is not None


@dataclass(slots=True)
class _Fresh:
    """What one execution produced, before publishing."""

    record: dict[str, Any] | None   # the result record (None: nothing worth storing)
    publish: bool
    share: bool
    compute_s: float
    task_id: str
    pool: str
    instance_id: str | None
    inputs: Mapping[str, bytes] = field(default_factory=dict)
    native: Any = None              # the TaskResult / CallResult of the run itself


@dataclass(frozen=True, slots=True)
class _Answer:
    record: dict[str, Any]
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class _Request:
    request_id: str
    name: str
    tenant: str
    workflow: str | None
    pool: str
    h_task: str
    h_exec: str


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
        self.cas = cas
        self.resolver = resolver
        self.bus = bus
        self.fleet = fleet
        self.policy = policy or ReusePolicy()
        self.host = host or socket.gethostname()
        self._inflight: dict[str, asyncio.Future[_Answer | None]] = {}
        self._counts: dict[str, float] = dict.fromkeys(
            ("hits", "joins", "executions", "bypassed", "published", "lost_races", "corrupt",
             "compute_saved_s"), 0)
        self._lineage: collections.deque[LineageEntry] = collections.deque(maxlen=lineage_limit)
        self._waiting = 0

    def __repr__(self) -> str:
        return f"ResultReuse({self.cas!r}, in_flight={len(self._inflight)})"

    # ---- visibility ------------------------------------------------------------------
    def counts(self) -> ReuseCounts:
        c = self._counts
        return ReuseCounts(**{k: (float(v) if k == "compute_saved_s" else int(v)) for k, v in c.items()})

    def lineage(self, *, workflow: str | None = None, tenant: str | None = None) -> list[LineageEntry]:
        """The requests answered so far, oldest first, optionally of one workflow / tenant."""
        return [e for e in self._lineage
                if (workflow is None or e.workflow == workflow) and (tenant is None or e.tenant == tenant)]

    def in_flight(self) -> int:
        """Distinct works running now (one leader each)."""
        return len(self._inflight)

    def waiting(self) -> int:
        """Requests waiting on a work in flight (would-be joins)."""
        return self._waiting

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
        request_id = request_id or uuid.uuid4().hex[:16]
        if not (task.deterministic or task.seed is not None):
            return await self._bypass(task, pool, request_id, workflow)
        try:
            digest = await self._image_digest(task, pool)
        except FlowMeshError as exc:
            # a missing image, a registry down: the pool reports it the usual way
            log.info("reuse: %s not resolved (%s); running it without reuse", task.sandbox.image, exc)
            return await self._bypass(task, pool, request_id, workflow)
        ident = task_identity(task, digest)
        req = _Request(request_id, task.name, task.tenant, workflow, pool_name, ident.h_task, ident.h_exec)
        failures = self.policy.cache_failures if cache_failures is None else cache_failures

        async def execute() -> _Fresh:
            tr = await pool.run_task(task)
            return _fresh_from_task(tr, digest, failures, task.files)

        outcome, answer, fresh = await self._resolve(req, execute)
        if fresh is not None and (answer is None or fresh.native.task_id == answer.provenance.task_id):
            tr: TaskResult = fresh.native           # the run is the answer (or nothing to share)
            return dataclasses.replace(tr, reuse=outcome,
                                       provenance=answer.provenance if answer else None)
        assert answer is not None
        rec, prov = answer.record, answer.provenance
        result = _exec_result(rec)
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
        self._count("bypassed")
        self._lineage.append(LineageEntry(request_id, task.name, task.tenant, workflow,
                                          str(getattr(pool, "name", "?")), None, ReuseKind.BYPASSED,
                                          None, tr.task_id, 0.0, time.time()))
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
        request_id = request_id or uuid.uuid4().hex[:16]
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
            self._count("bypassed")
            self._lineage.append(LineageEntry(request_id, name, tenant, workflow, "in-process", None,
                                              ReuseKind.BYPASSED, None, request_id, 0.0, time.time()))
            return dataclasses.replace(res, reuse=ReuseKind.BYPASSED)
        req = _Request(request_id, name, tenant, workflow, "in-process", ident.h_task, ident.h_exec)

        async def execute() -> _Fresh:
            res = await run_fn()
            ok = res.error is None
            return _Fresh(record={"kind": "call", "output": res.output} if ok else None,
                          publish=ok, share=ok, compute_s=res.duration_s, task_id=request_id,
                          pool="in-process", instance_id=None, inputs=inputs, native=res)

        outcome, answer, fresh = await self._resolve(req, execute)
        if fresh is not None and answer is None:
            return dataclasses.replace(fresh.native, reuse=outcome)
        assert answer is not None
        out = answer.record.get("output")
        return CallResult(request_id, name, bytes(out) if isinstance(out, (bytes, bytearray)) else None,
                          None, outcome, answer.provenance,
                          fresh.native.duration_s if fresh is not None else clock.monotonic() - t0)

    # ---- the core: lookup, single-flight, execute, publish --------------------------------
    async def _resolve(self, req: _Request, execute: Callable[[], Awaitable[_Fresh]]
                       ) -> tuple[ReuseKind, _Answer | None, _Fresh | None]:
        joined = await self._join(req, execute)
        if joined is not None:
            return joined
        found = await self._lookup(req.h_task)
        if found is not None:
            return self._answered(req, ReuseKind.HIT, found), found, None
        joined = await self._join(req, execute)   # a leader appeared while we looked
        if joined is not None:
            return joined
        fut: asyncio.Future[_Answer | None] = asyncio.get_running_loop().create_future()
        self._inflight[req.h_task] = fut
        shared: _Answer | None = None
        try:
            # a leader may have published between our lookup and our registration
            found = await self._lookup(req.h_task)
            if found is not None:
                shared = found
                return self._answered(req, ReuseKind.HIT, found), found, None
            fresh, answer = await self._execute(req, execute)
            shared = answer if fresh.share else None
            return ReuseKind.EXECUTED, answer, fresh
        finally:
            if self._inflight.get(req.h_task) is fut:
                del self._inflight[req.h_task]
            if not fut.done():
                fut.set_result(shared)   # None (nothing to share) also when the leader failed

    async def _join(self, req: _Request, execute: Callable[[], Awaitable[_Fresh]]
                    ) -> tuple[ReuseKind, _Answer | None, _Fresh | None] | None:
        fut = self._inflight.get(req.h_task)
        if fut is None:
            return None
        self._waiting += 1
        try:
            shared = await asyncio.shield(fut)
        finally:
            self._waiting -= 1
        if shared is not None:
            return self._answered(req, ReuseKind.JOINED, shared), shared, None
        # the leader's run is not one to share (timed out, infra error, killed, cancelled):
        # every such follower runs its own, at once rather than one after the other
        fresh, answer = await self._execute(req, execute)
        return ReuseKind.EXECUTED, answer, fresh

    async def _lookup(self, key: str) -> _Answer | None:
        name = _index_name(key)
        try:
            body = await self.cas.read_ref(name)
            if body is None:
                return None
            idx = _decode_dict(name, body)
            if idx.get("h_task") != key:
                raise CasCorruptError(name, f"names {idx.get('h_task')!r}, not {key}")
            result = idx.get("result")
            if not isinstance(result, str):
                raise CasCorruptError(name, "names no result object")
            rec = _decode_dict(result, await self.cas.get(result))
            _check_record(result, rec)
            try:
                prov = _provenance(idx, published=True)
            except (KeyError, TypeError, ValueError) as exc:
                raise CasCorruptError(name, f"not a result index: {exc!r} missing or malformed") from exc
            return _Answer(rec, prov)
        except CasNotFoundError as exc:
            await self._corrupt(name, CasCorruptError(name, f"its result object is missing: {exc}"))
        except CasCorruptError as exc:
            await self._corrupt(name, exc)
        return None

    async def _corrupt(self, name: str, exc: CasCorruptError) -> None:
        log.warning("reuse: %s; dropping it and computing again", exc)
        self._count("corrupt")
        self._publish(EventKind.REUSE_CORRUPT, name="", pool="", detail={"ref": name, "error": str(exc)})
        try:
            await self.cas.drop_ref(name)
        except CasError as drop_exc:  # the recompute still runs; the next publish retries
            log.warning("reuse: could not drop %s: %s", name, drop_exc)

    async def _execute(self, req: _Request, execute: Callable[[], Awaitable[_Fresh]]
                       ) -> tuple[_Fresh, _Answer | None]:
        fresh = await execute()
        self._count("executions")
        if fresh.record is None:
            self._record(req, ReuseKind.EXECUTED, None, fresh.task_id, 0.0)
            return fresh, None
        blob = canonical(fresh.record)
        digest = digest_bytes(blob)
        now = time.time()
        index = {"v": _RECORD_VERSION, "h_task": req.h_task, "h_exec": req.h_exec, "result": digest,
                 "task_id": fresh.task_id, "tenant": req.tenant, "workflow": req.workflow,
                 "fleet": self.fleet, "pool": fresh.pool, "instance_id": fresh.instance_id,
                 "host": self.host, "computed_at": now, "compute_s": float(fresh.compute_s),
                 "inputs": {k: digest_bytes(v) for k, v in fresh.inputs.items()}}
        if not fresh.publish:
            answer = _Answer(fresh.record, _provenance(index, published=False))
            self._record(req, ReuseKind.EXECUTED, digest, fresh.task_id, 0.0)
            return fresh, answer
        answer = await self._publish_result(req, fresh, blob, index)
        self._record(req, ReuseKind.EXECUTED, answer.provenance.result_digest,
                     answer.provenance.task_id, 0.0)
        return fresh, answer

    async def _publish_result(self, req: _Request, fresh: _Fresh, blob: bytes,
                              index: dict[str, Any]) -> _Answer:
        """Store the record and its inputs, then create the index ref once.  Losing the
        create to another writer returns the winner's record instead of ours."""
        await asyncio.gather(self.cas.put(blob), *(self.cas.put(v) for v in fresh.inputs.values()))
        name = _index_name(req.h_task)
        for _ in range(2):
            try:
                created, body = await self.cas.create_ref(name, canonical(index))
            except CasCorruptError as exc:      # a corrupt ref in the way: drop it, try again
                await self._corrupt(name, exc)
                continue
            if created:
                self._count("published")
                return _Answer(fresh.record or {}, _provenance(index, published=True))
            self._count("lost_races")
            winner = await self._lookup(req.h_task)
            if winner is not None:
                return winner
        # could not publish (or read back) a sound entry: answer with our own, unpublished
        return _Answer(fresh.record or {}, _provenance(index, published=False))

    # ---- bookkeeping -----------------------------------------------------------------------
    def _answered(self, req: _Request, kind: ReuseKind, ans: _Answer) -> ReuseKind:
        saved = ans.provenance.compute_s
        self._count("hits" if kind is ReuseKind.HIT else "joins")
        self._count("compute_saved_s", saved)
        self._record(req, kind, ans.provenance.result_digest, ans.provenance.task_id, saved)
        return kind

    def _record(self, req: _Request, kind: ReuseKind, result: str | None, computed_by: str | None,
                saved_s: float) -> None:
        self._lineage.append(LineageEntry(req.request_id, req.name, req.tenant, req.workflow, req.pool,
                                          req.h_task, kind, result, computed_by, saved_s, time.time()))
        ev = {ReuseKind.HIT: EventKind.REUSE_HIT, ReuseKind.JOINED: EventKind.REUSE_JOINED,
              ReuseKind.EXECUTED: EventKind.REUSE_EXECUTED}[kind]
        self._publish(ev, name=req.name, pool=req.pool, task_id=req.request_id,
                      detail={"h_task": req.h_task, "tenant": req.tenant, "workflow": req.workflow,
                              "result": result, "computed_by": computed_by, "saved_s": round(saved_s, 6)})

    def _count(self, what: str, n: float = 1) -> None:
        self._counts[what] += n

    def _publish(self, kind: EventKind, *, name: str, pool: str, detail: dict[str, Any],
                 task_id: str | None = None) -> None:
        if self.bus is not None:
            self.bus.publish(Event(kind, fleet=self.fleet, pool=pool, task_id=task_id,
                                   task_name=name or None, detail=json.dumps(detail, sort_keys=True)))

    async def stored(self, key: str) -> Provenance | None:
        """The provenance of the published result of ``H_task`` ``key``, None when there is
        none (or it was corrupt: then it is dropped, as on any lookup)."""
        found = await self._lookup(check_digest("h_task", key))
        return found.provenance if found else None


# ---- records -------------------------------------------------------------------------------

def _check_flag(field_name: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise SpecError(field_name, f"must be true, false or None, got {value!r}")


def _check_request_id(value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise SpecError("request_id", f"must be a non-empty string or None, got {value!r}")


_EXEC_FIELDS = {"exit_code": int, "stdout": str, "stderr": str, "timed_out": bool, "stdout_truncated": bool,
                "stderr_truncated": bool, "stdout_bytes": int, "stderr_bytes": int}


def _check_record(name: str, rec: Mapping[str, Any]) -> None:
    """CasCorruptError unless ``rec`` is a whole result record (a record that verifies by
    its digest but lacks a field was written by something else: never served)."""
    kind = rec.get("kind")
    if kind == "exec":
        for key, typ in _EXEC_FIELDS.items():
            if not isinstance(rec.get(key), typ) or (typ is int and isinstance(rec.get(key), bool)):
                raise CasCorruptError(name, f"result record field {key!r} is missing or not {typ.__name__}")
    elif kind == "call":
        if not isinstance(rec.get("output"), (bytes, bytearray)):
            raise CasCorruptError(name, "result record has no bytes output")
    else:
        raise CasCorruptError(name, f"unknown result record kind {kind!r}")


def _index_name(key: str) -> str:
    algo, _, hexpart = key.partition(":")
    return f"results/{algo}/{hexpart}"


def _decode_dict(name: str, body: bytes) -> dict[str, Any]:
    try:
        value = decode(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CasCorruptError(name, f"not a canonical record: {exc}") from exc
    if not isinstance(value, dict):
        raise CasCorruptError(name, "not a record")
    return value


def _provenance(idx: Mapping[str, Any], *, published: bool) -> Provenance:
    return Provenance(h_task=str(idx["h_task"]), h_exec=str(idx["h_exec"]),
                      result_digest=str(idx["result"]), task_id=str(idx["task_id"]),
                      tenant=str(idx["tenant"]), workflow=idx.get("workflow"),
                      fleet=str(idx["fleet"]), pool=str(idx["pool"]),
                      instance_id=idx.get("instance_id"), host=str(idx["host"]),
                      computed_at=float(idx["computed_at"]), compute_s=float(idx["compute_s"]),
                      published=published)


def _exec_record(res: ExecResult, image_digest: str) -> dict[str, Any]:
    """What a command's result is, for reuse: everything but its wall-clock duration."""
    return {"kind": "exec", "exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
            "timed_out": res.timed_out, "stdout_truncated": res.stdout_truncated,
            "stderr_truncated": res.stderr_truncated, "stdout_bytes": res.stdout_bytes,
            "stderr_bytes": res.stderr_bytes, "image_digest": image_digest}


def _exec_result(rec: Mapping[str, Any], duration_s: float = 0.0) -> ExecResult:
    return ExecResult(exit_code=int(rec["exit_code"]), stdout=str(rec["stdout"]), stderr=str(rec["stderr"]),
                      duration_s=duration_s, timed_out=bool(rec["timed_out"]),
                      stdout_truncated=bool(rec["stdout_truncated"]),
                      stderr_truncated=bool(rec["stderr_truncated"]),
                      stdout_bytes=int(rec["stdout_bytes"]), stderr_bytes=int(rec["stderr_bytes"]))


def _fresh_from_task(tr: TaskResult, digest: str, cache_failures: bool,
                     files: Mapping[str, bytes]) -> _Fresh:
    """Apply the failure policy (module docstring) to one run of a task."""
    res = tr.result
    p = tr.phases
    compute_s = p.env_startup + p.execution + p.teardown
    base = dict(compute_s=compute_s, task_id=tr.task_id, pool=tr.pool, instance_id=tr.instance_id,
                inputs=dict(files), native=tr)
    if tr.error is not None or res is None:
        return _Fresh(record=None, publish=False, share=False, **base)
    if tr.image_digest and tr.image_digest != digest:
        log.warning("reuse: task %s ran image %s, not %s (the tag moved): not reused",
                    tr.name, tr.image_digest, digest)
        return _Fresh(record=None, publish=False, share=False, **base)
    record = _exec_record(res, digest)
    if res.timed_out or res.exit_code >= 128 or res.exit_code < 0:
        return _Fresh(record=record, publish=False, share=False, **base)
    if res.exit_code == 0:
        return _Fresh(record=record, publish=True, share=True, **base)
    return _Fresh(record=record, publish=cache_failures, share=True, **base)
