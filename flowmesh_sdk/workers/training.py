"""The training role: a TRL job (SFT, DPO or GRPO) launched through the worker image's
``entrypoint.py train`` path, its checkpoints published to the content-addressed store.

Two ways to launch, one code path for the command:

* **container** (``spec.image`` set; the normal way on a GPU instance): the job runs in the
  worker image through the container runtime, with the GPUs, ``--ipc host`` and the
  model, dataset and output folders mounted at the same paths;
* **process** (``spec.image`` None): the runner runs ``python entrypoint.py train`` on
  the machine, where TRL is installed (the bench does this; so can a host without a
  container runtime).

On an instance that is itself a container (a pod, a Vast.ai instance), container mode runs
the job as the instance's own process instead (:class:`~.instance_process.InstanceWorkerProcess`;
the instance was launched from the worker image): give an ``InstanceRuntime`` or use
:meth:`TrainingWorker.on_instance`.

Either way the entrypoint is asked first with ``--dry-run`` (the exact
``accelerate launch ... -m trl.scripts.<recipe>`` argv comes back; a refused argument
fails at once with the entrypoint's message), then run for real with a deadline.

**Join** = the job is planned and started (READY while it runs).  **Leave** = drain +
flush: :meth:`TrainingWorker.wait` lets the job finish, :meth:`TrainingWorker.stop` ends
it early (SIGTERM then SIGKILL in a container; SIGKILL of the process tree otherwise);
both then publish every complete checkpoint (a ``checkpoint-N`` folder holding
``trainer_state.json``, which the HF Trainer writes last) and, after a clean exit, the
final model (the files the TRL script saves at the top of the output folder) to the
store.  A checkpoint on a remote machine is fetched over the runner into a local staging
folder first.

Events (when a bus is given): ``WORKER_STARTING``, ``WORKER_READY``,
``WORKER_DRAINING``, ``CHECKPOINT_PUBLISHED`` (one per checkpoint), ``WORKER_STOPPED``,
``WORKER_FAILED``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import re
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from ..cas.base import ContentStore
from ..control.events import EventBus, EventKind
from ..errors import FlowMeshError, SpecError
from ..imagebuild import GPU_WORKER_ENTRYPOINT
from ..remote.runner import CommandResult, Runner
from ..remote.runtime import ContainerRuntime
from .checkpoints import Checkpoint, publish_files
from .container import WorkerProcess, run_plan, with_env
from .errors import TrainingFailedError
from .instance_process import IMAGE_ENTRYPOINT, InstanceWorkerProcess, worker_process
from .specs import Mount, TrainingSpec
from .state import WorkerBase, WorkerState, worker_lifecycle

#: the GPU worker image's entrypoint, shipped in the package (process mode's default on this host)
REPO_ENTRYPOINT = GPU_WORKER_ENTRYPOINT
_CKPT = re.compile(r"^checkpoint-(\d+)$")
_COMPLETE_MARK = "trainer_state.json"


@dataclass(frozen=True, slots=True)
class TrainingResult:
    """What a training job left: its exit status, the checkpoints now in the store, the
    trainer's final metrics (``train_samples_per_second``, ``train_loss``, ...) and the
    exact command that ran."""

    worker: str
    exit_code: int | None
    checkpoints: tuple[Checkpoint, ...]
    final: Checkpoint | None
    metrics: Mapping[str, float]
    duration_s: float
    argv: tuple[str, ...]
    log_tail: str = field(repr=False, default="")


def parse_train_metrics(output: str) -> dict[str, float]:
    """The trainer's closing metrics line, e.g. ``{'train_runtime': '0.07',
    'train_samples_per_second': '118.2', ...}`` (transformers' Trainer logs it as a Python
    dict when training ends); the last such line wins; {} when there is none."""
    for line in reversed(output.splitlines()):
        start = line.find("{'train_runtime'")
        if start < 0:
            continue
        end = line.rfind("}")
        try:
            raw = ast.literal_eval(line[start:end + 1])
        except (ValueError, SyntaxError):
            continue
        out: dict[str, float] = {}
        for k, v in raw.items():
            try:
                out[str(k)] = float(v)
            except (TypeError, ValueError):
                pass
        return out
    return {}


def _step(folder: str) -> int:
    """N of a ``checkpoint-N`` folder name."""
    m = _CKPT.match(folder)
    return int(m.group(1)) if m else -1


def job_mounts(spec: TrainingSpec) -> list[Mount]:
    """What a training container mounts: the dataset (read-only) and output folders at
    the same paths, the model too when it is a path, then ``spec.mounts``."""
    mounts = [Mount(spec.dataset, spec.dataset, read_only=True),
              Mount(spec.output, spec.output, read_only=False)]
    if spec.model.startswith("/"):
        mounts.append(Mount(spec.model, spec.model, read_only=True))
    return mounts + list(spec.mounts)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class TrainingWorker(WorkerBase):
    """One TRL job on the machine ``target`` reaches (a ContainerRuntime, or a Runner for
    process mode; a :class:`~.container.WorkerProcess` runs container mode as that)."""

    role = "training"

    def __init__(self, target: ContainerRuntime | Runner | WorkerProcess, spec: TrainingSpec, *, store: ContentStore,
                 name: str | None = None, fleet: str = "workers", instance_id: str = "",
                 bus: EventBus | None = None, ref_prefix: str | None = "checkpoints",
                 staging_dir: str | Path | None = None, stop_grace_s: float = 30.0) -> None:
        if not isinstance(spec, TrainingSpec):
            raise SpecError("training", f"must be a TrainingSpec, got {type(spec).__name__}")
        carrier: ContainerRuntime | WorkerProcess = ContainerRuntime(target) if isinstance(target, Runner) else target
        self.runtime = carrier if isinstance(carrier, ContainerRuntime) else None
        self.runner: Runner = carrier.runner
        self.spec = spec
        self.store = store
        self.fleet = fleet
        self.instance_id = instance_id or self.runner.label
        self.bus = bus
        self.staging_dir = Path(staging_dir) if staging_dir else None
        self.stop_grace_s = stop_grace_s
        self.container = worker_process(carrier, self.role, fleet=fleet, instance_id=self.instance_id, name=name)
        self.name = self.container.name
        self.ref_prefix = f"{ref_prefix}/{self.name}" if ref_prefix else None
        self.lifecycle = worker_lifecycle(self.name)
        self.argv: list[str] = []
        self._proc: asyncio.Task[CommandResult] | None = None
        self._entry: str | None = None
        self._t0 = 0.0
        self._result: TrainingResult | None = None

    @classmethod
    def on_instance(cls, runner: Runner, spec: TrainingSpec, *, store: ContentStore, name: str | None = None,
                    entrypoint: Sequence[str] = IMAGE_ENTRYPOINT, **kw: object) -> TrainingWorker:
        """Container mode as the own process of an instance that is a container, launched
        from ``spec.image`` and reached over ``runner``; ``kw``: the constructor's other arguments."""
        proc = InstanceWorkerProcess(runner, cls.role, name=name, entrypoint=entrypoint)
        return cls(proc, spec, store=store, **kw)  # type: ignore[arg-type]  # kw: the keyword arguments of __init__

    def __repr__(self) -> str:
        mode = "container" if self.spec.image else "process"
        return f"TrainingWorker({self.name}, {self.spec.recipe}, {mode}, {self.state.value})"

    def _mounts(self) -> list[Mount]:
        return job_mounts(self.spec)

    async def _entrypoint(self) -> str:
        """Process mode: the entrypoint's path on the machine (uploaded when remote)."""
        if self.spec.entrypoint:
            return self.spec.entrypoint
        if not REPO_ENTRYPOINT.is_file():
            raise SpecError("training.entrypoint", "give the path of entrypoint.py on the machine "
                                                   "(no source checkout to take it from)")
        if self.runner.on_this_host:
            return str(REPO_ENTRYPOINT)
        data = REPO_ENTRYPOINT.read_bytes()
        remote = f"/tmp/flowmesh-entrypoint-{hashlib.sha256(data).hexdigest()[:12]}.py"
        await self.runner.put_file(str(REPO_ENTRYPOINT), remote)
        return remote

    # ---- join -------------------------------------------------------------------------
    async def start(self) -> list[str]:
        """Plan and start the job; returns the exact command the entrypoint runs."""
        if self.state is not WorkerState.STARTING or self._t0:
            raise SpecError("training.start", f"worker {self.name} is {self.state.value}; start it once")
        s = self.spec
        self._t0 = time.monotonic()
        self._emit(EventKind.WORKER_STARTING, f"recipe={s.recipe} model={s.model}")
        try:
            mk = await self.runner.run(["mkdir", "-p", s.output], timeout_s=60)
            if not mk.ok:
                raise TrainingFailedError(f"cannot create {s.output} on {self.runner.label}: {mk.describe()}",
                                          exit_code=mk.exit_code, log_tail="")
            if s.image:
                self.argv = await self.container.plan(s.image, s.train_args(), s.extra_args, gpus=s.gpus,
                                                      mounts=self._mounts(), env=s.env, ipc_host=True,
                                                      field="training")
                await self.container.start(s.image, s.train_args(), s.extra_args, gpus=s.gpus,
                                           mounts=self._mounts(), env=s.env, ipc_host=True)
            else:
                self._entry = await self._entrypoint()
                base = [s.python, self._entry, *s.train_args()]
                extra = ["--", *s.extra_args] if s.extra_args else []
                # the state file is for the image's HEALTHCHECK; a process has none to feed
                env = {"FLOWMESH_WORKER_STATE": "/dev/null", **s.env}
                self.argv = await run_plan(self.runner, [*base, "--dry-run", *extra], env,
                                           field="training", timeout_s=120.0)
                cmd, stdin = with_env([*base, *extra], env)
                self._proc = asyncio.create_task(self.runner.run(cmd, timeout_s=s.timeout_s, input=stdin))
        except BaseException as exc:
            self.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, str(exc)[:500])
            if s.image:
                with contextlib.suppress(FlowMeshError):
                    await self.container.remove()
            raise
        self.lifecycle.to(WorkerState.READY)
        self._emit(EventKind.WORKER_READY, " ".join(self.argv)[:500])
        return self.argv

    # ---- leave ------------------------------------------------------------------------
    async def wait(self) -> TrainingResult:
        """Let the job finish (up to ``spec.timeout_s`` from its start), then publish its
        checkpoints and final model.  TrainingFailedError on a non-zero exit or a timeout."""
        if self._result is not None:
            return self._result
        if self.state is not WorkerState.READY:
            raise SpecError("training.wait", f"worker {self.name} is {self.state.value}; start it first")
        code, output = await self._job_exit(self.spec.timeout_s - (time.monotonic() - self._t0))
        return await self._finish(code, output, stopped=False)

    async def stop(self) -> TrainingResult:
        """End the job now and publish the complete checkpoints it wrote."""
        if self._result is not None:
            return self._result
        if self.state is not WorkerState.READY:
            raise SpecError("training.stop", f"worker {self.name} is {self.state.value}; start it first")
        if self.spec.image:
            out = await self.container.logs(tail=200)
            await self.container.stop(grace_s=self.stop_grace_s)
            return await self._finish(None, out, stopped=True)
        assert self._proc is not None
        self._proc.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._proc
        return await self._finish(None, "", stopped=True)

    async def run(self) -> TrainingResult:
        """``start`` then ``wait``."""
        await self.start()
        return await self.wait()

    async def _job_exit(self, left_s: float) -> tuple[int | None, str]:
        if self.spec.image:
            code = await self.container.wait(max(left_s, 1.0))
            out = await self.container.logs(tail=400)
            if code is None:
                await self.container.stop(grace_s=self.stop_grace_s)
            else:
                await self.container.remove()
            return code, out
        assert self._proc is not None
        res = await self._proc
        out = (res.stdout + b"\n" + res.stderr).decode("utf-8", "replace")
        return (None if res.timed_out else res.exit_code), out

    async def _finish(self, code: int | None, output: str, *, stopped: bool) -> TrainingResult:
        self.lifecycle.to(WorkerState.DRAINING)
        self._emit(EventKind.WORKER_DRAINING, f"exit={code}")
        if not stopped and code != 0:
            self.lifecycle.to(WorkerState.FAILED)
            why = "ran past its deadline" if code is None else f"exited {code}"
            self._emit(EventKind.WORKER_FAILED, why)
            raise TrainingFailedError(f"training job {self.name} on {self.runner.label} {why}: "
                                      f"{_tail(output, 3)}", exit_code=code, log_tail=_tail(output))
        try:
            checkpoints, final = await self.publish(include_final=not stopped)
        except BaseException as exc:
            self.lifecycle.to(WorkerState.FAILED)
            self._emit(EventKind.WORKER_FAILED, f"publishing failed: {exc}"[:500])
            raise
        self._result = TrainingResult(self.name, code, tuple(checkpoints), final, MappingProxyType(
            parse_train_metrics(output)), time.monotonic() - self._t0, tuple(self.argv), _tail(output))
        self.lifecycle.to(WorkerState.STOPPED)
        self._emit(EventKind.WORKER_STOPPED,
                   f"checkpoints={len(checkpoints)} final={final.digest if final else None}")
        return self._result

    # ---- flush: checkpoints to the store ----------------------------------------------
    async def _list_output(self) -> list[str]:
        """Files under the output folder, relative to it."""
        out = self.spec.output
        if self.runner.on_this_host:
            root = Path(out)
            return await asyncio.to_thread(
                lambda: sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()))
        res = await self.runner.run(["find", out, "-type", "f"], timeout_s=120)
        if not res.ok:
            raise TrainingFailedError(f"cannot list {out} on {self.runner.label}: {res.describe()}",
                                      exit_code=None, log_tail="")
        prefix = out.rstrip("/") + "/"
        return sorted(ln[len(prefix):] for ln in res.text().splitlines() if ln.startswith(prefix))

    async def publish(self, *, include_final: bool = True) -> tuple[list[Checkpoint], Checkpoint | None]:
        """Put every complete ``checkpoint-N`` folder (and the final model) in the store."""
        files = await self._list_output()
        groups: dict[str, list[str]] = {}
        for rel in files:
            head, _, rest = rel.partition("/")
            if rest and _CKPT.match(head):
                groups.setdefault(head, []).append(rel)
            elif not rest and include_final:
                groups.setdefault("", []).append(rel)
        complete = {k: v for k, v in groups.items()
                    if k == "" or f"{k}/{_COMPLETE_MARK}" in v}
        local_root, cleanup = await self._stage([f for v in complete.values() for f in v])
        try:
            checkpoints: list[Checkpoint] = []
            for step, head in sorted((_step(k), k) for k in complete if k):
                ck = await publish_files(self.store, local_root / head,
                                         [f[len(head) + 1:] for f in complete[head]],
                                         name=head, step=step, ref_prefix=self.ref_prefix)
                checkpoints.append(ck)
                self._emit(EventKind.CHECKPOINT_PUBLISHED, f"{ck.name} {ck.digest}")
            final = None
            if complete.get(""):
                final_step = checkpoints[-1].step if checkpoints else None
                final = await publish_files(self.store, local_root, complete[""], name="final",
                                            step=final_step, ref_prefix=self.ref_prefix)
                self._emit(EventKind.CHECKPOINT_PUBLISHED, f"final {final.digest}")
        finally:
            if cleanup is not None:
                await asyncio.to_thread(shutil.rmtree, cleanup, True)
        return checkpoints, final

    async def _stage(self, files: list[str]) -> tuple[Path, Path | None]:
        """A local folder holding ``files``: the output folder itself on this host, else a
        staging folder they are fetched into (removed after publishing)."""
        if self.runner.on_this_host:
            return Path(self.spec.output), None
        if self.staging_dir is not None:
            self.staging_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.staging_dir))
        try:
            for rel in files:
                dest = tmp / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                await self.runner.get_file(f"{self.spec.output.rstrip('/')}/{rel}", str(dest))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp, tmp
