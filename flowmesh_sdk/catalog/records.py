"""One row of a price catalog, and how it becomes the :class:`~flowmesh_sdk.specs.Offer`
the provisioner launches.

A :class:`CatalogRow` is one instance *shape* in one place (provider x region x zone x
instance type) with the prices of its two markets: on-demand and spot (for Vast.ai,
"spot" is the interruptible, bid-priced market).  An :class:`Offer` is one purchasable
market of that shape, so a row turns into at most two offers (:meth:`CatalogRow.offers`);
a market without a price turns into none -- prices are never guessed.  The fields the
two records share are validated here, once, and :class:`Offer` carries the row's
``gpu_memory_gb``, ``source`` and ``fetched_at`` so nothing is lost in the conversion.

Provider names are the SDK's; each provider's descriptor (:mod:`flowmesh_sdk.backends`)
names the other spellings the shared price data uses (``aws`` for ``ec2``, ``gcp`` for
``gce``), accepted when a file is read, and its instance types' Arm naming convention.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

from .. import backends
from ..errors import SpecError
from ..specs import ARCHES, Offer

MARKETS = ("on-demand", "spot")


def canonical_provider(name: str) -> str:
    return backends.canonical(name)


def infer_arch(provider: str, instance_type: str) -> str:
    """``arm64`` when the provider's naming convention marks the type as Arm, else x86_64
    (the shared snapshots carry no architecture column; a descriptor's ``arm_types``)."""
    d = backends.find(provider)
    return "arm64" if d is not None and d.is_arm(instance_type) else "x86_64"


def __getattr__(name: str) -> object:
    if name == "PROVIDERS":   # kept for one release: flowmesh_sdk.backends.catalog_providers()
        return backends.catalog_providers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_GPU_JUNK = re.compile(r"[^a-z0-9]+")
_GPU_MEM = re.compile(r"[\s_-]+\d+\s*gb$")
_GPU_PREFIX = ("nvidia", "tesla", "geforce")


def gpu_key(name: str | None) -> str | None:
    """A GPU model name normalised for matching across providers.

    Lower case, punctuation and spaces dropped, vendor words (NVIDIA, Tesla, GeForce)
    and a trailing memory size dropped: ``"A100-80GB"`` and ``"A100"`` are both
    ``"a100"``; ``"RTX 4090"`` and ``"RTX_4090"`` are ``"rtx4090"``; ``"H100 NVL"`` is
    ``"h100nvl"``.  Memory is matched separately (the VRAM gate), never by name.
    """
    if not name:
        return None
    key = _GPU_JUNK.sub("", _GPU_MEM.sub("", name.lower().strip()))
    for prefix in _GPU_PREFIX:
        key = key.removeprefix(prefix)
    return key or None


def parse_date(value: str | None, field: str) -> str | None:
    """Validate an ISO date (``YYYY-MM-DD``, or a full ISO timestamp) and return it as given."""
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    try:
        if len(text) == 10:
            dt.date.fromisoformat(text)
        else:
            dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(field, f"must be an ISO date such as 2026-07-20, got {text!r}") from None
    return text


def as_date(value: str | None) -> dt.date | None:
    if not value:
        return None
    return dt.date.fromisoformat(value[:10])


def _price(field: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(field, f"must be a finite number of USD per hour, got {value!r}")
    if value < 0:
        raise SpecError(field, f"must be >= 0 USD per hour, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class CatalogRow:
    """An instance shape in one place and the $/h of its markets (``None``: no price known).

    ``cpus`` may be fractional (GCE shared-core ``e2-micro`` is 0.25 vCPU).
    ``gpu_memory_gb`` is the total over the instance's GPUs.  ``reliability`` is a
    marketplace host's reliability in [0, 1] (Vast.ai's ``reliability2``); ``available``
    caps how many of this row can be had (a Vast offer is one machine), ``None`` when
    the provider does not say.  ``source`` names where the figures came from and
    ``fetched_at`` when (ISO date or timestamp; ``None`` when the source is undated).
    """

    provider: str
    region: str
    instance_type: str
    cpus: float
    memory_gb: float
    on_demand_per_hour: float | None
    spot_per_hour: float | None = None
    gpus: int = 0
    gpu_name: str | None = None
    gpu_memory_gb: float | None = None
    zone: str | None = None
    arch: str = "x86_64"
    source: str = ""
    fetched_at: str | None = None
    reliability: float | None = None
    available: int | None = None

    def __post_init__(self) -> None:
        provider = canonical_provider(self.provider)
        if not provider or not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", provider):
            raise SpecError("provider", f"must be a provider name such as {', '.join(backends.catalog_providers())}; "
                                        f"got {self.provider!r}")
        object.__setattr__(self, "provider", provider)
        for name in ("region", "instance_type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise SpecError(name, f"must be a non-empty string, got {value!r}")
            object.__setattr__(self, name, value.strip())
        for name, lo in (("cpus", 0.0), ("memory_gb", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= lo:
                raise SpecError(name, f"must be a number > 0, got {value!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 0 <= self.gpus <= 64:
            raise SpecError("gpus", f"must be an integer in [0, 64], got {self.gpus!r}")
        if self.gpu_memory_gb is not None and (not isinstance(self.gpu_memory_gb, (int, float))
                                               or not math.isfinite(self.gpu_memory_gb)
                                               or self.gpu_memory_gb <= 0):
            raise SpecError("gpu_memory_gb", f"must be a number > 0 or empty, got {self.gpu_memory_gb!r}")
        object.__setattr__(self, "on_demand_per_hour", _price("on_demand_per_hour", self.on_demand_per_hour))
        object.__setattr__(self, "spot_per_hour", _price("spot_per_hour", self.spot_per_hour))
        if self.arch not in ARCHES:
            raise SpecError("arch", f"must be one of {', '.join(ARCHES)}; got {self.arch!r}")
        if self.reliability is not None and (not isinstance(self.reliability, (int, float))
                                             or not 0 < self.reliability <= 1):
            raise SpecError("reliability", f"must be in (0, 1], got {self.reliability!r}")
        if self.available is not None and (isinstance(self.available, bool)
                                           or not isinstance(self.available, int) or self.available < 0):
            raise SpecError("available", f"must be an integer >= 0 or empty, got {self.available!r}")
        object.__setattr__(self, "fetched_at", parse_date(self.fetched_at, "fetched_at"))
        if self.zone is not None and not str(self.zone).strip():
            object.__setattr__(self, "zone", None)
        if self.gpu_name is not None and not str(self.gpu_name).strip():
            object.__setattr__(self, "gpu_name", None)

    # ---- derived --------------------------------------------------------------------
    @property
    def key(self) -> str:
        """``provider/region[/zone]/instance_type``: how the CLI and the bidder name a row."""
        where = f"{self.region}/{self.zone}" if self.zone else self.region
        return f"{self.provider}/{where}/{self.instance_type}"

    @property
    def gpu_model(self) -> str | None:
        return gpu_key(self.gpu_name)

    def price(self, market: str) -> float | None:
        """The listed $/h of ``market`` (``on-demand`` or ``spot``), or ``None``."""
        if market == "on-demand":
            return self.on_demand_per_hour
        if market == "spot":
            return self.spot_per_hour
        raise SpecError("market", f"must be one of {', '.join(MARKETS)}; got {market!r}")

    def offer(self, market: str = "on-demand") -> Offer | None:
        """The :class:`Offer` of one market, or ``None`` when that market has no price or
        the shape has less than one whole vCPU (an Offer counts whole vCPUs)."""
        price = self.price(market)
        if price is None or self.cpus < 1:
            return None
        return Offer(provider=self.provider, region=self.region, instance_type=self.instance_type,
                     cpus=int(self.cpus), memory_gb=float(self.memory_gb), price_per_hour=price,
                     gpus=self.gpus, gpu_name=self.gpu_name if self.gpus else None, zone=self.zone,
                     spot=market == "spot", arch=self.arch, gpu_memory_gb=self.gpu_memory_gb,
                     source=self.source, fetched_at=self.fetched_at, reliability=self.reliability,
                     available=self.available)

    def offers(self) -> list[Offer]:
        """One :class:`Offer` per priced market (on-demand first)."""
        return [o for o in (self.offer("on-demand"), self.offer("spot")) if o is not None]

    @classmethod
    def from_offer(cls, offer: Offer) -> CatalogRow:
        """The row of a provider's live :class:`Offer` (its one market priced, the other not)."""
        return cls(provider=offer.provider, region=offer.region, instance_type=offer.instance_type,
                   cpus=offer.cpus, memory_gb=offer.memory_gb,
                   on_demand_per_hour=None if offer.spot else offer.price_per_hour,
                   spot_per_hour=offer.price_per_hour if offer.spot else None,
                   gpus=offer.gpus, gpu_name=offer.gpu_name, gpu_memory_gb=offer.gpu_memory_gb,
                   zone=offer.zone, arch=offer.arch, source=offer.source, fetched_at=offer.fetched_at,
                   reliability=offer.reliability, available=offer.available)


__all__ = ["CatalogRow", "MARKETS", "as_date", "canonical_provider",
           "gpu_key", "infer_arch", "parse_date"]
