"""Feasibility gates: which (row, market) offers can serve a demand at all, and an account
of which gate removed how many -- so "no offer" always says why.

Gates run in this order; an offer is counted against the first gate it fails:

==========  ======================================================================
price       the market asked for has a price (a missing price is never guessed)
cpus        vCPUs >= the sandbox's cpus
memory      memory >= the sandbox's memory
gpus        GPU count >= the worker's GPUs
gpu_host    a CPU-only demand does not take GPU instances (unless ``gpu_hosts``)
gpu_model   the GPU model matches ``gpu_name`` (A100-80GB matches A100)
vram        GPU memory of one worker's GPUs >= model weights + KV cache
gpu_spec    the GPU is in the spec table (needed for a model's throughput)
arch        architecture matches (``None`` in the demand: any)
max_price   listed $/h per instance <= ``max_price``
provider    provider in the demand's allow-list
region      region in the demand's allow-list
affinity    the tenant's :class:`TenantAffinity` allows provider and region
capacity    the offer is not known to be sold out (``available`` = 0)
==========  ======================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..catalog.gpus import gpu_spec
from ..catalog.records import CatalogRow, gpu_key
from ..errors import FlowMeshError, SpecError
from .demand import Demand, TenantAffinity, check_demand

GATES = ("price", "cpus", "memory", "gpus", "gpu_host", "gpu_model", "vram", "gpu_spec", "arch", "max_price",
         "provider", "region", "affinity", "capacity")


@dataclass(frozen=True, slots=True)
class GateResult:
    """One gate's effect: how many offers it removed, what it requires, a few examples."""

    gate: str
    removed: int
    requirement: str
    examples: tuple[str, ...] = ()

    def __str__(self) -> str:
        ex = f" (e.g. {', '.join(self.examples)})" if self.examples else ""
        return f"{self.gate}: removed {self.removed} -- {self.requirement}{ex}"


class NoFeasibleOffer(FlowMeshError):
    """No offer in the catalog passes the feasibility gates; ``gates`` says which gate
    removed how many (the message lists every gate that removed something)."""

    def __init__(self, what: str, considered: int, gates: Sequence[GateResult]) -> None:
        self.considered = considered
        self.gates = tuple(gates)
        hit = [g for g in self.gates if g.removed]
        detail = "; ".join(str(g) for g in hit) if hit else "the catalog has no rows for it"
        super().__init__(f"no feasible offer for {what}: {considered} offer(s) considered; {detail}")


@dataclass(slots=True)
class Feasible:
    """The offers that passed, as parallel lists (cheap to build for 10,000 rows)."""

    rows: list[CatalogRow]
    markets: list[str]
    slots: np.ndarray          # sandboxes (or workers) per instance, >= 1
    considered: int
    gates: tuple[GateResult, ...]


def _label(row: CatalogRow, market: str) -> str:
    return f"{row.key} ({market})"


def requirements(demand: Demand, affinity: TenantAffinity | None) -> dict[str, str]:
    model = demand.model
    return {
        "price": f"a price for {' or '.join(demand.markets)} (missing prices are excluded, not guessed)",
        "cpus": f"vCPUs >= {demand.cpus:g} per sandbox",
        "memory": f"memory >= {demand.memory_gb:g} GB per sandbox",
        "gpus": f"GPUs >= {demand.gpus} per worker",
        "gpu_host": ("GPU instances allowed" if demand.gpu_hosts or demand.gpus else
                     "no GPU instance for CPU-only sandboxes (Demand.gpu_hosts / --gpu-hosts allows them)"),
        "gpu_model": f"GPU model {demand.gpu_name}" if demand.gpu_name else "any GPU model",
        "vram": (f"GPU memory of {demand.gpus} GPU(s) >= {model.vram_gb:g} GB "
                 f"(weights {model.weights_gb:g} + KV cache {model.kv_cache_gb:g})") if model else "no model",
        "gpu_spec": "a GPU with a known bandwidth/FLOPS spec (catalog.gpus)" if model else "no model",
        "arch": f"arch {demand.arch}" if demand.arch else "any arch",
        "max_price": f"listed price <= ${demand.max_price:g}/h" if demand.max_price else "no price cap",
        "provider": f"provider in {', '.join(demand.providers)}" if demand.providers else "any provider",
        "region": f"region in {', '.join(demand.regions)}" if demand.regions else "any region",
        "affinity": (f"tenant {affinity.tenant!r} allows providers {', '.join(affinity.providers) or 'any'}, "
                     f"regions {', '.join(affinity.regions) or 'any'}") if affinity else "no tenant rule",
        "capacity": "not sold out (available > 0)",
    }


def check_rows(rows: object) -> None:
    """SpecError unless ``rows`` is a sequence of :class:`CatalogRow` (a catalog's rows)."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise SpecError("rows", f"must be a sequence of catalog rows (Catalog.rows), got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, CatalogRow):
            raise SpecError(f"rows[{i}]", f"must be a CatalogRow, got {type(row).__name__}")


def check(rows: Sequence[CatalogRow], demand: Demand,
          affinities: Mapping[str, TenantAffinity] | None = None) -> Feasible:
    """Run every gate over every (row, market) of ``rows``."""
    check_demand(demand)
    check_rows(rows)
    if affinities is not None and not isinstance(affinities, Mapping):
        raise SpecError("affinities", f"must be a mapping of tenant -> TenantAffinity, got "
                                      f"{type(affinities).__name__}")
    affinity = (affinities or {}).get(demand.tenant)
    if affinity is not None and not isinstance(affinity, TenantAffinity):
        raise SpecError(f"affinities[{demand.tenant!r}]", f"must be a TenantAffinity, got {affinity!r}")
    removed = dict.fromkeys(GATES, 0)
    examples: dict[str, list[str]] = {g: [] for g in GATES}
    out_rows: list[CatalogRow] = []
    out_markets: list[str] = []
    want_gpu = gpu_key(demand.gpu_name) if demand.gpu_name else None
    model = demand.model
    providers = set(demand.providers)
    regions = set(demand.regions)
    cpus, mem, gpus, arch, cap = demand.cpus, demand.memory_gb, demand.gpus, demand.arch, demand.max_price
    markets = demand.markets
    gpu_hosts = demand.gpu_hosts
    considered = 0

    def drop(gate: str, row: CatalogRow, market: str) -> None:
        removed[gate] += 1
        if len(examples[gate]) < 3:
            examples[gate].append(_label(row, market))

    for row in rows:
        for market in markets:
            considered += 1
            price = row.on_demand_per_hour if market == "on-demand" else row.spot_per_hour
            if price is None:
                drop("price", row, market)
                continue
            if row.cpus + 1e-9 < cpus:
                drop("cpus", row, market)
                continue
            if row.memory_gb + 1e-9 < mem:
                drop("memory", row, market)
                continue
            if gpus:
                if row.gpus < gpus:
                    drop("gpus", row, market)
                    continue
                if want_gpu is not None and row.gpu_model != want_gpu:
                    drop("gpu_model", row, market)
                    continue
                if model is not None:
                    per_gpu = (row.gpu_memory_gb / row.gpus) if row.gpu_memory_gb else None
                    spec = gpu_spec(row.gpu_name, per_gpu)
                    if per_gpu is None and spec is not None:
                        per_gpu = spec.memory_gb
                    if per_gpu is None or per_gpu * gpus + 1e-9 < model.vram_gb:
                        drop("vram", row, market)
                        continue
                    if spec is None:
                        drop("gpu_spec", row, market)
                        continue
            elif row.gpus and not gpu_hosts:
                drop("gpu_host", row, market)
                continue
            if arch is not None and row.arch != arch:
                drop("arch", row, market)
                continue
            if cap is not None and price > cap + 1e-12:
                drop("max_price", row, market)
                continue
            if providers and row.provider not in providers:
                drop("provider", row, market)
                continue
            if regions and row.region not in regions:
                drop("region", row, market)
                continue
            if affinity is not None and not affinity.allows(row.provider, row.region):
                drop("affinity", row, market)
                continue
            if row.available == 0:
                drop("capacity", row, market)
                continue
            out_rows.append(row)
            out_markets.append(market)
    req = requirements(demand, affinity)
    gates = tuple(GateResult(g, removed[g], req[g], tuple(examples[g])) for g in GATES)
    # every row here holds at least one sandbox (cpus, memory and GPUs each fit one)
    slots = demand.slots_of(np.fromiter((r.cpus for r in out_rows), float, len(out_rows)),
                            np.fromiter((r.memory_gb for r in out_rows), float, len(out_rows)),
                            np.fromiter((r.gpus for r in out_rows), np.int64, len(out_rows)))
    return Feasible(out_rows, out_markets, slots, considered, gates)


def describe(demand: Demand) -> str:
    size = f"{demand.count} x {demand.cpus:g} vCPU / {demand.memory_gb:g} GB"
    if demand.gpus:
        size += f" / {demand.gpus} x {demand.gpu_name or 'GPU'}"
    if demand.model:
        size += f" serving a {demand.model.params_b:g}B model"
    return f"{size} ({demand.mode}, {demand.market})"


__all__ = ["Feasible", "GATES", "GateResult", "NoFeasibleOffer", "check", "describe", "requirements"]
