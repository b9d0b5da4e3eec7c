"""The acme provider: shapes from its price list, machines carved from this host."""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

from flowmesh_providers.local import LocalProvider

from flowmesh_sdk import settings
from flowmesh_sdk.config import home_dir
from flowmesh_sdk.errors import CapacityError
from flowmesh_sdk.provider import Capabilities, Instance, LaunchRequest
from flowmesh_sdk.specs import InstanceSpec, Offer

from .descriptor import DESCRIPTOR

PROFILE = DESCRIPTOR.profile
assert PROFILE is not None


def _types() -> dict[str, tuple[int, float, str]]:
    rows = csv.DictReader(resources.files(__package__).joinpath("catalog.csv").read_text().splitlines())
    return {r["instance_type"]: (int(r["vcpus"]), float(r["memory_gib"]),
                                 "arm64" if DESCRIPTOR.is_arm(r["instance_type"]) else "x86_64") for r in rows}


class AcmeProvider(LocalProvider):
    name = "acme"
    region = "acme-1"
    capabilities = Capabilities(spot=False, gpus=False, max_batch=PROFILE.max_batch, remote=False,
                                rates=PROFILE.rates)
    TYPES = _types()

    def __init__(self, *, cpus: int | None = None, memory_gb: float | None = None,
                 state_dir: str | Path | None = None) -> None:
        state = state_dir or settings.value("providers.acme.state_dir") or home_dir() / "acme" / "instances"
        super().__init__(cpus=cpus, memory_gb=memory_gb, state_dir=state)

    def __repr__(self) -> str:
        return f"AcmeProvider(cpus={self.host.cpus})"

    def _fitting(self, spec: InstanceSpec) -> list[Offer]:
        if spec.gpus or spec.cpus > self.host.cpus or spec.memory_gb > self.host.memory_gb:
            return []
        return [Offer(provider="acme", region=self.region, instance_type=t, cpus=c, memory_gb=m, arch=arch)
                for t, (c, m, arch) in sorted(self.TYPES.items(), key=lambda kv: kv[1][:2])
                if spec.cpus <= c <= self.host.cpus and spec.memory_gb <= m <= self.host.memory_gb
                and arch == spec.arch == self.host.arch]

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        return self._fitting(spec)      # shapes: the fleet prices them from acme's catalog

    def _offer(self, spec: InstanceSpec) -> Offer:
        return self._fitting(spec)[0]

    def _place(self, live: list[Instance], request: LaunchRequest) -> list[str | None]:
        try:
            return super()._place(live, request)
        except CapacityError as exc:
            raise CapacityError(f"acme-1 is sold out: {exc}", provider="acme", code="SoldOut") from exc
