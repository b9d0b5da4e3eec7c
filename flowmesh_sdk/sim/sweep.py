"""``flowmesh cost simulate``: MegaFlow's experiment, replayed on the simulator for any
catalog provider -- the same batch at rising concurrency, distributed (one small
instance per task: ephemeral, or a prewarmed persistent pool) against centralized (big
machines running many tasks each), through the real pools on virtual time.

Per run it reports execution time (the makespan), dollars, and the per-phase breakdown
(queued, scheduling, environment startup, execution, teardown) that MegaFlow's paper does
not give.  The simulated cloud comes from the price catalog (instance types and prices)
and the provider's launch profile (:mod:`flowmesh_sdk.catalog.profiles`: published API
limits, assumed boot time); EC2 uses its full published API table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk import backends
from flowmesh_sdk.catalog import Catalog, CatalogRow
from flowmesh_sdk.catalog.profiles import profile
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.specs import PhaseTimings

from .cloud import SimCloud, SimInstanceType
from .scenario import SimResult, Workload, run_scenario

CONCURRENCY = (1, 10, 100, 1000, 10000)
SMALL_NIC_GBPS = 0.1      # MegaFlow: 100 Mbit/s dedicated to each small instance's task
BIG_NIC_GBPS = 1.0        # MegaFlow: 1 Gbit/s shared by the ~50 tasks of a big machine
BIG_CPUS = 32             # instances with at least this many vCPUs get the big NIC


@dataclass(frozen=True, slots=True)
class SweepConfig:
    label: str                 # "distributed ephemeral", "distributed persistent", "centralized"
    instance_type: str
    mode: str
    tasks_per_instance: int
    prewarmed: bool
    capacity: int | None = None   # most instances of this type the cloud has for us


@dataclass(frozen=True, slots=True)
class SweepRow:
    tasks: int
    config: SweepConfig
    result: SimResult | None      # None: more instances than the cloud has (capacity)

    @property
    def minutes(self) -> float | None:
        return self.result.makespan_s / 60 if self.result else None

    @property
    def cost(self) -> float | None:
        return self.result.cost_usd if self.result else None


def sim_type(row: CatalogRow, *, spot: bool = False, capacity: int | None = None) -> SimInstanceType:
    price = row.spot_per_hour if spot and row.spot_per_hour is not None else row.on_demand_per_hour
    if price is None:
        raise SpecError("price", f"{row.provider}/{row.region}/{row.instance_type} has no "
                                 f"{'spot' if spot else 'on-demand'} price; give --price "
                                 f"{row.instance_type}=USD")
    return SimInstanceType(row.instance_type, max(1, int(row.cpus)), row.memory_gb, price,
                           nic_gbps=BIG_NIC_GBPS if row.cpus >= BIG_CPUS else SMALL_NIC_GBPS,
                           capacity=capacity if capacity is not None else 1_000_000)


def default_provider() -> str:
    """The cloud ``flowmesh cost simulate`` plays when none is named: the catalog provider
    whose launch profile publishes the fullest API table (MegaFlow's experiment ran on a
    public cloud; the one whose limits are documented call by call is the best model of it)."""
    names = backends.catalog_providers()
    if not names:
        raise SpecError("--provider", "no installed provider ships a price catalog")
    return max(sorted(names), key=lambda n: len(profile(n).rates))


def cloud_for(provider: str, region: str, types: Sequence[SimInstanceType], **kw: Any) -> SimCloud:
    """A simulated ``provider``/``region`` with its profile's API limits (the provider
    client's whole table) and its assumed boot time."""
    prof = profile(provider)
    rates: tuple[ApiRate, ...] = prof.rates
    notes = (f"API limits: {prof.rates_source}", f"boot: {prof.boot_source}")
    return SimCloud(name=provider, region=region, types=tuple(types), rates=rates, max_batch=prof.max_batch,
                    boot_median_s=prof.boot_s, boot_p90_s=prof.boot_s * 1.75, notes=notes,
                    **kw)


def pick_rows(catalog: Catalog, provider: str, region: str | None, small: str | None,
              big: str | None) -> tuple[str, CatalogRow, CatalogRow]:
    """The region and the two instance types: ``small`` (default: the cheapest with 8 vCPUs
    and 16 GiB, MegaFlow's distributed shape) and ``big`` (default: the most vCPUs)."""
    rows = [r for r in catalog.rows if r.provider == provider and not r.gpus
            and (region is None or r.region == region)]
    if not rows:
        raise SpecError("--region" if region else "--provider",
                        f"no CPU instance of {provider!r}{f' in {region!r}' if region else ''} in the catalog")
    region = region or min(rows, key=lambda r: (r.on_demand_per_hour is None, r.region)).region
    rows = [r for r in rows if r.region == region]

    def named(name: str, flag: str) -> CatalogRow:
        for r in rows:
            if r.instance_type == name:
                return r
        raise SpecError(flag, f"{name!r} is not in the catalog for {provider}/{region}")

    if small:
        s = named(small, "--instance")
    else:
        fits = [r for r in rows if r.cpus >= 8 and r.memory_gb >= 16 and r.on_demand_per_hour is not None]
        if not fits:
            raise SpecError("--instance", f"no priced 8 vCPU / 16 GiB type in {provider}/{region}")
        s = min(fits, key=lambda r: (r.on_demand_per_hour, r.cpus))
    b = named(big, "--centralized") if big else max(rows, key=lambda r: (r.cpus, r.memory_gb))
    return region, s, b


def run_sweep(cloud: SimCloud, configs: Sequence[SweepConfig], concurrency: Sequence[int], *,
              minutes: float, image_gb: float, seed: int = 0,
              progress: Callable[[int, SweepConfig, SweepRow], None] | None = None) -> list[SweepRow]:
    rows: list[SweepRow] = []
    for n in concurrency:
        for cfg in configs:
            per = cfg.tasks_per_instance
            need = -(-n // per)
            if cfg.capacity is not None and need > cfg.capacity:
                row = SweepRow(n, cfg, None)
            else:
                w = Workload(tasks=n, minutes=minutes, instance_type=cfg.instance_type, mode=cfg.mode,
                             tasks_per_instance=per, image_gb=image_gb, prewarmed=cfg.prewarmed)
                row = SweepRow(n, cfg, run_scenario(cloud, w, seed=seed))
            rows.append(row)
            if progress is not None:
                progress(n, cfg, row)
    return rows


def plot(rows: Sequence[SweepRow], path: str, title: str) -> None:
    """Execution time and cost against concurrency, one line per configuration (log x)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_c) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = list(dict.fromkeys(r.config.label for r in rows))
    for label in labels:
        pts = [(r.tasks, r.minutes, r.cost) for r in rows if r.config.label == label and r.result]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax_t.plot(xs, [p[1] for p in pts], marker="o", label=label)
        ax_c.plot(xs, [p[2] for p in pts], marker="o", label=label)
        cut = [r.tasks for r in rows if r.config.label == label and r.result is None]
        if cut:
            ax_t.axvline(min(cut), linestyle=":", color="grey")
            ax_t.text(min(cut), 0.5, f"{label}: no capacity from {min(cut):,} tasks ", rotation=90,
                      transform=ax_t.get_xaxis_transform(), ha="right", va="center", fontsize=7, color="grey")
    for ax, ylabel in ((ax_t, "execution time, first submit to last result (min)"),
                       (ax_c, "cost (USD)")):
        ax.set_xscale("log")
        ax.set_xlabel("concurrent tasks")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_c.set_yscale("log")
    ax_t.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def phases_minutes(p: PhaseTimings) -> tuple[float, float, float, float, float]:
    return (p.queued / 60, p.scheduling / 60, p.env_startup / 60, p.execution / 60, p.teardown / 60)
