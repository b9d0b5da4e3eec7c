"""What a simulated cloud is like: its instance types, how long a VM takes to boot, its
API rate limits, its capacity, its spot interruptions and its network.

Figures with a published source carry it; the others are assumptions, named as such,
that the caller can change (``flowmesh cost simulate`` prints the profile it used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.catalog.records import CatalogRow
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.specs import check_number

GBIT = 1e9 / 8   # bytes per second in one Gbit/s


@dataclass(frozen=True, slots=True)
class SimInstanceType:
    name: str
    cpus: int
    memory_gb: float
    price_per_hour: float
    spot_price_per_hour: float | None = None
    nic_gbps: float = 0.1          # MegaFlow's 100 Mbit/s per small instance
    capacity: int = 1_000_000      # most live instances of this type the region has for us

    def __post_init__(self) -> None:
        check_number(f"sim.types[{self.name}].cpus", self.cpus, lo=1, integer=True)
        check_number(f"sim.types[{self.name}].price_per_hour", self.price_per_hour, lo=0)
        if self.spot_price_per_hour is not None:
            check_number(f"sim.types[{self.name}].spot_price_per_hour", self.spot_price_per_hour, lo=0)
        check_number(f"sim.types[{self.name}].nic_gbps", self.nic_gbps, lo=0, lo_open=True)
        check_number(f"sim.types[{self.name}].capacity", self.capacity, lo=0, integer=True)


@dataclass(frozen=True, slots=True)
class SimCloud:
    """A simulated provider+region.

    ``boot_median_s``/``boot_p90_s`` define a lognormal time from the launch call to the
    VM answering; ``rates`` and ``max_batch`` are the API's limits (EC2's are published,
    see :func:`ec2`); ``spot_interruptions_per_hour`` is a Poisson rate per spot
    instance; ``registry_egress_gbps`` caps the registry's total egress (None: unlimited);
    ``billing_min_s`` is the shortest billed period; ``sticky_terminations`` is how many
    terminate calls an instance survives before one takes effect (0: at once; a cloud
    whose terminations are slow or lost, for "terminate is retried until gone").

    The prices of the types are what the simulated cloud bills.  Its provider reports
    shapes only, as every cloud provider does; a fleet over it prices them from
    :meth:`catalog` (``Fleet(catalog=cloud.catalog())``), the one source of prices.
    """

    name: str
    region: str
    types: tuple[SimInstanceType, ...]
    boot_median_s: float = 40.0
    boot_p90_s: float = 70.0
    rates: tuple[ApiRate, ...] = ()
    max_batch: int = 1000
    spot_interruptions_per_hour: float = 0.0
    registry_egress_gbps: float | None = None
    container_start_s: float = 0.5
    billing_min_s: float = 60.0
    notes: tuple[str, ...] = field(default=())
    sticky_terminations: int = 0

    def __post_init__(self) -> None:
        if not self.types:
            raise SpecError("sim.types", "a simulated cloud needs at least one instance type")
        check_number("sim.boot_median_s", self.boot_median_s, lo=0, lo_open=True)
        check_number("sim.boot_p90_s", self.boot_p90_s, lo=self.boot_median_s)
        check_number("sim.max_batch", self.max_batch, lo=1, integer=True)
        check_number("sim.spot_interruptions_per_hour", self.spot_interruptions_per_hour, lo=0)
        if self.registry_egress_gbps is not None:
            check_number("sim.registry_egress_gbps", self.registry_egress_gbps, lo=0, lo_open=True)
        check_number("sim.sticky_terminations", self.sticky_terminations, lo=0, hi=1_000_000, integer=True)

    @property
    def boot_sigma(self) -> float:
        """The lognormal's sigma from its median and 90th percentile (z(0.9) = 1.2816)."""
        return math.log(self.boot_p90_s / self.boot_median_s) / 1.2815515655446004

    def type(self, name: str) -> SimInstanceType:
        for t in self.types:
            if t.name == name:
                return t
        raise SpecError("sim.instance_type", f"{name!r} is not one of {[t.name for t in self.types]}")

    def billed_price(self, name: str, spot: bool) -> float:
        """What the cloud bills per hour for one instance of ``name`` in that market (a
        spot instance of a type without a spot price pays on-demand)."""
        t = self.type(name)
        return t.spot_price_per_hour if spot and t.spot_price_per_hour is not None else t.price_per_hour

    def catalog_rows(self) -> tuple[CatalogRow, ...]:
        """One catalog row per instance type: this cloud's on-demand and spot price for
        it, ``source`` "simulated" (a name given twice: its first type, as :meth:`type`)."""
        first = {t.name: t for t in reversed(self.types)}
        return tuple(CatalogRow(provider=self.name, region=self.region, instance_type=t.name, cpus=t.cpus,
                                memory_gb=t.memory_gb, on_demand_per_hour=t.price_per_hour,
                                spot_per_hour=t.spot_price_per_hour, source="simulated")
                     for t in self.types if first[t.name] is t)

    def catalog(self) -> Catalog:
        """:meth:`catalog_rows` as a :class:`~flowmesh_sdk.catalog.Catalog` (for
        ``Fleet(catalog=...)``)."""
        return sim_catalog(self)


def sim_catalog(*clouds: SimCloud) -> Catalog:
    """The price catalog of one or more simulated clouds: every row of each
    :meth:`SimCloud.catalog_rows`."""
    return Catalog([row for cloud in clouds for row in cloud.catalog_rows()])


def unlimited(name: str, types: tuple[SimInstanceType, ...], region: str = "sim-1",
              **kw: Any) -> SimCloud:
    """A cloud without client-side API limits (for providers whose limits are not
    published per call, and for lower-bound experiments)."""
    return SimCloud(name=name, region=region, types=types,
                    notes=("API limits: none modelled (assumption)",), **kw)
