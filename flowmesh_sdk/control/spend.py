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

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

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

    def cost(self, now: float) -> float:
        end = self.ended if self.ended is not None else now
        return self.price_per_hour * max(self.billing_min_s, end - self.started) / 3600.0


@dataclass(frozen=True, slots=True)
class SpendSummary:
    spent: float            # $ so far
    burn_per_hour: float    # $/h of what is live now
    live: int               # instances accruing


class SpendLedger:
    """Every charge of one fleet; pools and providers are views over it."""

    def __init__(self) -> None:
        self._charges: dict[str, Charge] = {}

    def start(self, instance_id: str, *, pool: str, provider: str, price_per_hour: float,
              billing_min_s: float | None = None) -> None:
        if instance_id in self._charges:
            return
        minimum = profile(provider).billing_min_s if billing_min_s is None else billing_min_s
        self._charges[instance_id] = Charge(instance_id, pool, provider, float(price_per_hour),
                                            clock.monotonic(), minimum)

    def end(self, instance_id: str) -> None:
        c = self._charges.get(instance_id)
        if c is not None and c.ended is None:
            c.ended = clock.monotonic()

    def cost(self, instance_id: str) -> float:
        """What one instance has cost so far ($; 0 for one the ledger never saw)."""
        c = self._charges.get(instance_id)
        return 0.0 if c is None else c.cost(clock.monotonic())

    def _select(self, pools: Collection[str] | None, provider: str | None) -> Iterable[Charge]:
        return (c for c in self._charges.values()
                if (pools is None or c.pool in pools) and (provider is None or c.provider == provider))

    def summary(self, *, pool: str | Collection[str] | None = None, provider: str | None = None) -> SpendSummary:
        """Spend and burn of one pool (or several, or the whole fleet: None)."""
        pools = (pool,) if isinstance(pool, str) else pool
        now = clock.monotonic()
        spent = burn = 0.0
        live = 0
        for c in self._select(pools, provider):
            spent += c.cost(now)
            if c.ended is None:
                burn += c.price_per_hour
                live += 1
        return SpendSummary(spent=spent, burn_per_hour=burn, live=live)

    def by_provider(self, pool: str | None = None) -> dict[str, SpendSummary]:
        names = sorted({c.provider for c in self._select(None if pool is None else (pool,), None)})
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
