"""ECS's shapes: what ``DescribeAvailableResource`` says is in stock (:func:`in_stock`) and
``DescribeInstanceTypes`` says each type is (:class:`InstanceType`, :func:`instance_type_of`),
offered without a price (the fleet prices each from the catalog).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.specs import Offer

from .errors import PROVIDER

# families searched by default: compute (c), general (g), memory (r) of recent generations,
# and the GPU families gn7i (A10) / gn6i (T4) / gn7 (A100)
DEFAULT_INSTANCE_TYPES: tuple[str, ...] = ("ecs.c8a.", "ecs.c8i.", "ecs.g8a.", "ecs.g8i.", "ecs.r8a.", "ecs.c7.",
                                           "ecs.g7.", "ecs.r7.", "ecs.gn7i-", "ecs.gn6i-", "ecs.gn7-")
IN_STOCK = ("WithStock", "ClosedWithStock")


def region_of_zone(zone: str) -> str:
    """``cn-hangzhou-h`` -> ``cn-hangzhou``."""
    return zone.rsplit("-", 1)[0]


def gpu_short(spec: str | None) -> str | None:
    """``NVIDIA A10`` -> ``a10``, ``NVIDIA T4`` -> ``t4``."""
    if not spec:
        return None
    words = spec.replace("NVIDIA", "").replace("Nvidia", "").split()
    return words[0].lower() if words else None


def wanted(name: str, patterns: tuple[str, ...]) -> bool:
    """``name`` is one of ``patterns``, or starts with one ending in ``.`` or ``-``."""
    return any(name == t or (t.endswith((".", "-")) and name.startswith(t)) for t in patterns)


@dataclass(frozen=True, slots=True)
class InstanceType:
    name: str
    cpus: int
    memory_gb: float
    gpus: int
    gpu_name: str | None
    arch: str

    def offer(self, region: str, zone: str, spot: bool) -> Offer | None:
        try:
            return Offer(provider=PROVIDER, region=region, zone=zone, instance_type=self.name, cpus=max(1, self.cpus),
                         memory_gb=self.memory_gb, price_per_hour=None, gpus=min(self.gpus, 16),
                         gpu_name=self.gpu_name if self.gpus else None, spot=spot, arch=self.arch,
                         source="ECS DescribeAvailableResource + DescribeInstanceTypes")
        except SpecError:
            return None


def instance_type_of(t: Any) -> InstanceType:
    """One ``DescribeInstanceTypes`` item."""
    gpus = int(t.gpuamount or 0)
    return InstanceType(str(t.instance_type_id), int(t.cpu_core_count or 0), float(t.memory_size or 0), gpus,
                        gpu_short(t.gpuspec) if gpus else None,
                        "arm64" if str(t.cpu_architecture or "").upper() == "ARM" else "x86_64")


def in_stock(body: Any, zones: Collection[str], patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (zone, type) pairs a ``DescribeAvailableResource`` answer has in stock, in ``zones``
    (all when empty), of the types ``patterns`` name."""
    out = []
    for z in (body.available_zones.available_zone or []) if body.available_zones else []:
        if zones and z.zone_id not in zones:
            continue
        if z.status != "Available" or z.status_category not in IN_STOCK:
            continue
        for res in (z.available_resources.available_resource or []) if z.available_resources else []:
            if res.type != "InstanceType" or not res.supported_resources:
                continue
            for s in res.supported_resources.supported_resource or []:
                if s.status == "Available" and s.status_category in IN_STOCK and wanted(str(s.value), patterns):
                    out.append((str(z.zone_id), str(s.value)))
    return out


__all__ = ["DEFAULT_INSTANCE_TYPES", "IN_STOCK", "InstanceType", "gpu_short", "in_stock", "instance_type_of",
           "region_of_zone", "wanted"]
