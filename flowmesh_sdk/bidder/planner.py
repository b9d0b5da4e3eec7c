"""Demand planning: which offers, how many instances of each, and how many sandboxes on
each, for "N sandboxes of size s".

The problem (the integer program ``bench/bidder_optimality.py`` solves exactly with
``scipy.optimize.milp`` to check this planner)::

    maximise   sum_j a_j*y_j - sum_j b_j*x_j
    subject to sum_j y_j = N,   0 <= y_j <= k_j*x_j,   0 <= x_j <= cap_j,   x, y integer

``x_j`` instances of offer j, ``y_j`` sandboxes placed on them, ``k_j`` slots per
instance, ``a_j = w_t*T^_j + w_l*G_loc_j`` what a sandbox gains there, ``b_j = w_c*k_j*C^_j``
what an instance costs in utility (the whole instance is paid for, empty slots too).
With ``w_t = w_l = 0`` this is the cheapest covering of N sandboxes.

The planner:

1. Some optimal plan fills every instance but at most one (move sandboxes from the
   lower-``a`` of two part-filled instances to the other until one is full or empty;
   an empty instance is dropped, which never loses utility since ``b >= 0``).
2. Full instances are taken greedily by their value per slot ``a_j - b_j/k_j`` (the
   order that solves the LP relaxation), within each offer's cap, until what is left
   is within a window of ``WINDOW`` x (largest k) sandboxes; the greedy stops at the
   first offer the window (not its cap) limits.
3. The window is solved exactly by dynamic programming over "sandboxes placed in full
   instances" (a bounded knapsack over the best offers, caps by binary splitting), plus
   one part-filled instance for what is left over, and the best split is taken.

It is exact when N fits the window and within a fraction of one instance's value
otherwise; the benchmark measures the gap against the MILP (target <= 1 %).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..catalog.records import CatalogRow
from .demand import Demand, TenantAffinity
from .gates import GateResult, NoFeasibleOffer, RowTable, describe
from .policy import Policy
from .scoring import Score, Scored, score

WINDOW = 2            # the tail solved exactly spans WINDOW x the largest slot count
TOP_BY_VALUE = 40     # tail candidates: best value per slot ...
TOP_BY_PRICE = 12     # ... cheapest instances (good for a small remainder) ...
PER_SLOT_SIZE = 2     # ... and the best few of every slot count
SPLITS_CHECKED = 32   # full/partial splits re-checked against the caps
GREEDY_PREFIX = 64    # offers sorted before the greedy starts (more are sorted if it needs them)


@dataclass(frozen=True, slots=True)
class PlanLine:
    """``instances`` of one offer, holding ``sandboxes`` of the demand."""

    score: Score
    instances: int
    sandboxes: int

    @property
    def cost_per_hour(self) -> float:
        """Expected $/h of these instances (C, after interruptions)."""
        return self.instances * self.score.cost_per_hour

    @property
    def listed_per_hour(self) -> float:
        return self.instances * (self.score.bid_per_hour or self.score.price_per_hour)


@dataclass(frozen=True, slots=True)
class Plan:
    demand: Demand
    policy: Policy
    lines: tuple[PlanLine, ...]
    utility: float                  # the objective: sum a*y - sum b*x
    gates: tuple[GateResult, ...]
    considered: int                 # offers (row x market) looked at
    feasible: int                   # offers that passed the gates

    @property
    def instances(self) -> int:
        return sum(line.instances for line in self.lines)

    @property
    def sandboxes(self) -> int:
        return sum(line.sandboxes for line in self.lines)

    @property
    def cost_per_hour(self) -> float:
        return sum(line.cost_per_hour for line in self.lines)

    @property
    def listed_per_hour(self) -> float:
        return sum(line.listed_per_hour for line in self.lines)


def pack(n: int, k: np.ndarray, a: np.ndarray, b: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Instances ``x`` and sandboxes ``y`` per offer for the integer program above.

    ``cap[j] < 0`` means not limited.  Raises :class:`NoFeasibleOffer` when the caps hold
    fewer than ``n`` sandboxes."""
    m = len(k)
    k = k.astype(np.int64)
    need = -(-n // k)                                   # ceil(n / k): more is never useful
    capx = np.where(cap < 0, need, np.minimum(cap, need)).astype(np.int64)
    if int((capx * k).sum()) < n:
        raise _unplaceable(n, m, f"the offers' caps hold {int((capx * k).sum())} sandboxes, fewer than {n}")
    x = np.zeros(m, dtype=np.int64)
    bk = b / k
    r = a - bk
    neg_r = -r
    # the offers by value per slot (best first; ties: cheaper per slot, then lower index);
    # the greedy rarely goes past the first few, so only a prefix is sorted at first
    order = _best(neg_r, bk, None, GREEDY_PREFIX)
    live = capx > 0
    window = min(n, WINDOW * int(k[live].max()))
    rem = n
    kmin = int(k[live].min())
    pos = 0
    while pos < m:
        if pos == len(order):           # past the prefix: the whole order (it starts with the prefix)
            order = _best(neg_r, bk, None, m)
        j = int(order[pos])
        pos += 1
        if rem - window < kmin:
            break
        kj = int(k[j])
        room = (rem - window) // kj
        take = min(int(capx[j]), room)
        if take > 0:
            x[j] += take
            rem -= take * kj
        if take == room:        # limited by the window, not by the cap: the tail DP takes over
            break               # (filling the gap with worse offers would only lose utility)
    if rem == 0:
        return x, x * k
    left = capx - x
    cand = _candidates(neg_r, bk, k, b, left)
    xt, part = _solve_tail(rem, cand, k, a, b, left)
    x += xt
    y = x * k
    if part is not None:
        j, s = part
        x[j] += 1
        y[j] += s
    return x, y


def _best(key: np.ndarray, then: np.ndarray, among: np.ndarray | None, count: int) -> np.ndarray:
    """The first ``count`` or more offers of ``among`` (ascending indices; ``None``: all)
    in the order ``np.lexsort((then, key))`` -- by ``key``, then ``then``, then index --
    exactly as a prefix of sorting them all (every tie of the ``count``-th key is kept)."""
    idx = np.arange(len(key)) if among is None else among
    if len(idx) > 4 * count + 64:
        sub = key[idx]
        v = np.partition(sub, count - 1)[count - 1]
        if v == v:                      # NaN keys sort last; a NaN here: sort everything
            idx = idx[sub <= v]
    return idx[np.lexsort((then[idx], key[idx]))]


def _candidates(neg_r: np.ndarray, bk: np.ndarray, k: np.ndarray, b: np.ndarray, left: np.ndarray) -> list[int]:
    """The offers the tail DP may use, in this order: the ``TOP_BY_VALUE`` best by value
    per slot, the ``TOP_BY_PRICE`` cheapest instances (ties: the better value first),
    then the best of every slot count (smallest count first), then the second best of
    every slot count, ... (``PER_SLOT_SIZE`` rounds); offers with no instance left are
    not candidates.  ``tests/test_bidder.py`` checks this against sorting every offer."""
    avail = np.flatnonzero(left > 0)
    if not len(avail):
        return []
    chosen: dict[int, None] = dict.fromkeys(_best(neg_r, bk, avail, TOP_BY_VALUE)[:TOP_BY_VALUE].tolist())
    cheap = avail
    if len(cheap) > 4 * TOP_BY_PRICE + 64:
        sub = b[cheap]
        v = np.partition(sub, TOP_BY_PRICE - 1)[TOP_BY_PRICE - 1]
        if v == v:
            cheap = cheap[sub <= v]
    cheap = cheap[np.lexsort((bk[cheap], neg_r[cheap], b[cheap]))]
    chosen.update(dict.fromkeys(cheap[:TOP_BY_PRICE].tolist()))
    ka = k[avail]
    top = int(ka.max())                         # the slot counts, smallest first:
    sizes = np.flatnonzero(np.bincount(ka)) if top <= 4 * len(ka) + 1024 else np.unique(ka)
    if len(sizes) > 64:                         # many sizes: one sort by slot count, then by value
        ranked = avail[np.lexsort((bk[avail], neg_r[avail], ka))]
        kr = k[ranked]
        starts = np.searchsorted(kr, sizes, side="left").tolist()
        ends = np.searchsorted(kr, sizes, side="right").tolist()
        groups = [ranked[s:min(e, s + PER_SLOT_SIZE)] for s, e in zip(starts, ends)]
    else:
        groups = [_best(neg_r, bk, avail[ka == size], PER_SLOT_SIZE)[:PER_SLOT_SIZE] for size in sizes.tolist()]
    for rank in range(PER_SLOT_SIZE):
        chosen.update(dict.fromkeys(int(g[rank]) for g in groups if len(g) > rank))
    return list(chosen)


def _solve_tail(rem: int, cand: list[int], k: np.ndarray, a: np.ndarray, b: np.ndarray,
                left: np.ndarray) -> tuple[np.ndarray, tuple[int, int] | None]:
    """Exactly place ``rem`` sandboxes on ``cand``: full instances by DP + one partial."""
    neg = -np.inf
    best = np.full(rem + 1, neg)
    best[0] = 0.0
    steps: list[tuple[int, int, int, np.ndarray]] = []
    for j in cand:
        kj = int(k[j])
        count = min(int(left[j]), rem // kj)
        value = float(a[j]) * kj - float(b[j])
        chunk = 1
        while count > 0:
            take = min(chunk, count)
            count -= take
            chunk *= 2
            w = take * kj
            cand_vals = best[:-w] + take * value
            improve = cand_vals > best[w:]
            if not improve.any():
                continue
            took = np.zeros(rem + 1, dtype=bool)
            took[w:] = improve
            best = best.copy()
            best[w:] = np.where(improve, cand_vals, best[w:])
            steps.append((j, take, w, took))
    # one part-filled instance for s = 1..rem sandboxes
    part_val = np.full(rem + 1, neg)
    part_val[0] = 0.0
    part_who = np.full(rem + 1, -1, dtype=np.int64)
    for j in cand:
        if left[j] <= 0:
            continue
        top = min(int(k[j]), rem)
        sizes = np.arange(1, top + 1)
        vals = float(a[j]) * sizes - float(b[j])
        better = vals > part_val[1:top + 1]
        part_val[1:top + 1] = np.where(better, vals, part_val[1:top + 1])
        part_who[1:top + 1] = np.where(better, j, part_who[1:top + 1])
    total = best + part_val[::-1]           # d sandboxes in full instances, rem - d in the partial one
    # The part-filled instance may be of an offer whose cap the full instances used up;
    # so the best few splits are checked with the caps, and the best feasible one wins.
    tried = np.argsort(-total, kind="stable")[:SPLITS_CHECKED]
    found: tuple[float, np.ndarray, tuple[int, int] | None] | None = None
    for d in (int(v) for v in tried):
        if not np.isfinite(total[d]) or (found is not None and total[d] <= found[0]):
            continue
        x = np.zeros(len(k), dtype=np.int64)
        dd = d
        for j, take, w, took in reversed(steps):
            if took[dd]:
                x[j] += take
                dd -= w
        s = rem - d
        if s == 0:
            found = (float(best[d]), x, None)
            continue
        j = int(part_who[s])
        value = float(part_val[s])
        if x[j] + 1 > left[j]:      # that offer's cap is used up by the full instances: next best
            options = [(float(a[c]) * s - float(b[c]), c) for c in cand if k[c] >= s and x[c] + 1 <= left[c]]
            if not options:
                continue
            value, j = max(options)
        if found is None or best[d] + value > found[0]:
            found = (float(best[d]) + value, x, (j, s))
    if found is None:
        raise _unplaceable(rem, len(k), "no combination of the offers places the remaining sandboxes")
    return found[1], found[2]


def _unplaceable(n: int, offers: int, why: str) -> NoFeasibleOffer:
    return NoFeasibleOffer(f"{n} sandboxes", offers, (GateResult("capacity", offers, why),))


def objective(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a * y).sum() - (b * x).sum())


def coefficients(scored: Scored) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` of the integer program from the scored offers."""
    p = scored.policy
    a = p.w_t * scored.t_norm + p.w_l * scored.g
    b = p.w_c * scored.c_norm * scored.slots
    return a, b


def plan(rows: Sequence[CatalogRow] | RowTable, demand: Demand, policy: Policy,
         affinities: Mapping[str, TenantAffinity] | None = None,
         caps: Mapping[str, int] | None = None) -> Plan:
    """The plan that maximises total utility for ``demand.count`` sandboxes (``rows``:
    catalog rows or their :class:`~.gates.RowTable`)."""
    scored = score(rows, demand, policy, affinities, caps)
    a, b = coefficients(scored)
    try:
        x, y = pack(demand.count, scored.slots, a, b, scored.cap)
    except NoFeasibleOffer as exc:
        gate = GateResult("capacity", len(scored), f"{exc.gates[-1].requirement} (availability caps)")
        raise NoFeasibleOffer(describe(demand), scored.feasible.considered,
                              scored.gates + (gate,)) from exc
    used = np.nonzero(x)[0]
    lines = sorted((PlanLine(scored.score(int(j)), int(x[j]), int(y[j])) for j in used),
                   key=lambda line: (-line.sandboxes, line.score.row.key))
    return Plan(demand=demand, policy=policy, lines=tuple(lines), utility=objective(x, y, a, b),
                gates=scored.gates, considered=scored.feasible.considered, feasible=len(scored))


__all__ = ["Plan", "PlanLine", "coefficients", "objective", "pack", "plan"]
