"""The bidder: feasibility gates, FlowMesh's utility U(j,B) = w_t*T_eff - w_c*C + w_l*G_loc,
and the choice of offers for a demand.  It decides; it launches nothing (the
provisioner does) and imports no cloud SDK.  See docs/cost-model.md.

>>> from flowmesh_sdk.catalog import Catalog
>>> from flowmesh_sdk.bidder import Bidder, Demand, Policy
>>> bidder = Bidder(Catalog.load(warn=False), Policy.preset("cost"))
>>> best = bidder.rank(Demand(cpus=8, memory_gb=16), limit=1)[0]
>>> p = bidder.plan(Demand(count=100, cpus=8, memory_gb=16))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..catalog.loader import Catalog
from ..catalog.records import CatalogRow
from ..errors import SpecError
from .cost import BID_MARGIN, OUTBID_PER_HOUR, bid_price, effective_price, hazard_per_hour, interruption_factor
from .demand import MODES, Demand, ModelSpec, TenantAffinity
from .estimate import (CHEAPEST, Estimate, Infeasible, PhaseEstimate, centralized, estimate, estimate_plan,
                       launch_times, phase_estimate)
from .gates import GATES, GateResult, NoFeasibleOffer, RowTable
from .planner import Plan, PlanLine, pack, plan
from .policy import PRESETS, Policy
from .scoring import Score, Scored, score
from .throughput import pull_seconds, startup_seconds, t_eff, tokens_per_second


class Bidder:
    """Gates, scores and plans over one catalog with one policy and one set of tenant rules."""

    def __init__(self, catalog: Catalog | Iterable[CatalogRow], policy: Policy | None = None,
                 affinities: Iterable[TenantAffinity] = ()) -> None:
        if not isinstance(catalog, Catalog) and (isinstance(catalog, (str, bytes))
                                                 or not hasattr(catalog, "__iter__")):
            raise SpecError("catalog", f"must be a Catalog or catalog rows, got {type(catalog).__name__}")
        self.rows: tuple[CatalogRow, ...] = tuple(catalog.rows if isinstance(catalog, Catalog) else catalog)
        self.table = RowTable(self.rows)        # validates the rows; the columns every decision reads
        if policy is not None and not isinstance(policy, Policy):
            raise SpecError("policy", f"must be a Policy (e.g. Policy.preset('cost')), got {policy!r}")
        self.policy = policy or PRESETS["balanced"]
        if isinstance(affinities, (str, bytes)) or not hasattr(affinities, "__iter__"):
            raise SpecError("affinities", f"must be TenantAffinity records, got {type(affinities).__name__}")
        affinities = tuple(affinities)
        for i, a in enumerate(affinities):
            if not isinstance(a, TenantAffinity):
                raise SpecError(f"affinities[{i}]", f"must be a TenantAffinity, got {type(a).__name__}")
        self.affinities: dict[str, TenantAffinity] = {a.tenant: a for a in affinities}

    def score(self, demand: Demand, caps: Mapping[str, int] | None = None) -> Scored:
        return score(self.table, demand, self.policy, self.affinities, caps)

    def rank(self, demand: Demand, limit: int | None = None) -> list[Score]:
        """Feasible offers, best U first; :class:`NoFeasibleOffer` says which gate removed what."""
        return self.score(demand).ranking(limit)

    def plan(self, demand: Demand, caps: Mapping[str, int] | None = None) -> Plan:
        return plan(self.table, demand, self.policy, self.affinities, caps)

    def estimate(self, demand: Demand) -> tuple[list[Estimate], list[Infeasible]]:
        return estimate(self.rows, demand, affinities=self.affinities)


def rows_of(catalog: Catalog | Sequence[CatalogRow]) -> tuple[CatalogRow, ...]:
    return tuple(catalog.rows if isinstance(catalog, Catalog) else catalog)


__all__ = ["BID_MARGIN", "Bidder", "CHEAPEST", "Demand", "Estimate", "GATES", "GateResult", "Infeasible", "MODES",
           "ModelSpec", "NoFeasibleOffer", "OUTBID_PER_HOUR", "PRESETS", "PhaseEstimate", "Plan", "PlanLine",
           "RowTable", "Policy", "Score", "Scored", "TenantAffinity", "bid_price", "centralized", "effective_price",
           "estimate", "estimate_plan", "hazard_per_hour", "interruption_factor", "launch_times", "pack",
           "phase_estimate", "plan", "pull_seconds", "score", "startup_seconds", "t_eff", "tokens_per_second"]
