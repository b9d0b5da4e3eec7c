"""An instance as a pool manages it: lifecycle, slots, image cache, warm sandboxes."""

from __future__ import annotations

import asyncio
import time

from ..lifecycle import InstanceState, Lifecycle, instance_lifecycle
from ..provider import Instance
from ..remote.runtime import ContainerRuntime
from ..sandbox import Sandbox
from ..specs import SandboxSpec

WarmKey = tuple[str, float, float, int, bool, str]


def warm_key(spec: SandboxSpec) -> WarmKey:
    """What a container fixes at creation (env and timeouts are per command)."""
    return (spec.image, spec.cpus, spec.memory_gb, spec.pids, spec.network, spec.workdir)


class ManagedInstance:
    def __init__(self, instance: Instance, runtime: ContainerRuntime, slots: int) -> None:
        self.instance = instance
        self.id = instance.id
        self.runtime = runtime
        self.slots = slots
        self.active = 0
        self.lifecycle: Lifecycle[InstanceState] = instance_lifecycle(instance.id)
        self.images: dict[str, str] = {}            # image reference -> digest held
        self.warm: dict[WarmKey, list[Sandbox]] = {}
        self.warming: dict[WarmKey, int] = {}
        self.last_used = time.monotonic()
        self._pulls: dict[str, asyncio.Task[str]] = {}

    def __repr__(self) -> str:
        return f"ManagedInstance({self.id} {self.state.value} {self.active}/{self.slots})"

    @property
    def state(self) -> InstanceState:
        return self.lifecycle.state

    @property
    def free(self) -> int:
        return self.slots - self.active if self.state is InstanceState.READY else 0

    def warm_count(self, key: WarmKey) -> int:
        return len(self.warm.get(key, ())) + self.warming.get(key, 0)

    def take_warm(self, key: WarmKey) -> Sandbox | None:
        stack = self.warm.get(key)
        while stack:
            sb = stack.pop()
            if not sb.closed:
                return sb
        return None

    def all_warm(self) -> list[Sandbox]:
        out = [sb for stack in self.warm.values() for sb in stack]
        self.warm.clear()
        return out

    async def ensure_image(self, image: str) -> str:
        """Make ``image`` present on this instance; concurrent callers share one pull."""
        if image in self.images:
            return self.images[image]
        task = self._pulls.get(image)
        if task is None:
            task = self._pulls[image] = asyncio.ensure_future(self.runtime.ensure_image(image))
            task.add_done_callback(lambda _t: self._pulls.pop(image, None))
        digest = await asyncio.shield(task)
        self.images[image] = digest
        return digest
