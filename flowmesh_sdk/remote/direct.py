"""Instances that are containers: the sandbox *is* the instance.

A Kubernetes pod or a Vast.ai instance is itself a container, started from the task's image
by the platform (the kubelet, Vast's host).  No container runtime runs inside it and none is
needed: :class:`InstanceRuntime` gives a sandbox the face of a
:class:`~flowmesh_sdk.remote.runtime.ContainerRuntime` whose one container is the instance,
reached through the instance's runner (an exec stream into the pod, SSH into the Vast
container).  ``create`` hands out the instance once, ``open_shell``/``open_tty``/``exec_once``
run in it through the runner, ``remove`` is a no-op (the pool terminates the instance,
which is the container), and there is no image store: the instance was launched from the
image (:attr:`~flowmesh_sdk.provider.LaunchRequest.container`).  What needs a runtime on a
machine -- snapshots (``commit``), pulls, listing containers -- raises a
:class:`~flowmesh_sdk.errors.ContainerRuntimeError` that says why.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from ..errors import ContainerRuntimeError
from ..specs import SandboxSpec
from .runner import Channel, CommandResult, Runner
from .runtime import ContainerInfo, ContainerRuntime, RuntimeConfig, RuntimeInfo

#: RuntimeInfo.binary of an instance that is its own container
NO_RUNTIME = "none"


class InstanceRuntime(ContainerRuntime):
    """The one container of an instance that is a container (see the module docstring)."""

    def __init__(self, runner: Runner, instance_id: str, image: str | None = None,
                 config: RuntimeConfig | None = None) -> None:
        super().__init__(runner, config)
        self.instance_id = instance_id
        self.image = image
        self._taken = False

    def _refuse(self, what: str) -> ContainerRuntimeError:
        return ContainerRuntimeError(f"{what} needs a container runtime on the machine, and instance "
                                     f"{self.instance_id} is itself a container ({self.runner.label}); "
                                     "use a provider whose instances are machines")

    async def probe(self) -> RuntimeInfo:
        return RuntimeInfo(NO_RUNTIME, "", "", ())

    async def image_inspect(self, image: str) -> tuple[str, str] | None:
        return None

    async def pull(self, ref: str, *, tls_verify: bool = True, authfile: str | None = None) -> bool:
        raise self._refuse("pulling an image")

    async def commit_and_push(self, container: str, local: str, remote: str, *,
                              tls_verify: bool = True) -> str:
        raise self._refuse("a snapshot")

    async def remove_image(self, ref: str) -> bool:
        return False

    async def create(self, name: str, spec: SandboxSpec, labels: Mapping[str, str], *,
                     image: str | None = None) -> str:
        """The instance, once: it was launched from ``image`` for this sandbox."""
        if self._taken:
            raise ContainerRuntimeError(f"instance {self.instance_id} is a container and holds one sandbox, "
                                        "which it already has")
        if image is not None and self.image is not None and image != self.image:
            raise ContainerRuntimeError(f"instance {self.instance_id} runs {self.image}, not {image}: "
                                        "an instance that is a container runs the image it was launched with")
        self._taken = True
        return self.instance_id

    async def start(self, name: str, spec: SandboxSpec, labels: Mapping[str, str], *,
                    image: str | None = None) -> tuple[str, Channel | None]:
        """:meth:`create`; no channel comes with it (the instance was started by its platform)."""
        return await self.create(name, spec, labels, image=image), None

    async def open_shell(self, container: str, argv: Sequence[str] = ("/bin/sh",)) -> Channel:
        return await self.runner.open_channel(list(argv))

    async def open_tty(self, container: str, argv: Sequence[str]) -> Channel:
        return await self.runner.open_channel(["script", "-qfc", shlex.join(argv), "/dev/null"])

    async def exec_once(self, container: str, argv: Sequence[str], *, input: bytes | None = None,
                        timeout_s: float | None = None) -> CommandResult:
        return await self.runner.run(list(argv), timeout_s=timeout_s or self.config.command_timeout_s, input=input)

    async def remove(self, containers: Sequence[str]) -> None:
        return None   # the pool terminates the instance, which is the container

    async def list(self, labels: Mapping[str, str] | None = None,
                   label_keys: Sequence[str] = ()) -> list[ContainerInfo]:
        return []
