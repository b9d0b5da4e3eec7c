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

from collections.abc import Collection, Mapping, Sequence
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
    """The offers that passed, as parallel lists (cheap to build for 10,000 rows), and
    where in the :class:`RowTable` they came from (what the scoring reads its columns by)."""

    rows: list[CatalogRow]
    markets: list[str]
    slots: np.ndarray          # sandboxes (or workers) per instance, >= 1
    considered: int
    gates: tuple[GateResult, ...]
    # where they came from: the table of the rows, each offer's row in it, its market
    # (an index into Demand.markets) and whether that market is spot
    table: RowTable | None = None
    index: np.ndarray | None = None
    market_index: np.ndarray | None = None
    spot: np.ndarray | None = None


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


class Codes:
    """Names interned as small integers: ``codes[i]`` is the index of row i's name in ``names``."""

    __slots__ = ("codes", "names")

    def __init__(self, values: Sequence[str]) -> None:
        index: dict[str, int] = {}
        self.codes = np.fromiter((index.setdefault(v, len(index)) for v in values), np.int64, len(values))
        self.names = list(index)

    def member(self, allowed: Collection[str]) -> np.ndarray:
        """Per row: its name is in ``allowed``."""
        lut = np.fromiter((name in allowed for name in self.names), bool, len(self.names))
        return lut[self.codes]

    def equal(self, name: str) -> np.ndarray:
        return self.member((name,))


class RowTable:
    """The rows of a catalog as columns, built once (validating the rows with
    :func:`check_rows`) and read by every gate and score over those rows.

    ``cpus``, ``memory_gb``, ``gpus``, ``on_demand`` / ``spot`` ($/h, NaN where there is
    no price), ``available`` (-1: not limited), ``reliability`` (1.0 where not stated),
    ``provider`` / ``region`` / ``arch`` (:class:`Codes`), ``gpu_rows`` (the rows with
    GPUs).  The GPU columns and the names the locality term and the caps match are
    built on first use.  The rows are frozen, so a table never goes stale."""

    __slots__ = ("rows", "n", "cpus", "memory_gb", "gpus", "on_demand", "spot", "available", "reliability",
                 "provider", "region", "arch", "gpu_rows", "objects", "_gpu_model", "_gpu_memory", "_place", "_by_type",
                 "_by_key")

    def __init__(self, rows: Sequence[CatalogRow]) -> None:
        check_rows(rows)
        self.rows: tuple[CatalogRow, ...] = tuple(rows)
        rows = self.rows
        n = self.n = len(rows)
        nan = float("nan")
        self.cpus = np.fromiter((r.cpus for r in rows), float, n)
        self.memory_gb = np.fromiter((r.memory_gb for r in rows), float, n)
        self.gpus = np.fromiter((r.gpus for r in rows), np.int64, n)
        self.on_demand = np.fromiter((nan if r.on_demand_per_hour is None else r.on_demand_per_hour
                                      for r in rows), float, n)
        self.spot = np.fromiter((nan if r.spot_per_hour is None else r.spot_per_hour for r in rows), float, n)
        self.available = np.fromiter((-1 if r.available is None else r.available for r in rows), np.int64, n)
        self.reliability = np.fromiter((r.reliability or 1.0 for r in rows), float, n)
        self.provider = Codes([r.provider for r in rows])
        self.region = Codes([r.region for r in rows])
        self.arch = Codes([r.arch for r in rows])
        self.gpu_rows = np.flatnonzero(self.gpus > 0)
        self.objects = _objects(rows)           # the rows as an object array (fast to index)
        self._gpu_model: Codes | None = None
        self._gpu_memory: tuple[np.ndarray, np.ndarray] | None = None
        self._place: Codes | None = None
        self._by_type: dict[str, list[int]] | None = None
        self._by_key: dict[str, list[int]] | None = None

    def __len__(self) -> int:
        return self.n

    @property
    def gpu_model(self) -> Codes:
        """:attr:`CatalogRow.gpu_model` of the GPU rows (``""`` for the others)."""
        if self._gpu_model is None:
            names = [""] * self.n
            for i in self.gpu_rows.tolist():
                names[i] = self.rows[i].gpu_model or ""
            self._gpu_model = Codes(names)
        return self._gpu_model

    @property
    def gpu_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row: ``(GB per GPU, NaN when unknown; the GPU has a spec)`` as the VRAM and
        spec gates read them (the row's own figure, else the spec's); GPU rows only."""
        if self._gpu_memory is None:
            per = np.full(self.n, np.nan)
            known = np.zeros(self.n, dtype=bool)
            for i in self.gpu_rows.tolist():
                row = self.rows[i]
                per_gpu = (row.gpu_memory_gb / row.gpus) if row.gpu_memory_gb else None
                spec = gpu_spec(row.gpu_name, per_gpu)
                if per_gpu is None and spec is not None:
                    per_gpu = spec.memory_gb
                if per_gpu is not None:
                    per[i] = per_gpu
                known[i] = spec is not None
            self._gpu_memory = (per, known)
        return self._gpu_memory

    def resident(self, entries: Collection[str]) -> np.ndarray:
        """:meth:`Demand.is_resident` of every row for these entries (``provider``,
        ``provider/region`` or ``provider/region/instance_type``)."""
        if self._place is None:
            self._place = Codes([f"{r.provider}/{r.region}" for r in self.rows])
            by: dict[str, list[int]] = {}
            for i, r in enumerate(self.rows):
                by.setdefault(f"{r.provider}/{r.region}/{r.instance_type}", []).append(i)
            self._by_type = by
        assert self._by_type is not None
        out = self.provider.member(entries) | self._place.member(entries)
        for entry in entries:
            hit = self._by_type.get(entry)
            if hit:
                out[hit] = True
        return out

    def rows_with_key(self, key: str) -> list[int]:
        """The rows whose :attr:`CatalogRow.key` is ``key``."""
        if self._by_key is None:
            by: dict[str, list[int]] = {}
            for i, r in enumerate(self.rows):
                by.setdefault(r.key, []).append(i)
            self._by_key = by
        return self._by_key.get(key, [])


def row_table(rows: Sequence[CatalogRow] | RowTable) -> RowTable:
    """``rows`` as a :class:`RowTable` (itself when it is one; built and validated else)."""
    return rows if isinstance(rows, RowTable) else RowTable(rows)


def check(rows: Sequence[CatalogRow] | RowTable, demand: Demand,
          affinities: Mapping[str, TenantAffinity] | None = None) -> Feasible:
    """Run every gate over every (row, market) of ``rows`` (catalog rows, or their
    :class:`RowTable`).

    Vectorised: for each market, the index of the first gate an offer fails (``len(GATES)``
    when it passes) is computed over all rows at once; offers are numbered row by row,
    market by market, as a loop over rows then markets would visit them."""
    check_demand(demand)
    table = row_table(rows)
    if affinities is not None and not isinstance(affinities, Mapping):
        raise SpecError("affinities", f"must be a mapping of tenant -> TenantAffinity, got "
                                      f"{type(affinities).__name__}")
    affinity = (affinities or {}).get(demand.tenant)
    if affinity is not None and not isinstance(affinity, TenantAffinity):
        raise SpecError(f"affinities[{demand.tenant!r}]", f"must be a TenantAffinity, got {affinity!r}")
    n = table.n
    gate = {g: np.int8(i) for i, g in enumerate(GATES)}
    passed = np.int8(len(GATES))
    markets = demand.markets
    cap = demand.max_price

    # Each gate's failures are written from the last gate to the first, so an offer ends up
    # with the first gate it fails.  The gates that do not depend on the market: cpus to arch ...
    early = np.full(n, passed, dtype=np.int8)
    if demand.arch is not None:
        early[~table.arch.equal(demand.arch)] = gate["arch"]
    if demand.gpus:
        g_rows = table.gpu_rows
        want = demand.gpus
        if demand.model is not None:
            per_gpu, known = table.gpu_memory
            sub = per_gpu[g_rows]
            short = np.isnan(sub) | (sub * want + 1e-9 < demand.model.vram_gb)
            early[g_rows[~known[g_rows]]] = gate["gpu_spec"]
            early[g_rows[short]] = gate["vram"]
        if demand.gpu_name:
            want_gpu = gpu_key(demand.gpu_name) or ""
            early[g_rows[table.gpu_model.codes[g_rows] != _code(table.gpu_model, want_gpu)]] = gate["gpu_model"]
        early[table.gpus < want] = gate["gpus"]
    elif not demand.gpu_hosts:
        early[table.gpu_rows] = gate["gpu_host"]
    early[table.memory_gb + 1e-9 < demand.memory_gb] = gate["memory"]
    early[table.cpus + 1e-9 < demand.cpus] = gate["cpus"]
    # ... and from provider to capacity
    late = np.full(n, passed, dtype=np.int8)
    late[table.available == 0] = gate["capacity"]
    if affinity is not None:
        allowed = np.ones(n, dtype=bool)
        if affinity.providers:
            allowed &= table.provider.member(affinity.providers)
        if affinity.regions:
            allowed &= table.region.member(affinity.regions)
        late[~allowed] = gate["affinity"]
    if demand.regions:
        late[~table.region.member(demand.regions)] = gate["region"]
    if demand.providers:
        late[~table.provider.member(demand.providers)] = gate["provider"]

    first = np.empty((n, len(markets)), dtype=np.int8)
    for j, market in enumerate(markets):
        price = table.on_demand if market == "on-demand" else table.spot
        col = np.where(early < passed, early, late)
        if cap is not None:
            col[(early == passed) & (price > cap + 1e-12)] = gate["max_price"]
        col[np.isnan(price)] = gate["price"]
        first[:, j] = col
    flat = first.ravel()                                  # offer o = row o // M on market o % M
    removed = np.bincount(flat, minlength=len(GATES) + 1)
    examples: dict[str, tuple[str, ...]] = {}
    for g, name in enumerate(GATES):
        if removed[g]:
            examples[name] = tuple(_label(table.rows[o // len(markets)], markets[o % len(markets)])
                                   for o in np.flatnonzero(flat == g)[:3].tolist())
    ok = np.flatnonzero(flat == passed)
    if len(markets) == 1:
        index, market_index = ok, np.zeros(len(ok), dtype=np.int64)
        out_markets = [markets[0]] * len(ok)
    else:
        index, market_index = np.divmod(ok, len(markets))
        out_markets = _objects(markets)[market_index].tolist()
    out_rows = table.objects[index].tolist()
    req = requirements(demand, affinity)
    gates = tuple(GateResult(g, int(removed[i]), req[g], examples.get(g, ())) for i, g in enumerate(GATES))
    # every row here holds at least one sandbox (cpus, memory and GPUs each fit one)
    slots = demand.slots_of(table.cpus[index], table.memory_gb[index], table.gpus[index])
    spot = np.fromiter((m == "spot" for m in markets), bool, len(markets))[market_index]
    return Feasible(out_rows, out_markets, slots, n * len(markets), gates, table, index, market_index, spot)


def _objects(items: Sequence[object]) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = list(items)
    return arr


def _code(codes: Codes, name: str) -> int:
    try:
        return codes.names.index(name)
    except ValueError:
        return -1


def describe(demand: Demand) -> str:
    size = f"{demand.count} x {demand.cpus:g} vCPU / {demand.memory_gb:g} GB"
    if demand.gpus:
        size += f" / {demand.gpus} x {demand.gpu_name or 'GPU'}"
    if demand.model:
        size += f" serving a {demand.model.params_b:g}B model"
    return f"{size} ({demand.mode}, {demand.market})"


__all__ = ["Codes", "Feasible", "GATES", "GateResult", "NoFeasibleOffer", "RowTable", "check", "check_rows", "describe",
           "requirements", "row_table"]
