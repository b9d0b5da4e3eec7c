"""U(j,B) for every feasible offer, each term normalised and kept for the explanation.

``j`` is one worker slot of an offer (one sandbox, or one GPU worker of ``Demand.gpus``
GPUs) and ``B`` the demand.  For each feasible offer:

* ``T_eff`` -- per-slot throughput (:mod:`.throughput`): sandboxes/hour for CPU pools,
  decode tokens/s for a model workload.  ``T^ = T_eff / max T_eff`` over the feasible
  offers: the fastest slot scores 1, one half as fast 0.5.
* ``C`` -- the instance's expected $/h after interruptions (:mod:`.cost`), divided by
  its slots: $ per slot-hour.  ``C^ = C / min C`` over the feasible offers: the
  cheapest slot scores 1, one twice as dear 2 (free slots -- the user's own machines --
  score 0, and the paid ones are taken against the cheapest paid slot).
* ``G_loc`` -- 1 when the image (or the model's weights) is already resident where the
  offer runs (``Demand.resident``), else 0.

``U = w_t*T^ - w_c*C^ + w_l*G_loc``; higher is better.  Both ratios are taken against
the *best* feasible offer, so an outlier (a 96-vCPU machine bought for one sandbox)
does not squash the differences that matter, and C^ stays linear in dollars, which the
planner needs (its objective adds instance costs).  With the ``balanced`` weights an
offer twice as dear must be twice as fast to tie.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..catalog.records import CatalogRow
from ..errors import SpecError
from ..specs import Offer, check_number
from ..catalog.profiles import profile
from .cost import BID_MARGIN, OUTBID_PER_HOUR, bid_market
from .demand import Demand, TenantAffinity, check_caps
from .gates import Feasible, GateResult, NoFeasibleOffer, RowTable, check, describe
from .policy import Policy
from .throughput import CONTAINER_START_S, PULL_MBPS_CAP, PULL_MBPS_PER_8_VCPU, tokens_per_second


@dataclass(frozen=True, slots=True)
class Score:
    """One feasible offer and every term of its utility."""

    row: CatalogRow
    market: str
    slots: int
    price_per_hour: float          # listed $/h of the instance in this market
    cost_per_hour: float           # C: expected $/h of the instance after interruptions (bid if any)
    bid_per_hour: float | None     # Vast.ai interruptible: the bid to place
    t_eff: float                   # per slot: sandboxes/hour, or tokens/s for a model
    t_unit: str                    # "sandboxes/h" or "tokens/s"
    t_norm: float                  # T^ in [0, 1]
    c_norm: float                  # C^: per-slot cost / the cheapest feasible (paid) per-slot cost; 0 if free
    g_loc: float                   # 0 or 1
    utility: float                 # U = w_t*T^ - w_c*C^ + w_l*G_loc
    available: int | None = None   # how many of this offer can be had (None: not limited)

    @property
    def cost_per_slot(self) -> float:
        return self.cost_per_hour / self.slots

    def offer(self) -> Offer:
        """The :class:`Offer` to launch (a Vast.ai bid is launched at the bid price)."""
        base = self.row.offer(self.market)
        if base is None:  # only for fractional-vCPU shapes, which no sandbox fits
            raise SpecError("offer", f"{self.row.key} cannot be launched as an Offer (fractional vCPUs)")
        if self.bid_per_hour is not None:
            from dataclasses import replace
            base = replace(base, price_per_hour=self.bid_per_hour)
        return base

    def explain(self, policy: Policy) -> str:
        return (f"U = {policy.w_t:g}*{self.t_norm:.3f} - {policy.w_c:g}*{self.c_norm:.3f} "
                f"+ {policy.w_l:g}*{self.g_loc:g} = {self.utility:.3f}")


@dataclass(slots=True)
class Scored:
    """The feasible offers as arrays (index ``i`` is ``feasible.rows[i]`` on
    ``feasible.markets[i]``); :meth:`score` builds the record of one."""

    demand: Demand
    policy: Policy
    feasible: Feasible
    slots: np.ndarray
    t: np.ndarray
    price: np.ndarray
    cost: np.ndarray
    bids: list[float | None]
    g: np.ndarray
    cap: np.ndarray        # -1: not limited
    t_norm: np.ndarray
    c_norm: np.ndarray     # per slot, relative to the cheapest
    utility: np.ndarray    # per slot

    @property
    def gates(self) -> tuple[GateResult, ...]:
        return self.feasible.gates

    def __len__(self) -> int:
        return len(self.feasible.rows)

    def score(self, i: int) -> Score:
        cap = int(self.cap[i])
        return Score(row=self.feasible.rows[i], market=self.feasible.markets[i], slots=int(self.slots[i]),
                     price_per_hour=float(self.price[i]), cost_per_hour=float(self.cost[i]),
                     bid_per_hour=self.bids[i], t_eff=float(self.t[i]),
                     t_unit="tokens/s" if self.demand.model is not None else "sandboxes/h",
                     t_norm=float(self.t_norm[i]), c_norm=float(self.c_norm[i]), g_loc=float(self.g[i]),
                     utility=float(self.utility[i]), available=None if cap < 0 else cap)

    def ranking(self, limit: int | None = None) -> list[Score]:
        """Best first (ties: cheaper slot, then name, so the order is reproducible)."""
        if limit is not None:
            check_number("limit", limit, lo=0, integer=True)
        per_slot = self.cost / self.slots
        order = np.lexsort((np.arange(len(self)), per_slot, -self.utility))
        if limit is not None:
            order = order[:limit]
        return [self.score(int(i)) for i in order]


def score(rows: Sequence[CatalogRow] | RowTable, demand: Demand, policy: Policy,
          affinities: Mapping[str, TenantAffinity] | None = None,
          caps: Mapping[str, int] | None = None) -> Scored:
    """Gate, then score every feasible offer; :class:`NoFeasibleOffer` when none is left.

    ``rows`` are catalog rows or their :class:`~.gates.RowTable` (what a :class:`Bidder`
    passes, so the columns are built once).  ``caps`` limits how many instances of a row
    (by :attr:`CatalogRow.key`) may be used, on top of the row's own ``available``."""
    if not isinstance(policy, Policy):
        raise SpecError("policy", f"must be a Policy (e.g. Policy.preset('cost')), got {policy!r}")
    check_caps(caps)
    feasible = check(rows, demand, affinities)
    n = len(feasible.rows)
    if n == 0:
        raise NoFeasibleOffer(describe(demand), feasible.considered, feasible.gates)
    table, index, spot = _origin(feasible)
    slots = feasible.slots
    t, price, cost, bids, g = _terms(table, index, spot, slots, demand)
    cap = table.available[index]
    if caps:
        extra = np.full(table.n, -1, dtype=np.int64)        # -1: no cap from ``caps``
        for key, limit in caps.items():
            hit = table.rows_with_key(key)
            if hit:
                extra[hit] = limit
        extra = extra[index]
        cap = np.where(extra < 0, cap, np.where(cap < 0, extra, np.minimum(cap, extra)))
    t_max = float(t.max()) if n else 0.0
    t_norm = t / t_max if t_max > 0 else np.zeros(n)
    per_slot = cost / slots
    c_norm = _cost_ratio(per_slot)
    utility = policy.w_t * t_norm - policy.w_c * c_norm + policy.w_l * g
    return Scored(demand=demand, policy=policy, feasible=feasible, slots=slots, t=t, price=price, cost=cost,
                  bids=bids, g=g, cap=cap, t_norm=t_norm, c_norm=c_norm, utility=utility)


def _origin(feasible: Feasible) -> tuple[RowTable, np.ndarray, np.ndarray]:
    """The table, row indices and spot flags of the feasible offers (rebuilt from the
    rows for a :class:`Feasible` made by hand)."""
    if feasible.table is not None and feasible.index is not None and feasible.spot is not None:
        return feasible.table, feasible.index, feasible.spot
    table = RowTable(feasible.rows)
    n = len(feasible.rows)
    return table, np.arange(n), np.fromiter((m == "spot" for m in feasible.markets), bool, n)


def _cost_ratio(per_slot: np.ndarray) -> np.ndarray:
    """C^: per-slot cost over the cheapest feasible per-slot cost.  When the cheapest is
    free (machines the user owns: ``local``, ``ssh``), over the cheapest paid one, the
    free ones scoring 0 -- so paid offers keep finite, comparable terms beside them."""
    c_min = float(per_slot.min())
    if c_min > 0:
        return per_slot / c_min
    paid = per_slot[per_slot > 0]
    if not paid.size:
        return np.ones_like(per_slot)
    return per_slot / float(paid.min())


def _terms(table: RowTable, index: np.ndarray, spot: np.ndarray, slots: np.ndarray, demand: Demand
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float | None], np.ndarray]:
    """T_eff, listed price, C and bid of every offer (row ``index[i]`` of ``table``, on
    spot where ``spot[i]``), and G_loc: the same arithmetic as :func:`.throughput.t_eff`
    and :func:`.cost.effective_price` (the reference, per row; ``tests/test_bidder.py``
    checks the two agree), done on the table's columns so that 10,000 offers score in
    milliseconds."""
    n = len(index)
    hours = demand.hours
    od = table.on_demand[index]
    sp = table.spot[index]
    listed = np.where(spot, sp, od)
    names = table.provider.names
    provider = table.provider.codes[index]
    on_bids = np.array([bid_market(p) for p in names], dtype=bool)[provider]   # bid markets (Vast.ai)
    rel = table.reliability[index]
    cloud_lam = np.array([profile(p).spot_hazard_per_hour for p in names], dtype=float)[provider]
    lam = np.where(on_bids, -np.log(rel) / 24.0 + spot * OUTBID_PER_HOUR, np.where(spot, cloud_lam, 0.0))
    raw_bid = np.round(sp * (1.0 + BID_MARGIN), 6)
    bid_arr = np.where(on_bids & spot, np.where(np.isnan(od), raw_bid, np.minimum(raw_bid, od)), np.nan)
    has_bid = ~np.isnan(bid_arr)
    paid = np.where(has_bid, bid_arr, listed)
    x = lam * hours
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(x <= 0, 1.0, np.where(x < 1e-6, 1.0 + x / 2.0, np.expm1(x) / np.where(x > 0, x, 1.0)))
    cost = paid * factor
    bids: list[float | None] = [None] * n
    where = np.flatnonzero(has_bid)
    for i, v in zip(where.tolist(), bid_arr[where].tolist()):
        bids[i] = v
    g = table.resident(demand.resident)[index].astype(float) if demand.resident else np.zeros(n)
    if demand.model is not None:
        rows = table.rows
        t = np.fromiter(((tokens_per_second(rows[i], demand) or 0.0) for i in index.tolist()), float, n)
    else:
        cpus = table.cpus[index]
        mbps = np.minimum(PULL_MBPS_CAP, PULL_MBPS_PER_8_VCPU * np.maximum(1.0, cpus / 8.0))
        pull = np.where(g > 0, 0.0, demand.image_gb * 8000.0 / (mbps / np.maximum(slots, 1))) \
            if demand.image_gb > 0 else np.zeros(n)
        startup = pull + CONTAINER_START_S
        if demand.mode == "ephemeral":
            startup = startup + np.array([profile(p).boot_s for p in names], dtype=float)[provider]
        t = 3600.0 / (startup + demand.minutes * 60.0)
    return t, listed, cost, bids, g


__all__ = ["Score", "Scored", "score"]
