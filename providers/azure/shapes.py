"""Azure's shapes: the VM sizes ``resourceSkus.list`` reports for a location (:func:`sizes_of`),
each an offer without a price (the fleet prices it from the catalog's ``azure`` rows), and the
SDK models read as their wire-format JSON (:func:`plain`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.specs import Offer

from .errors import PROVIDER

DEFAULT_VM_SIZES: tuple[str, ...] = ("Standard_D", "Standard_F", "Standard_E", "Standard_NC", "Standard_ND",
                                     "Standard_NV")
_GPU_MODELS = (("H100", "h100"), ("H200", "h200"), ("A100", "a100"), ("A10", "a10"), ("T4", "t4"),
               ("V100", "v100"), ("MI300", "mi300x"), ("L4", "l4"))


def gpu_model(size: str) -> str | None:
    """The GPU model a VM size's name says (``NC*T4`` -> t4, ``A100`` -> a100, ...), else None."""
    upper = size.upper()
    return next((name for token, name in _GPU_MODELS if token in upper), None)


def plain(model: Any) -> dict[str, Any]:
    """An SDK model as its wire-format JSON (the TypeSpec models are mappings of REST names)."""
    if isinstance(model, Mapping):
        return {k: plain(v) if isinstance(v, Mapping) else ([plain(x) if isinstance(x, Mapping) else x for x in v]
                                                           if isinstance(v, list) else v) for k, v in model.items()}
    return model.as_dict() if hasattr(model, "as_dict") else dict(model)


@dataclass(frozen=True, slots=True)
class VmSize:
    name: str
    location: str
    cpus: int
    memory_gb: float
    gpus: int
    arch: str

    def offer(self) -> Offer | None:
        try:
            gpus = min(self.gpus, 16)
            return Offer(provider=PROVIDER, region=self.location, zone=None, instance_type=self.name,
                         cpus=max(1, self.cpus), memory_gb=self.memory_gb, price_per_hour=None, gpus=gpus,
                         gpu_name=gpu_model(self.name) if gpus else None, spot=False, arch=self.arch,
                         source="Azure resourceSkus.list")
        except SpecError:
            return None


def sizes_of(skus: Iterable[Mapping[str, Any]], location: str, prefixes: tuple[str, ...]) -> list[VmSize]:
    """The ``virtualMachines`` SKUs of ``location`` whose names start with one of ``prefixes``
    and that carry no location restriction for this subscription, smallest first."""
    found = []
    for sku in skus:
        name = str(sku.get("name") or "")
        if sku.get("resourceType") != "virtualMachines" or not name.startswith(prefixes):
            continue
        if any(r.get("type") == "Location" for r in sku.get("restrictions") or []):
            continue   # NotAvailableForSubscription here
        caps = {c.get("name"): c.get("value") for c in sku.get("capabilities") or []}
        try:
            found.append(VmSize(name, location, int(caps.get("vCPUs") or 0),
                                float(caps.get("MemoryGB") or 0), int(caps.get("GPUs") or 0),
                                "arm64" if str(caps.get("CpuArchitectureType", "")).lower() == "arm64"
                                else "x86_64"))
        except ValueError:
            continue
    return sorted(found, key=lambda s: (s.cpus, s.memory_gb, s.name))


__all__ = ["DEFAULT_VM_SIZES", "VmSize", "gpu_model", "plain", "sizes_of"]
