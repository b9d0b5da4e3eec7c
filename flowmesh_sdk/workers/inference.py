"""The inference role: a vLLM server in the worker image on one instance, joined and left
the FlowMesh way.

**Join** = load weights + accept.  :meth:`InferenceWorker.join`

1. plans the launch: the worker image's ``entrypoint.py serve ... --dry-run`` runs in a
   throw-away container that sees the same GPUs, so the image itself counts the GPUs
   and chooses the tensor-parallel size (with ``--tensor-parallel-fit``: the largest
   power of two that is at most the GPUs and divides the attention heads); the exact
   ``vllm serve`` argv comes back, and a refused argument fails here, in a second,
   with the entrypoint's message;
2. starts the container detached (GPUs, ``--ipc host``, port 8000 published on
   ``publish_host``, labels that ``flowmesh gc`` finds);
3. waits until ``/health`` answers 200 and ``/v1/models`` lists the model, with bounded
   backoff and a deadline, failing at once if the container exits;
4. only then is the worker READY and its :class:`InferenceEndpoint` admits requests.

**Leave** = drain + flush.  :meth:`InferenceWorker.leave` stops admitting, sends the
waiting micro-batches at once, waits for the requests in flight up to a deadline, then
stops and removes the container (an inference worker holds no state worth keeping: the
weights come from the model store, the answers went to their callers).

On an instance that is itself a container (a pod, a Vast.ai instance: an
:class:`~flowmesh_sdk.remote.direct.InstanceRuntime`, or :meth:`InferenceWorker.on_instance`
with the instance's runner) the same steps run with the instance's own processes
(:class:`~.instance_process.InstanceWorkerProcess`): the plan and the server are processes
of the instance, which was launched from the worker image, and the server is reached at the
runner's target host (a pod's forwarded address) on port 8000.

Events (when a bus is given): ``WORKER_STARTING``, ``WORKER_READY``,
``WORKER_DRAINING``, ``WORKER_STOPPED``, ``WORKER_FAILED``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import httpx

from ..control.events import EventBus, EventKind
from ..errors import FlowMeshError, SpecError
from ..remote.runner import Runner
from ..remote.runtime import ContainerRuntime
from .container import WorkerProcess
from .endpoint import DrainReport, InferenceEndpoint
from .errors import WorkerStartError
from .health import HealthReport, wait_until_healthy
from .instance_process import IMAGE_ENTRYPOINT, InstanceWorkerProcess, worker_process
from .specs import CONTAINER_PORT, ClientLimits, InferenceSpec
from .state import WorkerBase, WorkerState, worker_lifecycle

log = logging.getLogger("flowmesh.workers")


def tensor_parallel_of(argv: list[str]) -> int:
    """The ``--tensor-parallel-size`` of a ``vllm serve`` argv."""
    try:
        return int(argv[argv.index("--tensor-parallel-size") + 1])
    except (ValueError, IndexError) as exc:
        raise WorkerStartError(f"the launch plan has no --tensor-parallel-size: {argv}") from exc


class InferenceWorker(WorkerBase):
    """One vLLM server on the machine ``runtime`` drives: in a container of that runtime, or,
    given a :class:`~.container.WorkerProcess` (or an ``InstanceRuntime``), as that."""

    role = "inference"

    def __init__(self, runtime: ContainerRuntime | WorkerProcess, spec: InferenceSpec, *, name: str | None = None,
                 fleet: str = "workers", instance_id: str = "", limits: ClientLimits | None = None,
                 bus: EventBus | None = None, stop_grace_s: float = 10.0) -> None:
        if not isinstance(spec, InferenceSpec):
            raise SpecError("inference", f"must be an InferenceSpec, got {type(spec).__name__}")
        self.runtime = runtime if isinstance(runtime, ContainerRuntime) else None
        self.spec = spec
        self.fleet = fleet
        self.instance_id = instance_id or runtime.runner.label
        self.limits = limits or ClientLimits()
        self.bus = bus
        self.stop_grace_s = stop_grace_s
        self.container = worker_process(runtime, self.role, fleet=fleet, instance_id=self.instance_id, name=name)
        self.name = self.container.name
        self.lifecycle = worker_lifecycle(self.name)
        self.launch_argv: list[str] = []
        self.tensor_parallel: int | None = None
        self.health: HealthReport | None = None
        self.endpoint: InferenceEndpoint | None = None

    @classmethod
    def on_instance(cls, runner: Runner, spec: InferenceSpec, *, name: str | None = None,
                    entrypoint: Sequence[str] = IMAGE_ENTRYPOINT, host: str | None = None, port: int | None = None,
                    **kw: object) -> InferenceWorker:
        """The server as the own process of an instance that is a container, launched from
        ``spec.image`` and reached over ``runner`` (see :class:`InstanceWorkerProcess` for
        ``entrypoint``, ``host`` and ``port``); ``kw``: the constructor's other arguments."""
        proc = InstanceWorkerProcess(runner, cls.role, name=name, entrypoint=entrypoint, host=host, port=port)
        return cls(proc, spec, **kw)  # type: ignore[arg-type]  # kw: the keyword arguments of __init__

    def __repr__(self) -> str:
        return f"InferenceWorker({self.name}, model={self.spec.model!r}, {self.state.value})"

    # ---- join -------------------------------------------------------------------------
    async def join(self) -> InferenceEndpoint:
        """Plan, start, health-check; return the endpoint once READY (see the module doc)."""
        if self.state is not WorkerState.STARTING or self.endpoint is not None:
            raise SpecError("inference.join", f"worker {self.name} is {self.state.value}; join it once")
        spec = self.spec
        self._emit(EventKind.WORKER_STARTING, f"model={spec.model} image={spec.image}")
        started = False
        try:
            self.launch_argv = await self.container.plan(
                spec.image, spec.serve_args(), spec.extra_args, gpus=spec.gpus, mounts=spec.mounts,
                env=spec.env, ipc_host=spec.ipc_host, field="inference")
            self.tensor_parallel = tensor_parallel_of(self.launch_argv)
            await self.container.start(spec.image, spec.serve_args(), spec.extra_args, gpus=spec.gpus,
                                       mounts=spec.mounts, env=spec.env, ipc_host=spec.ipc_host,
                                       publish_host=spec.publish_host, container_port=CONTAINER_PORT)
            started = True
            host, port = await self.container.address(CONTAINER_PORT, spec.publish_host)
            base_url = f"http://{spec.url_host or host}:{port}"
            async with httpx.AsyncClient() as probe_client:
                self.health = await wait_until_healthy(
                    probe_client, base_url, spec.name_in_api, timeout_s=spec.start_timeout_s,
                    alive=self._dead_reason, what=f"inference worker {self.name}")
        except BaseException as exc:
            self.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, str(exc)[:500])
            if started:
                with contextlib.suppress(FlowMeshError):
                    await self.container.stop(grace_s=0)
            raise
        self.endpoint = InferenceEndpoint(base_url, spec.name_in_api, worker=self.name,
                                          tensor_parallel=self.tensor_parallel, limits=self.limits)
        self.lifecycle.to(WorkerState.READY)
        self._emit(EventKind.WORKER_READY, f"url={base_url} model={spec.name_in_api} "
                                           f"tp={self.tensor_parallel}")
        log.info("inference worker %s ready at %s (tp=%s)", self.name, base_url, self.tensor_parallel)
        return self.endpoint

    async def _dead_reason(self) -> str | None:
        state, code = await self.container.status()
        if state == "running":
            return None
        tail = (await self.container.logs(tail=15)).strip().replace("\n", " | ") if state != "missing" else ""
        return f"{self.container.kind} {state} (exit {code}){': ' + tail[-800:] if tail else ''}"

    # ---- leave ------------------------------------------------------------------------
    async def leave(self, timeout_s: float = 60.0) -> DrainReport:
        """Drain (no new requests; in-flight ones get up to ``timeout_s``) and stop."""
        if self.state is WorkerState.READY:
            self.lifecycle.to(WorkerState.DRAINING)
            self._emit(EventKind.WORKER_DRAINING)
        elif self.state is not WorkerState.DRAINING:
            return DrainReport(0, 0, 0.0)
        assert self.endpoint is not None
        report = await self.endpoint.drain(timeout_s)
        try:
            await self.container.stop(grace_s=self.stop_grace_s)
        except FlowMeshError as exc:
            self.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, f"stop failed: {exc}"[:500])
            await self.endpoint.aclose()
            raise
        await self.endpoint.aclose()
        self.lifecycle.to(WorkerState.STOPPED)
        self._emit(EventKind.WORKER_STOPPED, f"completed={report.completed} abandoned={report.abandoned}")
        return report

    async def __aenter__(self) -> InferenceEndpoint:
        return await self.join()

    async def __aexit__(self, *exc: object) -> None:
        await self.leave()
