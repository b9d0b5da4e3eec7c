"""A worker container on one machine: planned, started, watched and stopped through the
container runtime's CLI over any :class:`~flowmesh_sdk.remote.runner.Runner`.

:class:`~flowmesh_sdk.remote.runtime.ContainerRuntime` makes *sandbox* containers (an
idle PID 1 that commands are sent to).  A worker is different: its image's ENTRYPOINT
(``entrypoint.py``) is the program, it may need GPUs, a published port and mounts.  This
module builds that ``run`` command, reusing the runtime's probe (binary and host
flags such as ``--runtime runc`` and ``--ulimit``) so the same host quirks apply.

GPUs are passed the way each CLI documents it:

* podman: CDI, ``--device nvidia.com/gpu=all`` or one ``--device nvidia.com/gpu=N`` per
  index (NVIDIA Container Toolkit, "Support for Container Device Interface",
  https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/cdi-support.html);
* docker: ``--gpus all`` or ``--gpus '"device=0,1"'`` (Docker run reference, "--gpus").

With GPUs, ``--ipc host`` is added unless turned off: vLLM's docs ("Deploying with
Docker", https://docs.vllm.ai/en/latest/serving/deploying_with_docker.html) ask for
``--ipc=host`` (or a large ``--shm-size``) because PyTorch shares tensors between the
tensor-parallel processes through shared memory.

Environment values never appear in a command line: the runner feeds them on stdin to
``sh -c 'set -a; . /dev/stdin; exec "$@"'`` and the runtime gets ``--env NAME`` (value
taken from its own environment), so a token is not in ``ps`` output, logs or errors.  Where
the runner cannot end stdin (a pod's exec under the ``v4.channel.k8s.io`` protocol has no
half-close: only ``v5`` has the close message, KEP-4006), the shim reads exactly the script's
bytes with ``head -c N`` instead of up to EOF.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import Protocol

from ..config import Owner
from ..errors import SpecError
from ..provider import LABEL_FLEET, LABEL_INSTANCE, LABEL_OWNER
from ..remote.runner import CommandResult, Runner
from ..remote.runtime import ContainerRuntime, RuntimeInfo
from .errors import WorkerStartError
from .specs import Mount

#: container label naming the worker role (``inference`` or ``training``)
LABEL_WORKER = "flowmesh.worker"
_ENV_SHIM = 'set -a; . /dev/stdin; set +a; exec "$@"'
_ENV_SHIM_SIZED = 'set -a; eval "$(head -c {size})"; set +a; exec "$@"'


def gpu_flags(binary: str, gpus: str) -> list[str]:
    """The ``run`` flags that give a container the GPUs ``gpus`` (``all``, ``none``, ``0,1``)."""
    if gpus == "none":
        return []
    if binary == "docker":
        return ["--gpus", "all" if gpus == "all" else f'"device={gpus}"']
    if gpus == "all":
        return ["--device", "nvidia.com/gpu=all"]
    out: list[str] = []
    for idx in gpus.split(","):
        out += ["--device", f"nvidia.com/gpu={idx}"]
    return out


def with_env(argv: Sequence[str], env: Mapping[str, str], *,
             stdin_eof: bool = True) -> tuple[list[str], bytes | None]:
    """``argv`` run with ``env`` added, the values travelling on stdin (never in argv);
    ``stdin_eof`` False: read exactly their bytes (a runner whose stdin never ends)."""
    if not env:
        return list(argv), None
    script = "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())).encode()
    shim = _ENV_SHIM if stdin_eof else _ENV_SHIM_SIZED.format(size=len(script))
    return ["sh", "-c", shim, "fm-env", *argv], script


def worker_labels(role: str, *, fleet: str, instance_id: str) -> dict[str, str]:
    """The labels ``flowmesh gc`` finds a worker container by (fleet, owner, instance)."""
    return {LABEL_FLEET: fleet, LABEL_OWNER: str(Owner.current()), LABEL_INSTANCE: instance_id,
            LABEL_WORKER: role}


def build_run_argv(info: RuntimeInfo, image: str, args: Sequence[str], *, name: str | None,
                   labels: Mapping[str, str], gpus: str, mounts: Sequence[Mount] = (),
                   env_names: Sequence[str] = (), ipc_host: bool = True, publish_host: str | None = None,
                   container_port: int | None = None) -> list[str]:
    """The ``run`` command of a worker container: detached under ``name``, or ``--rm``
    (a one-off, e.g. the ``--dry-run`` plan) when ``name`` is None.  ``env_names`` are
    passed as ``--env NAME`` (values come from the runtime's own environment)."""
    argv = [info.binary, "run"]
    argv += ["-d", "--name", name] if name else ["--rm"]
    argv += list(info.run_flags)
    for k, v in sorted(labels.items()):
        argv += ["--label", f"{k}={v}"]
    argv += gpu_flags(info.binary, gpus)
    if gpus != "none" and ipc_host:
        argv += ["--ipc", "host"]
    if publish_host is not None and container_port is not None:
        argv += ["-p", f"{publish_host}::{container_port}"]
    for m in mounts:
        argv += ["-v", m.flag()]
    for k in env_names:
        argv += ["--env", k]
    return argv + [image, *args]


class WorkerProcess(Protocol):
    """Where a worker's program runs and how it is driven: a container of a runtime
    (:class:`WorkerContainer`) or the instance's own process, on an instance that is itself a
    container (:class:`~.instance_process.InstanceWorkerProcess`).  ``kind`` names it in
    messages (``container``, ``process``); ``id`` is set once started."""

    name: str
    role: str
    kind: str

    @property
    def runner(self) -> Runner: ...

    @property
    def id(self) -> str | None: ...

    async def plan(self, image: str, args: Sequence[str], extra: Sequence[str], *, gpus: str,
                   mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool, field: str) -> list[str]: ...

    async def start(self, image: str, args: Sequence[str], extra: Sequence[str], *, gpus: str,
                    mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool,
                    publish_host: str | None = None, container_port: int | None = None) -> str: ...

    async def address(self, container_port: int, publish_host: str) -> tuple[str, int]: ...

    async def status(self) -> tuple[str, int | None]: ...

    async def logs(self, tail: int | None = 30) -> str: ...

    async def wait(self, timeout_s: float) -> int | None: ...

    async def stop(self, grace_s: float = 10.0) -> None: ...

    async def remove(self) -> None: ...


def last_line(data: bytes) -> str:
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


class WorkerContainer:
    """One named worker container on the machine ``runtime.runner`` reaches."""

    kind = "container"

    def __init__(self, runtime: ContainerRuntime, role: str, labels: Mapping[str, str],
                 name: str | None = None) -> None:
        self.runtime = runtime
        self.role = role
        self.labels = dict(labels)
        self.name = name or f"fm-worker-{role}-{secrets.token_hex(5)}"
        self.id: str | None = None

    @property
    def runner(self) -> Runner:
        return self.runtime.runner

    def _run_argv(self, info: RuntimeInfo, image: str, args: Sequence[str], *, gpus: str,
                  mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool,
                  publish_host: str | None, container_port: int | None, detach: bool) -> list[str]:
        return build_run_argv(info, image, args, name=self.name if detach else None, labels=self.labels,
                              gpus=gpus, mounts=mounts, env_names=sorted(env), ipc_host=ipc_host,
                              publish_host=publish_host, container_port=container_port)

    async def plan(self, image: str, args: Sequence[str], extra: Sequence[str], *, gpus: str,
                   mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool,
                   field: str) -> list[str]:
        """Run the entrypoint with ``--dry-run`` in a throw-away container that sees the same
        GPUs and mounts, and return the exact argv it would exec.  A refused argument (exit
        2) raises SpecError(``field``) with the entrypoint's message."""
        info = await self.runtime.probe()
        plan_args = [*args, "--dry-run", *(["--", *extra] if extra else [])]
        argv = self._run_argv(info, image, plan_args, gpus=gpus, mounts=mounts, env=env,
                              ipc_host=ipc_host, publish_host=None, container_port=None, detach=False)
        return await run_plan(self.runner, argv, env, field=field,
                              timeout_s=max(self.runtime.config.command_timeout_s, 300.0))

    async def start(self, image: str, args: Sequence[str], extra: Sequence[str], *, gpus: str,
                    mounts: Sequence[Mount], env: Mapping[str, str], ipc_host: bool,
                    publish_host: str | None = None, container_port: int | None = None) -> str:
        """Start the container detached; returns its id."""
        info = await self.runtime.probe()
        run_args = [*args, *(["--", *extra] if extra else [])]
        argv = self._run_argv(info, image, run_args, gpus=gpus, mounts=mounts, env=env,
                              ipc_host=ipc_host, publish_host=publish_host,
                              container_port=container_port, detach=True)
        cmd, stdin = with_env(argv, env)
        res = await self.runner.run(cmd, timeout_s=max(self.runtime.config.command_timeout_s, 900.0),
                                    input=stdin)
        if not res.ok:
            raise WorkerStartError(f"could not start the {self.role} worker container on "
                                   f"{self.runner.label}: {describe_run(res, argv)}")
        self.id = last_line(res.stdout)
        return self.id

    async def host_port(self, container_port: int) -> int:
        """The host port the runtime published ``container_port`` on."""
        info = await self.runtime.probe()
        res = await self.runner.run([info.binary, "port", self.name, f"{container_port}/tcp"],
                                    timeout_s=self.runtime.config.command_timeout_s)
        text = last_line(res.stdout)
        port = text.rsplit(":", 1)[-1]
        if not res.ok or not port.isdigit():
            raise WorkerStartError(f"no published port for {self.name}:{container_port} on "
                                   f"{self.runner.label}: {res.describe()} {text!r}")
        return int(port)

    async def address(self, container_port: int, publish_host: str) -> tuple[str, int]:
        """Where ``container_port`` is reached: ``publish_host`` and the published port."""
        return publish_host, await self.host_port(container_port)

    async def status(self) -> tuple[str, int | None]:
        """``(state, exit code)``: ``("running", None)``, ``("exited", 3)``, ``("missing", None)``."""
        info = await self.runtime.probe()
        res = await self.runner.run([info.binary, "inspect", "--format",
                                     "{{.State.Status}} {{.State.ExitCode}}", self.name],
                                    timeout_s=self.runtime.config.command_timeout_s)
        if not res.ok:
            return "missing", None
        state, _, code = last_line(res.stdout).partition(" ")
        if state == "running":
            return state, None
        return state, int(code) if code.lstrip("-").isdigit() else None

    async def logs(self, tail: int | None = 30) -> str:
        """The container's output (stdout and stderr), the last ``tail`` lines."""
        info = await self.runtime.probe()
        argv = [info.binary, "logs"] + (["--tail", str(tail)] if tail is not None else []) + [self.name]
        res = await self.runner.run(argv, timeout_s=self.runtime.config.command_timeout_s)
        return (res.stdout + res.stderr).decode("utf-8", "replace")

    async def wait(self, timeout_s: float) -> int | None:
        """Wait for the container to exit; its exit code, or None past ``timeout_s``."""
        info = await self.runtime.probe()
        res = await self.runner.run([info.binary, "wait", self.name], timeout_s=timeout_s)
        if res.timed_out:
            return None
        code = last_line(res.stdout)
        if not res.ok or not code.lstrip("-").isdigit():
            raise WorkerStartError(f"cannot wait for {self.name} on {self.runner.label}: {res.describe()}")
        return int(code)

    async def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, ``grace_s`` to exit, then SIGKILL; then remove the container."""
        info = await self.runtime.probe()
        await self.runner.run([info.binary, "stop", "-t", str(max(0, int(grace_s))), self.name],
                              timeout_s=grace_s + self.runtime.config.command_timeout_s)
        await self.remove()

    async def remove(self) -> None:
        """Remove the container (stopped or never started)."""
        await self.runtime.remove([self.name])


async def run_plan(runner: Runner, argv: Sequence[str], env: Mapping[str, str], *, field: str,
                   timeout_s: float, stdin_eof: bool = True) -> list[str]:
    """Run an ``entrypoint.py ... --dry-run`` command and parse the argv it printed."""
    cmd, stdin = with_env(argv, env, stdin_eof=stdin_eof)
    res = await runner.run(cmd, timeout_s=timeout_s, input=stdin)
    if res.exit_code == 2 and not res.timed_out:
        msg = last_line(res.stderr) or res.describe()
        raise SpecError(field, msg.split(": error: ", 1)[-1])
    if not res.ok:
        raise WorkerStartError(f"the launch plan failed on {runner.label}: {describe_run(res, argv)}")
    line = last_line(res.stdout)
    if not line:
        raise WorkerStartError(f"the launch plan printed nothing on {runner.label}: {res.describe()}")
    return shlex.split(line)


def describe_run(res: CommandResult, argv: Sequence[str]) -> str:
    """Like CommandResult.describe, but naming the runtime command, not the env shim."""
    err = [ln for ln in res.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    how = "timed out" if res.timed_out else f"exit {res.exit_code}"
    return f"`{shlex.join(argv)[:300]}` {how}" + (f": {err[-1][:400]}" if err else "")
