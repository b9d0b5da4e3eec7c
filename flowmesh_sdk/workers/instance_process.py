"""A worker on an instance that is itself a container (a Kubernetes pod, a Vast.ai instance:
the provider's ``nested_containers=False``).

There is no container runtime inside such an instance, and none is needed: the instance was
launched from the worker image, so the image's entrypoint is a program *on* the instance.
:class:`InstanceWorkerProcess` does what :class:`~.container.WorkerContainer` does, with the
instance's own processes, over the instance's runner (an exec stream into the pod, SSH into
the Vast container):

* plan: ``entrypoint.py ... --dry-run`` runs as a process on the instance (same
  environment, same GPUs: the instance's);
* start: the entrypoint runs detached as the instance's own process, the way the elastic
  workers start their engine (:meth:`~.elastic_records.ServeCommand.shell`: ``nohup ... &``,
  output to a log file, the pid kept), under a small ``sh`` that waits for it and writes its
  exit status to a file (so ``wait`` and ``status`` know how it ended);
* address: the runner's ``target.host`` (on k8s, the pod's loopback address where its
  forwarded ports listen: ``providers/k8s/portforward.py``) and the engine's port;
* status and wait by the pid and the exit file, logs from the log file, stop = SIGTERM,
  ``grace_s``, SIGKILL.  Signals go through ``sh -c 'kill ...'``: a pod's exec runs argv
  without a shell and the worker image has no ``kill`` binary.

The environment travels on stdin as in a container (never in argv), read by its size: a
pod's exec cannot end stdin under ``v4.channel.k8s.io`` (:func:`~.container.with_env`).

GPUs: the instance's are all the process sees; ``gpus`` other than ``all`` become
``CUDA_VISIBLE_DEVICES`` (``none``: the empty list).  Mounts cannot be added to a running
container: a mount whose source is its target is a path the instance has (training's
dataset and output folders), any other is refused with a SpecError.

:func:`worker_process` is the one seam the roles use: a runtime's container, the instance
itself (for an :class:`~flowmesh_sdk.remote.direct.InstanceRuntime`, the pool's runtime of
such an instance), or a :class:`~.container.WorkerProcess` given as it is.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from collections.abc import Mapping, Sequence

from .. import clock
from ..errors import SpecError
from ..remote.direct import InstanceRuntime
from ..remote.runner import Runner
from ..remote.runtime import ContainerRuntime
from .container import WorkerContainer, WorkerProcess, describe_run, last_line, run_plan, with_env, worker_labels
from .errors import WorkerStartError
from .specs import Mount

#: the worker image's ENTRYPOINT as a command on the instance (imagebuild/gpu-worker/Containerfile:
#: ``/opt/flowmesh/entrypoint.py``, with ``/opt/venv/bin`` first on PATH so ``python3`` is the venv's)
IMAGE_ENTRYPOINT = ("python3", "/opt/flowmesh/entrypoint.py")
_POLL_S = (0.2, 0.5, 1.0, 2.0)


def gpu_env(gpus: str) -> dict[str, str]:
    """The environment that limits a process to the GPUs ``gpus`` (``all``: no limit)."""
    if gpus == "all":
        return {}
    return {"CUDA_VISIBLE_DEVICES": "" if gpus == "none" else gpus}


def detached_script(argv: Sequence[str], *, log_path: str, pid_path: str, exit_path: str) -> str:
    """``sh -c`` text that starts ``argv`` detached (``nohup``, output in ``log_path``),
    writes its pid to ``pid_path`` and, once it ends, its exit status to ``exit_path``; it
    prints the pid."""
    q = shlex.quote
    keeper = f'"$@" & echo $! > {q(pid_path)}; wait $!; echo $? > {q(exit_path)}'
    return (f"rm -f {q(pid_path)} {q(exit_path)}; "
            f"nohup sh -c {q(keeper)} fm-worker {shlex.join(argv)} > {q(log_path)} 2>&1 < /dev/null & "
            f"i=0; while [ ! -s {q(pid_path)} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
            f"cat {q(pid_path)}")


class InstanceWorkerProcess:
    """The worker as the own process of the instance ``runner`` reaches (see the module doc).

    ``entrypoint``: the worker image's entrypoint as a command there; ``host``/``port``:
    where clients reach the engine's port (None: the runner's ``target.host`` and the
    engine's own port; give them where the platform maps ports, as Vast.ai does);
    ``run_dir``: where the log, pid and exit files go."""

    kind = "process"

    def __init__(self, runner: Runner, role: str, *, name: str | None = None,
                 entrypoint: Sequence[str] = IMAGE_ENTRYPOINT, host: str | None = None, port: int | None = None,
                 run_dir: str = "/tmp", command_timeout_s: float = 60.0) -> None:
        if isinstance(entrypoint, (str, bytes)) or not entrypoint:
            raise SpecError("worker.entrypoint", f"must be the entrypoint's argv, got {entrypoint!r}")
        self.runner = runner
        self.role = role
        self.name = name or f"fm-worker-{role}-{secrets.token_hex(5)}"
        self.entrypoint = tuple(entrypoint)
        self.host = host
        self.port = port
        self.command_timeout_s = command_timeout_s
        base = f"{run_dir.rstrip('/')}/flowmesh-{self.name}"
        self.log_path, self.pid_path, self.exit_path = f"{base}.log", f"{base}.pid", f"{base}.exit"
        self.state_path = f"{base}.state.json"
        self.pid: int | None = None

    def __repr__(self) -> str:
        return f"InstanceWorkerProcess({self.name} on {self.runner.label}, pid={self.pid})"

    @property
    def id(self) -> str | None:
        return str(self.pid) if self.pid is not None else None

    def _argv(self, args: Sequence[str], extra: Sequence[str], *more: str) -> list[str]:
        return [*self.entrypoint, *args, *more, *(["--", *extra] if extra else [])]

    def _env(self, gpus: str, env: Mapping[str, str]) -> dict[str, str]:
        # the entrypoint's state file (for the image's HEALTHCHECK), one per worker on the instance
        return {**gpu_env(gpus), "FLOWMESH_WORKER_STATE": self.state_path, **env}

    @staticmethod
    def _check_mounts(mounts: Sequence[Mount], field: str) -> None:
        for m in mounts:
            if m.source != m.target:
                raise SpecError(f"{field}.mounts", f"{m.source} -> {m.target}: an instance that is a container "
                                                   "has no mounts of its own to add; its folders are its launch's "
                                                   "(give a path the instance has, as source and target)")

    async def _sh(self, script: str, timeout_s: float | None = None) -> str:
        res = await self.runner.run(["sh", "-c", script], timeout_s=timeout_s or self.command_timeout_s)
        return last_line(res.stdout) if res.ok else ""

    async def plan(self, image: str, args: Sequence[str], extra: Sequence[str], *, gpus: str,
                   mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool,
                   field: str) -> list[str]:
        """Run the entrypoint with ``--dry-run`` as a process on the instance and return the
        argv it would exec (``image`` is the instance's own; ``ipc_host`` is the instance's)."""
        self._check_mounts(mounts, field)
        return await run_plan(self.runner, self._argv(args, extra, "--dry-run"), self._env(gpus, env), field=field,
                              timeout_s=max(self.command_timeout_s, 300.0), stdin_eof=False)

    async def start(self, image: str, args: Sequence[str], extra: Sequence[str], *, gpus: str,
                    mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool,
                    publish_host: str | None = None, container_port: int | None = None) -> str:
        """Start the entrypoint detached as the instance's own process; returns its pid."""
        self._check_mounts(mounts, self.role)
        argv = self._argv(args, extra)
        script = detached_script(argv, log_path=self.log_path, pid_path=self.pid_path, exit_path=self.exit_path)
        cmd, stdin = with_env(["sh", "-c", script], self._env(gpus, env), stdin_eof=False)
        res = await self.runner.run(cmd, timeout_s=max(self.command_timeout_s, 120.0), input=stdin)
        pid = last_line(res.stdout)
        if not res.ok or not pid.isdigit():
            raise WorkerStartError(f"could not start the {self.role} worker process on "
                                   f"{self.runner.label}: {describe_run(res, argv)}")
        self.pid = int(pid)
        return pid

    async def address(self, container_port: int, publish_host: str) -> tuple[str, int]:
        """Where clients reach the engine's ``container_port``: ``host``/``port`` when given,
        else the runner's target host (a pod's forwarded address, opened on demand when the
        provider did not forward that port already) and the port itself."""
        target = getattr(self.runner, "target", None)
        opener = getattr(target, "open_one", None)   # providers/k8s/portforward.py: PodPorts.open_one
        if self.host is None and self.port is None and opener is not None:
            fwd = await opener(container_port)
            return str(fwd.host), int(fwd.port)
        host = self.host or getattr(target, "host", None)
        if not host:
            raise WorkerStartError(f"no address to reach {self.name} on {self.runner.label} at "
                                   "(give the instance's host)")
        return str(host), self.port or container_port

    async def status(self) -> tuple[str, int | None]:
        """``("running", None)``, ``("exited", code)`` (None: ended with no status written) or
        ``("missing", None)`` (never started)."""
        if self.pid is None:
            return "missing", None
        ex = shlex.quote(self.exit_path)
        got = await self._sh(f"if [ -s {ex} ]; then echo exited $(cat {ex}); "
                             f"elif kill -0 {self.pid} 2>/dev/null; then echo running; "
                             f"elif [ -s {ex} ]; then echo exited $(cat {ex}); else echo exited; fi")
        state, _, code = got.partition(" ")
        if state == "running":
            return state, None
        if state != "exited":
            return "missing", None
        return state, int(code) if code.lstrip("-").isdigit() else None

    async def logs(self, tail: int | None = 30) -> str:
        """The process's output (stdout and stderr together), the last ``tail`` lines."""
        argv = ["tail", "-n", str(tail), self.log_path] if tail is not None else ["cat", self.log_path]
        res = await self.runner.run(argv, timeout_s=self.command_timeout_s)
        return res.stdout.decode("utf-8", "replace")

    async def wait(self, timeout_s: float) -> int | None:
        """Wait for the process to end; its exit status, or None past ``timeout_s``."""
        end = clock.monotonic() + timeout_s
        i = 0
        while True:
            state, code = await self.status()
            if state == "exited" and code is not None:
                return code
            if state != "running":   # ended: the keeper writes the status a moment later
                await asyncio.sleep(0.2)
                state, code = await self.status()
                if code is not None:
                    return code
                raise WorkerStartError(f"cannot wait for {self.name} on {self.runner.label}: "
                                       f"it left no exit status ({state})")
            left = end - clock.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(_POLL_S[min(i, len(_POLL_S) - 1)], left))
            i += 1

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, up to ``grace_s`` to exit, then SIGKILL; then :meth:`remove`."""
        if (await self.status())[0] == "running":
            await self._sh(f"kill -TERM {self.pid} 2>/dev/null; echo sent")
            if await self.wait(max(grace_s, 0.0)) is None:
                await self._sh(f"kill -KILL {self.pid} 2>/dev/null; echo sent")
                await self.wait(self.command_timeout_s)
        await self.remove()

    async def remove(self) -> None:
        """As a container is force-removed: a process still running is killed (SIGKILL); the
        pid and exit files go, the log stays for a look afterwards."""
        if (await self.status())[0] == "running":
            await self._sh(f"kill -KILL {self.pid} 2>/dev/null; echo sent")
        await self._sh(f"rm -f {shlex.quote(self.pid_path)} {shlex.quote(self.exit_path)}; echo ok")


def worker_process(target: ContainerRuntime | WorkerProcess, role: str, *, fleet: str, instance_id: str,
                   name: str | None = None) -> WorkerProcess:
    """The worker's program on its instance: a container of ``target`` (a runtime), the
    instance's own process (an :class:`InstanceRuntime`: the instance is a container), or
    ``target`` itself when it is already one."""
    if isinstance(target, InstanceRuntime):
        return InstanceWorkerProcess(target.runner, role, name=name, command_timeout_s=target.config.command_timeout_s)
    if isinstance(target, ContainerRuntime):
        return WorkerContainer(target, role, worker_labels(role, fleet=fleet, instance_id=instance_id), name=name)
    if name is not None and name != target.name:
        raise SpecError(f"{role}.name", f"the worker is {target.name!r}; give the name to the process, not {name!r}")
    return target
