"""EC2's shapes: what ``DescribeInstanceTypes`` and ``DescribeImages`` say, per region,
fetched once and cached (:class:`Shapes`), and the offers made of them.

Offers are shapes, not prices: one on-demand offer per instance type of the searched
families that fits, ``price_per_hour=None`` (the fleet prices it from the catalog), no
zone, smallest first (vCPUs, memory, name).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.specs import InstanceSpec, Offer

from .client import Ec2Client
from .errors import PROVIDER

TYPE_FILTER_CHUNK = 100            # instance-type filter values per DescribeInstanceTypes call


def chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    """``items`` in lists of at most ``size``."""
    for i in range(0, len(items), size):
        yield list(items[i:i + size])


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """What ``DescribeInstanceTypes`` says of one instance type."""

    name: str
    cpus: int
    memory_gb: float
    gpus: int
    gpu_name: str | None
    arch: str | None               # "x86_64" | "arm64" | None (neither: not offered)

    @classmethod
    def parse(cls, item: Mapping[str, Any]) -> TypeInfo:
        archs = (item.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
        arch = "arm64" if "arm64" in archs else "x86_64" if "x86_64" in archs else None
        gpus_info = (item.get("GpuInfo") or {}).get("Gpus") or []
        gpus = sum(int(g.get("Count") or 0) for g in gpus_info)
        gpu_name = next((str(g["Name"]).lower() for g in gpus_info if g.get("Name")), None)
        return cls(name=item["InstanceType"], cpus=int((item.get("VCpuInfo") or {}).get("DefaultVCpus") or 0),
                   memory_gb=round(int((item.get("MemoryInfo") or {}).get("SizeInMiB") or 0) / 1024, 3),
                   gpus=gpus, gpu_name=gpu_name if gpus else None, arch=arch)

    def spec(self, gpu_name: str | None = None) -> InstanceSpec | None:
        try:
            gpus = min(self.gpus, 16)
            return InstanceSpec(cpus=max(1, min(self.cpus, 1024)), memory_gb=self.memory_gb,
                                gpus=gpus, gpu_name=(gpu_name or self.gpu_name) if gpus else None,
                                arch=self.arch or "x86_64")
        except SpecError:
            return None


@dataclass(frozen=True, slots=True)
class ImageInfo:
    image_id: str
    arch: str | None
    root_device: str | None


class Shapes:
    """The instance types and AMIs one provider object has described, per region (each
    fetched once; a type EC2 does not have is remembered as None).  ``patterns`` are the
    searched families (``Ec2Provider(instance_types=...)``)."""

    def __init__(self, client: Ec2Client, patterns: tuple[str, ...]) -> None:
        self._client = client
        self.patterns = patterns
        self.types: dict[str, dict[str, TypeInfo | None]] = {}     # region -> name -> info (None: none)
        self._locks: dict[str, asyncio.Lock] = {}
        self.searched: dict[str, list[TypeInfo]] = {}              # region -> the searched families' types
        self._images: dict[tuple[str, str], ImageInfo] = {}

    def info(self, region: str, name: str) -> TypeInfo | None:
        """What is known of type ``name`` in ``region`` (None: not described, or no such type)."""
        return self.types.get(region, {}).get(name)

    async def _describe(self, region: str, names: list[str]) -> list[TypeInfo]:
        pages = await self._client.pages(region, "describe_instance_types",
                                         Filters=[{"Name": "instance-type", "Values": names}])
        return [TypeInfo.parse(item) for page in pages for item in page.get("InstanceTypes") or []]

    async def ensure(self, region: str, names: Iterable[str]) -> dict[str, TypeInfo | None]:
        """Type info for ``names`` in ``region`` (fetched once, cached; None: no such type)."""
        known = self.types.setdefault(region, {})
        lock = self._locks.setdefault(region, asyncio.Lock())
        async with lock:
            missing = sorted({n for n in names if n not in known})
            for chunk in chunks(missing, TYPE_FILTER_CHUNK):
                for info in await self._describe(region, chunk):
                    known[info.name] = info
                for name in chunk:
                    known.setdefault(name, None)
        return known

    async def region_shapes(self, region: str) -> list[TypeInfo]:
        """The types of :attr:`patterns` in ``region`` (one paginated
        ``DescribeInstanceTypes`` per 100 patterns, once per region; cached)."""
        lock = self._locks.setdefault(region, asyncio.Lock())
        async with lock:
            if region not in self.searched:
                found: dict[str, TypeInfo] = {}
                for chunk in chunks(list(self.patterns), TYPE_FILTER_CHUNK):
                    for info in await self._describe(region, chunk):
                        found[info.name] = info
                self.types.setdefault(region, {}).update(found)
                self.searched[region] = sorted(found.values(), key=lambda i: (i.cpus, i.memory_gb, i.name))
        return self.searched[region]

    async def region_offers(self, region: str, spec: InstanceSpec) -> list[Offer]:
        out = []
        for info in await self.region_shapes(region):
            if info.arch is None or info.cpus < 1 or info.memory_gb <= 0:
                continue
            offer = Offer(provider=PROVIDER, region=region, instance_type=info.name, cpus=info.cpus,
                          memory_gb=info.memory_gb, price_per_hour=None, gpus=info.gpus,
                          gpu_name=info.gpu_name if info.gpus else None, zone=None, spot=False, arch=info.arch,
                          source="EC2 DescribeInstanceTypes")
            if offer.fits(spec):
                out.append(offer)
        return out

    def explain_misfit(self, spec: InstanceSpec, regions: Sequence[str]) -> str:
        gpu = f", {spec.gpus} x {spec.gpu_name or 'any'} GPU" if spec.gpus else ""
        searched = ", ".join(self.patterns[:8]) + (", ..." if len(self.patterns) > 8 else "")
        known = {r: len(v) for r, v in self.searched.items() if r in regions}
        seen = ", ".join(f"{n} in {r}" for r, n in known.items()) or "none described yet"
        return (f"no EC2 instance type of the families searched ({searched}; types found: {seen}) in "
                f"{', '.join(regions)} has {spec.cpus} vCPUs, {spec.memory_gb:g} GiB{gpu}, arch {spec.arch}; "
                "Ec2Provider(instance_types=...) widens the search")

    async def image(self, region: str, ami: str) -> ImageInfo | None:
        """The AMI ``ami`` in ``region`` (``DescribeImages``, cached); None for a
        ``resolve:ssm:`` parameter (EC2 resolves it at launch); SpecError when it does not exist."""
        if ami.startswith("resolve:ssm:"):
            return None  # EC2 resolves it at launch; nothing to check here
        key = (region, ami)
        if key not in self._images:
            resp = await self._client.call(region, "describe_images", ImageIds=[ami])
            images = resp.get("Images") or []
            if not images:
                raise SpecError("ec2.image_id", f"AMI {ami} does not exist in {region} (or is not visible "
                                                "to this account)")
            img = images[0]
            self._images[key] = ImageInfo(ami, img.get("Architecture"), img.get("RootDeviceName"))
        return self._images[key]


__all__ = ["ImageInfo", "Shapes", "TYPE_FILTER_CHUNK", "TypeInfo", "chunks"]
