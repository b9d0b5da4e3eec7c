"""C(j): the expected $/h of an offer once interruptions are paid for, and the bid price
of an offer on a bid market (Vast.ai's interruptible one).

Model (restart from scratch; the SDK re-runs an interrupted task, it does not
checkpoint it): interruptions arrive at a constant hazard ``lam`` per hour.  A task of
``D`` hours then takes ``E = (exp(lam*D) - 1) / lam`` hours of paid time in expectation
(the standard result for restart-on-failure with exponential failures), so the
effective price is ``price * E / D``.  For lam*D << 1 the factor is ~1 + lam*D/2.

Where the hazard comes from:

* a cloud's spot market (profile ``spot_market="reclaim"``: EC2, GCE, Azure, Alibaba):
  the provider profile's monthly interruption share (default 10 %, see
  :mod:`flowmesh_sdk.descriptor`);
* a provider whose spot market is bid-priced on hosts of their own reliability (profile
  ``spot_market="bid"``: Vast.ai), both markets: the host's ``reliability`` r, read as the
  probability that the machine runs a day without an outage: ``lam = -ln(r) / 24``.
  Vast.ai does not define reliability this precisely; this reading is an assumption
  (docs/cost-model.md);
* its interruptible (bid) market, on top: being outbid.  Vast.ai publishes no outbid
  rate; assumed ``OUTBID_PER_HOUR`` = 0.05/h at a bid of ``1 + BID_MARGIN`` times the
  current minimum bid.
* on-demand on the clouds: no interruption (factor 1).

Bid price for an offer on a bid market: ``min(on-demand price, min_bid * (1 +
BID_MARGIN))`` -- a margin over the market's current minimum so a small price move
does not outbid the worker at once, never more than the on-demand price (then one would
rent on-demand instead).
"""

from __future__ import annotations

import math

from ..catalog.profiles import profile
from ..catalog.records import CatalogRow
from ..errors import SpecError

BID_MARGIN = 0.10
OUTBID_PER_HOUR = 0.05


def bid_market(provider: str) -> bool:
    """Whether ``provider``'s spot market is bid-priced on hosts of their own reliability."""
    return profile(provider).spot_market == "bid"


def hazard_per_hour(row: CatalogRow, market: str) -> float:
    """Interruptions per hour expected for ``row`` bought on ``market``."""
    if bid_market(row.provider):
        lam = -math.log(row.reliability) / 24.0 if row.reliability else 0.0
        if market == "spot":
            lam += OUTBID_PER_HOUR
        return lam
    if market == "spot":
        return profile(row.provider).spot_hazard_per_hour
    return 0.0


def interruption_factor(lam: float, task_hours: float) -> float:
    """Expected paid hours per useful hour for a task of ``task_hours`` at hazard ``lam``."""
    x = lam * task_hours
    if x <= 0:
        return 1.0
    if x < 1e-6:
        return 1.0 + x / 2.0
    return math.expm1(x) / x


def bid_price(row: CatalogRow) -> float | None:
    """The bid for an interruptible offer on a bid market; ``None`` for anything else."""
    if not bid_market(row.provider) or row.spot_per_hour is None:
        return None
    bid = row.spot_per_hour * (1.0 + BID_MARGIN)
    if row.on_demand_per_hour is not None:
        bid = min(bid, row.on_demand_per_hour)
    return round(bid, 6)


def effective_price(row: CatalogRow, market: str, task_hours: float) -> tuple[float, float, float | None]:
    """``(listed $/h, C(j) $/h, bid)`` of ``row`` on ``market``; the listed price must exist.

    On a bid market the price paid is the bid, not the minimum bid."""
    listed = row.price(market)
    if listed is None:
        raise SpecError("market", f"{row.key} has no {market!r} price (it is sold "
                                  f"{'on-demand' if row.on_demand_per_hour is not None else 'spot only'})")
    bid = bid_price(row) if market == "spot" else None
    paid = bid if bid is not None else listed
    return listed, paid * interruption_factor(hazard_per_hour(row, market), task_hours), bid


__all__ = ["BID_MARGIN", "OUTBID_PER_HOUR", "bid_market", "bid_price", "effective_price", "hazard_per_hour",
           "interruption_factor"]
