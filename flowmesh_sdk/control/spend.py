"""What the fleet's instances cost, as it happens, and the budgets that bound it.

Each instance accrues its offer's price from the moment its launch call returned until
its termination is confirmed (or, for an instance whose termination failed, until now:
it may still be billed), and at least the provider's billing minimum
(:attr:`~flowmesh_sdk.catalog.profiles.ProviderProfile.billing_min_s`).  Time is the
SDK's one clock (:mod:`flowmesh_sdk.clock`), so on the simulator it is virtual time.

Budgets: ``budget_per_hour`` caps the burn rate (the $/h of the instances live at once,
counting those being launched), ``budget_total`` the spend so far plus the billing
minimum of what a launch would add.  :meth:`SpendLedger.admit` says how many instances
of a price may be launched now, or raises :class:`BudgetExceededError` with the numbers.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection
from dataclasses import dataclass, field

from .. import clock
from ..catalog.profiles import profile
from ..errors import BudgetExceededError


@dataclass(slots=True)
class Charge:
    instance_id: str
    pool: str
    provider: str
    price_per_hour: float
    started: float
    billing_min_s: float
    ended: float | None = None
    _within: bool = field(default=False, repr=False, compare=False)   # inside its billing minimum (the ledger's sums)

    def cost(self, now: float) -> float:
        end = self.ended if self.ended is not None else now
        return self.price_per_hour * max(self.billing_min_s, end - self.started) / 3600.0


@dataclass(frozen=True, slots=True)
class SpendSummary:
    spent: float            # $ so far
    burn_per_hour: float    # $/h of what is live now
    live: int               # instances accruing


class _Totals:
    """The running sums of one (pool, provider): what :meth:`SpendLedger.summary` reads in
    O(1) instead of walking every charge (a 10,000-instance fleet asks on every launch and
    termination).  A live charge is worth ``price * max(minimum, now - started)``: while
    inside its billing minimum a constant, after it linear in ``now`` -- two sums; a heap
    moves charges from the first group to the second as their minimum runs out."""

    __slots__ = ("closed", "live", "burn", "within", "past_price", "past_price_start", "due")

    def __init__(self) -> None:
        self.closed = 0.0            # $ of ended charges
        self.live = 0
        self.burn = 0.0              # $/h of live charges
        self.within = 0.0            # $ of live charges still inside their billing minimum
        self.past_price = 0.0        # sum of $/h of live charges past it ...
        self.past_price_start = 0.0  # ... and of $/h x started
        self.due: list[tuple[float, str]] = []   # (started + minimum, id) of those inside it

    def spent(self, charges: dict[str, Charge], now: float) -> float:
        while self.due and self.due[0][0] <= now:
            _, cid = heapq.heappop(self.due)
            c = charges.get(cid)
            if c is not None and c.ended is None and c._within:
                c._within = False
                self.within -= c.price_per_hour * c.billing_min_s / 3600.0
                self.past_price += c.price_per_hour
                self.past_price_start += c.price_per_hour * c.started
        return self.closed + self.within + (self.past_price * now - self.past_price_start) / 3600.0

    def add(self, c: Charge, now: float) -> None:
        if c.ended is not None:
            self.closed += c.cost(now)
            return
        self.live += 1
        self.burn += c.price_per_hour
        if c.started + c.billing_min_s > now:
            c._within = True
            self.within += c.price_per_hour * c.billing_min_s / 3600.0
            heapq.heappush(self.due, (c.started + c.billing_min_s, c.instance_id))
        else:
            c._within = False
            self.past_price += c.price_per_hour
            self.past_price_start += c.price_per_hour * c.started

    def remove(self, c: Charge, now: float) -> None:
        """Take ``c`` out (call ``spent`` first, so that its group is current)."""
        if c.ended is not None:
            self.closed -= c.cost(now)
            return
        self.live -= 1
        self.burn -= c.price_per_hour
        if c._within:
            self.within -= c.price_per_hour * c.billing_min_s / 3600.0   # its heap entry is skipped later
            c._within = False
        else:
            self.past_price -= c.price_per_hour
            self.past_price_start -= c.price_per_hour * c.started
        if not self.live:   # nothing live: exact zeros, not what the subtractions left over
            self.burn = self.within = self.past_price = self.past_price_start = 0.0
            self.due.clear()


class SpendLedger:
    """Every charge of one fleet; pools and providers are views over it."""

    def __init__(self) -> None:
        self._charges: dict[str, Charge] = {}
        self._totals: dict[tuple[str, str], _Totals] = {}

    def _sums(self, c: Charge) -> _Totals:
        key = (c.pool, c.provider)
        t = self._totals.get(key)
        if t is None:
            t = self._totals[key] = _Totals()
        return t

    def put(self, charge: Charge) -> None:
        """Record ``charge`` as it stands, replacing one of the same instance (a charge made
        by another coordinator of a shared fleet)."""
        now = clock.monotonic()
        old = self._charges.get(charge.instance_id)
        if old is not None:
            t = self._sums(old)
            t.spent(self._charges, now)
            t.remove(old, now)
        self._charges[charge.instance_id] = charge
        t = self._sums(charge)
        t.spent(self._charges, now)
        t.add(charge, now)

    def start(self, instance_id: str, *, pool: str, provider: str, price_per_hour: float,
              billing_min_s: float | None = None) -> None:
        if instance_id in self._charges:
            return
        minimum = profile(provider).billing_min_s if billing_min_s is None else billing_min_s
        self.put(Charge(instance_id, pool, provider, float(price_per_hour), clock.monotonic(), minimum))

    def end(self, instance_id: str) -> None:
        c = self._charges.get(instance_id)
        if c is not None and c.ended is None:
            now = clock.monotonic()
            t = self._sums(c)
            t.spent(self._charges, now)
            t.remove(c, now)
            c.ended = now
            t.add(c, now)

    def cost(self, instance_id: str) -> float:
        """What one instance has cost so far ($; 0 for one the ledger never saw)."""
        c = self._charges.get(instance_id)
        return 0.0 if c is None else c.cost(clock.monotonic())

    def share(self, instance_id: str, since: float, slots: int) -> float:
        """A task's share of one instance ($) for the slot it held from ``since`` until now
        (or until the instance's charge ended, if earlier): the price for that time divided
        by the instance's ``slots``.  An instance of one slot launched for the task
        (started at or after ``since``) is the task's whole: its billing minimum counts."""
        c = self._charges.get(instance_id)
        if c is None:
            return 0.0
        now = clock.monotonic()
        end = now if c.ended is None else min(c.ended, now)
        held = max(0.0, end - max(c.started, since))
        if slots == 1 and c.started >= since:
            held = max(held, c.billing_min_s)
        return c.price_per_hour * held / 3600.0 / max(1, slots)

    def summary(self, *, pool: str | Collection[str] | None = None, provider: str | None = None) -> SpendSummary:
        """Spend and burn of one pool (or several, or the whole fleet: None)."""
        pools = (pool,) if isinstance(pool, str) else pool
        now = clock.monotonic()
        spent = burn = 0.0
        live = 0
        for (p, prov), t in self._totals.items():
            if (pools is None or p in pools) and (provider is None or prov == provider):
                spent += t.spent(self._charges, now)
                burn += t.burn
                live += t.live
        return SpendSummary(spent=spent, burn_per_hour=max(0.0, burn), live=live)

    def by_provider(self, pool: str | None = None) -> dict[str, SpendSummary]:
        names = sorted({prov for (p, prov) in self._totals if pool is None or p == pool})
        return {p: self.summary(pool=pool, provider=p) for p in names}

    def admit(self, count: int, price_per_hour: float, provider: str, *, pool: str,
              budget_per_hour: float | None, budget_total: float | None, pending_per_hour: float = 0.0,
              scope: str = "pool", counted: Collection[str] | None = None) -> int:
        """How many of ``count`` instances at ``price_per_hour`` fit both budgets now
        (``pending_per_hour``: $/h of launches decided and not yet recorded; ``counted``: the
        pools whose spend the budget covers, default ``pool`` itself, or the whole fleet when
        ``scope`` is ``fleet``); raises :class:`BudgetExceededError` when not even one does."""
        if price_per_hour <= 0 or (budget_per_hour is None and budget_total is None):
            return count
        s = self.summary(pool=None if scope == "fleet" else (counted or (pool,)))
        fit = count
        if budget_per_hour is not None:
            burn = s.burn_per_hour + pending_per_hour
            fit = min(fit, math.floor((budget_per_hour - burn) / price_per_hour + 1e-9))
            if fit < 1:
                would = burn + price_per_hour
                raise BudgetExceededError(
                    f"{scope} {pool!r}: launching one more {provider} instance at ${price_per_hour:.4f}/h would "
                    f"burn ${would:.4f}/h (now ${burn:.4f}/h); budget_per_hour is ${budget_per_hour:.4f}/h",
                    which="budget_per_hour", would_be=would, cap=budget_per_hour)
        if budget_total is not None:
            minimum = price_per_hour * profile(provider).billing_min_s / 3600.0
            fit = min(fit, math.floor((budget_total - s.spent) / minimum + 1e-9))
            if fit < 1:
                would = s.spent + minimum
                raise BudgetExceededError(
                    f"{scope} {pool!r}: launching one more {provider} instance at ${price_per_hour:.4f}/h would "
                    f"bring spend to ${would:.4f} (spent ${s.spent:.4f}, billing minimum "
                    f"${minimum:.4f}); budget_total is ${budget_total:.4f}",
                    which="budget_total", would_be=would, cap=budget_total)
        return fit


__all__ = ["Charge", "SpendLedger", "SpendSummary"]
