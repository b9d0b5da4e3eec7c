"""What a run cost, from the metadata store (``flowmesh cost report``).

The total is what the instances of the run (or pool) cost: each at its price from launch
to confirmed termination, at least its billing minimum (the fleet's ledger's figure,
recorded at termination; a live one's from its times so far).  The tasks' own costs
(``TaskResult.cost``: each task's share of the slots it held) add up to part of it; the
rest is ``idle_usd``: warm capacity no task held, boots and billing minimums no task
waited through, instances lost before a task reached them (docs/cost-model.md, section 9).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..control.store import ChargeRow, MetadataStore, TaskRow

_ENDED = ("succeeded", "failed", "timed_out", "rejected", "cancelled")


@dataclass(frozen=True, slots=True)
class PlaceCost:
    """Instances of one provider, region and type."""

    provider: str
    region: str
    type: str
    spot: bool
    instances: int
    usd: float


@dataclass(frozen=True, slots=True)
class TenantCost:
    tenant: str
    tasks: int
    solved: int
    infra_failed: int
    usd: float          # the sum of its tasks' costs


@dataclass(frozen=True, slots=True)
class CostReport:
    run: str | None                 # None: every run in the store
    pool: str | None
    runs: tuple[str, ...]           # the runs it covers
    tasks: int                      # tasks that ended (running ones are in ``running``)
    running: int
    solved: int                     # exit 0
    infra_failed: int               # TaskResult.infra_failure set
    infra: tuple[tuple[str, int], ...]   # (InfraFailure value, tasks)
    total_usd: float                # what the instances cost
    tasks_usd: float                # the sum of the tasks' costs
    idle_usd: float                 # total_usd - tasks_usd: no task's (see the module doc)
    per_task_usd: float | None
    per_solved_usd: float | None
    by_place: tuple[PlaceCost, ...]
    by_tenant: tuple[TenantCost, ...]


def cost_report(store: MetadataStore, *, run: str | None = None, pool: str | None = None,
                now: float | None = None) -> CostReport:
    """The report of ``run`` (None: every run) and ``pool`` (None: every pool)."""
    at = time.time() if now is None else now
    tasks = store.tasks_of(run=run, pool=pool)
    charges = store.charges(run=run, pool=pool)
    ended = [t for t in tasks if t.state in _ENDED]
    solved = sum(_solved(t) for t in ended)
    infra: dict[str, int] = {}
    for t in ended:
        if t.infra_failure:
            infra[t.infra_failure] = infra.get(t.infra_failure, 0) + 1
    total = sum(c.billed(at) for c in charges)
    spent_on_tasks = sum(t.cost or 0.0 for t in tasks)
    runs = sorted({r for r in (*(t.run for t in tasks), *(c.run for c in charges)) if r})
    return CostReport(
        run=run, pool=pool, runs=tuple(runs), tasks=len(ended), running=len(tasks) - len(ended), solved=solved,
        infra_failed=sum(infra.values()), infra=tuple(sorted(infra.items())), total_usd=total,
        tasks_usd=spent_on_tasks, idle_usd=max(0.0, total - spent_on_tasks),
        per_task_usd=total / len(ended) if ended else None, per_solved_usd=total / solved if solved else None,
        by_place=_places(charges, at), by_tenant=_tenants(ended))


def spend_over_time(charges: Iterable[ChargeRow], *, now: float | None = None,
                    points: int = 200) -> dict[str, list[tuple[float, float]]]:
    """Cumulative $ per provider at ``points`` moments from the first launch to the last
    termination (or now): what ``cost report --plot`` draws."""
    at = time.time() if now is None else now
    rows = [c for c in charges if c.requested_at is not None]
    if not rows:
        return {}
    t0 = min(c.requested_at or at for c in rows)
    t1 = max(max((c.terminated_at or at) for c in rows), t0 + 1e-9)
    step = (t1 - t0) / max(1, points - 1)
    out: dict[str, list[tuple[float, float]]] = {}
    for prov in sorted({c.provider for c in rows}):
        mine = [c for c in rows if c.provider == prov]
        out[prov] = [(t - t0, sum(_billed_until(c, t, at) for c in mine))
                     for t in (t0 + i * step for i in range(points))]
    return out


def _billed_until(c: ChargeRow, t: float, now: float) -> float:
    """What ``c`` had cost by ``t``: its final cost pro rata over its life."""
    start, end = c.requested_at or now, c.terminated_at or now
    if t <= start:
        return 0.0
    life = max(end - start, 1e-9)
    return c.billed(now) * min(1.0, (t - start) / life)


def _solved(t: TaskRow) -> bool:
    return t.state == "succeeded" and t.exit_code == 0


def _places(charges: list[ChargeRow], at: float) -> tuple[PlaceCost, ...]:
    acc: dict[tuple[str, str, str, bool], list[float]] = {}
    for c in charges:
        a = acc.setdefault((c.provider, c.region or "", c.type or "", c.spot), [0, 0.0])
        a[0] += 1
        a[1] += c.billed(at)
    return tuple(PlaceCost(p, r, ty, s, int(n), usd) for (p, r, ty, s), (n, usd) in sorted(acc.items()))


def _tenants(ended: list[TaskRow]) -> tuple[TenantCost, ...]:
    acc: dict[str, list[float]] = {}
    for t in ended:
        a = acc.setdefault(t.tenant or "default", [0, 0, 0, 0.0])
        a[0] += 1
        a[1] += _solved(t)
        a[2] += bool(t.infra_failure)
        a[3] += t.cost or 0.0
    return tuple(TenantCost(k, int(n), int(s), int(f), usd) for k, (n, s, f, usd) in sorted(acc.items()))
