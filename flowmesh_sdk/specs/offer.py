"""One purchasable instance shape: :class:`Offer`."""

from __future__ import annotations

from dataclasses import dataclass

from .checks import check_number
from .instance import InstanceSpec


@dataclass(frozen=True, slots=True)
class Offer:
    """One purchasable instance shape: provider x region x type x (spot|on-demand)."""

    provider: str
    region: str
    instance_type: str
    cpus: int
    memory_gb: float
    # $/h of one instance.  A cloud provider reports shapes only (None): the fleet prices
    # them from the catalog, the one source of prices.  A provider whose machines cost the
    # SDK nothing (``Capabilities.free``: this host, the user's own machines) says 0.0.
    price_per_hour: float | None = None
    gpus: int = 0
    gpu_name: str | None = None
    zone: str | None = None
    spot: bool = False
    arch: str = "x86_64"
    # From the price catalog (flowmesh_sdk.catalog.CatalogRow.offer): total GPU memory,
    # where the price came from, and when it was fetched (ISO date); empty when unknown.
    gpu_memory_gb: float | None = None
    source: str = ""
    fetched_at: str | None = None
    # A marketplace machine (Vast.ai): its offer id to rent and the host's reliability in
    # (0, 1]; ``available``: how many of this offer can be had now (None: not limited).
    offer_id: str | None = None
    reliability: float | None = None
    available: int | None = None

    def __post_init__(self) -> None:
        if self.price_per_hour is not None:
            check_number("offer.price_per_hour", self.price_per_hour, lo=0)
        if self.reliability is not None:
            check_number("offer.reliability", self.reliability, lo=0, hi=1, lo_open=True)
        if self.available is not None:
            check_number("offer.available", self.available, lo=0, integer=True)

    @property
    def key(self) -> str:
        """``provider/region[/zone]/type[ spot]``: how decisions and events name an offer."""
        where = f"{self.region}/{self.zone}" if self.zone else self.region
        return f"{self.provider}/{where}/{self.instance_type}{' spot' if self.spot else ''}"

    def fits(self, spec: InstanceSpec) -> bool:
        return (self.cpus >= spec.cpus and self.memory_gb + 1e-9 >= spec.memory_gb
                and self.gpus >= spec.gpus and self.arch == spec.arch
                and (spec.gpu_name is None
                     or (self.gpu_name or "").lower() == spec.gpu_name.lower()))
