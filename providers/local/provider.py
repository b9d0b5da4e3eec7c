"""The local provider: instances are capacity-accounted slices of this host.

A local instance reserves cpus and memory from the host (the sum over every live
instance, across processes, never exceeds the host); its sandboxes are containers on
this host labelled with the instance id, and terminating the instance removes them.
"""

from __future__ import annotations

from pathlib import Path

from flowmesh_sdk.config import home_dir
from flowmesh_sdk.errors import CapacityError, RuntimeMissingError, SpecError
from flowmesh_sdk.provider import LABEL_INSTANCE, Capabilities, Instance, LaunchRequest
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.remote.runtime import ContainerRuntime, RuntimeConfig
from flowmesh_sdk.specs import InstanceSpec, Offer

from .host import HostCapacity
from .records import RecordDir
from .slices import SlicedProvider


class LocalProvider(SlicedProvider):
    name = "local"
    region = "local"
    capabilities = Capabilities(spot=False, gpus=False, stop_start=False, max_batch=64, remote=False, free=True)

    def __init__(self, *, cpus: int | None = None, memory_gb: float | None = None,
                 state_dir: str | Path | None = None,
                 runtime_config: RuntimeConfig | None = None) -> None:
        host = HostCapacity.detect()
        if cpus is not None and (not isinstance(cpus, int) or cpus < 1):
            raise SpecError("local.cpus", f"must be an integer >= 1, got {cpus!r}")
        if memory_gb is not None and (not isinstance(memory_gb, (int, float)) or memory_gb <= 0):
            raise SpecError("local.memory_gb", f"must be a number > 0, got {memory_gb!r}")
        self.host = HostCapacity(cpus or host.cpus, float(memory_gb or host.memory_gb), host.arch)
        self._records = RecordDir(Path(state_dir) if state_dir else home_dir() / "local" / "instances")
        self._runner = LocalRunner()
        self._runtime = ContainerRuntime(self._runner, runtime_config)

    def __repr__(self) -> str:
        return f"LocalProvider(cpus={self.host.cpus}, memory_gb={self.host.memory_gb:g})"

    def _offer(self, spec: InstanceSpec) -> Offer:
        return Offer(provider="local", region="local", instance_type=f"local-{spec.cpus}c-{spec.memory_gb:g}g",
                     cpus=spec.cpus, memory_gb=spec.memory_gb, price_per_hour=0.0, arch=self.host.arch)

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        if (spec.cpus > self.host.cpus or spec.memory_gb > self.host.memory_gb or spec.gpus
                or spec.arch != self.host.arch):
            return []
        return [self._offer(spec)]

    def explain_misfit(self, spec: InstanceSpec) -> str:
        return (f"this host has {self.host.cpus} cpus, {self.host.memory_gb:g} GB memory, "
                f"no GPUs, arch {self.host.arch}; asked for {spec.cpus} cpus, "
                f"{spec.memory_gb:g} GB, {spec.gpus} GPUs, arch {spec.arch}")

    def _place(self, live: list[Instance], request: LaunchRequest) -> list[str | None]:
        spec = request.spec
        used_cpu = sum(i.spec.cpus for i in live)
        used_mem = sum(i.spec.memory_gb for i in live)
        need_cpu, need_mem = spec.cpus * request.count, spec.memory_gb * request.count
        if used_cpu + need_cpu > self.host.cpus or used_mem + need_mem > self.host.memory_gb + 1e-9:
            raise CapacityError(
                f"host full: {request.count} x ({spec.cpus} cpus, {spec.memory_gb:g} GB) asked, "
                f"{self.host.cpus - used_cpu} cpus and {self.host.memory_gb - used_mem:g} GB free "
                f"of {self.host.cpus} cpus / {self.host.memory_gb:g} GB "
                f"({len(live)} local instances live; `flowmesh gc` reclaims leftovers)",
                provider="local", code="HostCapacity")
        return [None] * request.count

    async def _remove_containers(self, instances: list[Instance]) -> None:
        wanted = {i.id for i in instances}
        try:  # one listing for the whole batch
            containers = [c.id for c in await self._runtime.list(label_keys=[LABEL_INSTANCE])
                          if c.labels.get(LABEL_INSTANCE) in wanted]
        except RuntimeMissingError:
            containers = []  # no container runtime here, so no containers to remove
        await self._runtime.remove(containers)

    def runner(self, instance: Instance) -> Runner:
        return self._runner
