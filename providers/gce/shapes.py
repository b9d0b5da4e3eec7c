"""Compute Engine's shapes: the machine types ``machineTypes.list`` reports for a zone
(:func:`machine_types_of`), each an offer without a price (the fleet prices it from the
catalog), and the names they are known by (:func:`gpu_name`, :func:`region_of`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.specs import Offer

from .errors import PROVIDER

DEFAULT_MACHINE_TYPES: tuple[str, ...] = ("e2-standard-", "e2-highmem-", "n2-standard-", "n2-highmem-",
                                          "n2d-standard-", "c3-standard-", "c3d-standard-", "n4-standard-",
                                          "g2-standard-", "a2-highgpu-", "a2-ultragpu-", "a3-highgpu-")


def gpu_name(accelerator_type: str) -> str:
    """``nvidia-tesla-a100`` -> ``a100``, ``nvidia-l4`` -> ``l4``, ``nvidia-h100-80gb`` -> ``h100``."""
    name = accelerator_type.rsplit("/", 1)[-1].lower()
    for prefix in ("nvidia-tesla-", "nvidia-"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    return name.split("-", 1)[0]


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


@dataclass(frozen=True, slots=True)
class MachineType:
    name: str
    zone: str
    cpus: int
    memory_gb: float
    gpus: int
    gpu_type: str | None

    def offer(self) -> Offer | None:
        try:
            gpus = min(self.gpus, 16)
            return Offer(provider=PROVIDER, region=region_of(self.zone), zone=self.zone, instance_type=self.name,
                         cpus=max(1, self.cpus), memory_gb=self.memory_gb, price_per_hour=None, gpus=gpus,
                         gpu_name=gpu_name(self.gpu_type) if gpus and self.gpu_type else None, spot=False,
                         arch="arm64" if self.name.startswith(("t2a-", "c4a-", "n4a-")) else "x86_64",
                         source="GCE machineTypes.list")
        except SpecError:
            return None


def wanted(name: str, patterns: tuple[str, ...]) -> bool:
    """``name`` is one of ``patterns``, or starts with one ending in ``-``."""
    return any(name == t or (t.endswith("-") and name.startswith(t)) for t in patterns)


def machine_types_of(items: Iterable[Any], zone: str, patterns: tuple[str, ...]) -> list[MachineType]:
    """The machine types (``machineTypes.list`` items) of ``zone`` that ``patterns`` name,
    smallest first."""
    found = []
    for mt in items:
        if not wanted(mt.name, patterns):
            continue
        accs = list(mt.accelerators)
        gpus = sum(int(a.guest_accelerator_count) for a in accs)
        found.append(MachineType(mt.name, zone, int(mt.guest_cpus), round(int(mt.memory_mb) / 1024, 3),
                                 gpus, accs[0].guest_accelerator_type if accs else None))
    return sorted(found, key=lambda t: (t.cpus, t.memory_gb, t.name))


__all__ = ["DEFAULT_MACHINE_TYPES", "MachineType", "gpu_name", "machine_types_of", "region_of", "wanted"]
