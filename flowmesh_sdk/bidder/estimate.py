"""What a workload will cost and how long each phase takes, before anything is launched.

For N tasks submitted at once (MegaFlow's concurrency setting), on a plan from the
bidder, per task and in MegaFlow's four phases:

* **submission** -- the coordinator accepting the N tasks, ``SUBMIT_RATE`` tasks/s
  (an assumption for the SDK's in-process coordinator; the control-plane benchmark
  measures it); mean over tasks = N / (2 * rate);
* **scheduling** -- waiting for the task's instance launch call to be accepted under the
  provider's published API rate limits (token buckets of
  :class:`~flowmesh_sdk.catalog.profiles.ProviderProfile`, calls of at most
  ``max_batch`` instances); mean over tasks;
* **environment startup** -- instance boot (``boot_s``), the image pull sharing the
  instance's registry bandwidth with the other slots starting at the same time
  (:mod:`.throughput`), container start; an image resident there is not pulled;
* **execution** -- the task's minutes, times the expected re-run factor when the market
  can interrupt (:mod:`.cost`).

Billing: an instance is paid from its launch until its last task ends (boot + pull +
execution); ephemeral instances hold one task.  Total $ = sum over instances of C(j) x
billed hours, where C(j) is the $/h after the interruption factor.

:func:`phase_estimate` is the per-phase function on its own, with the provider's launch
latency and rate-limit parameters passed in, so a fleet simulator can call it with
measured or sampled parameters instead of the profile's defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..catalog.profiles import Bucket, ProviderProfile, profile
from ..catalog.records import CatalogRow
from .cost import hazard_per_hour, interruption_factor
from ..errors import SpecError
from ..specs import check_number
from .demand import Demand, TenantAffinity, check_demand
from .gates import NoFeasibleOffer
from .planner import Plan, plan
from .policy import Policy
from .throughput import CONTAINER_START_S, pull_seconds

SUBMIT_RATE = 1000.0          # tasks/s the coordinator accepts (assumption, see module doc)
CHEAPEST = Policy(w_t=0.0, w_c=1.0, w_l=0.0)


def launch_times(instances: int, buckets: Sequence[Bucket], max_batch: int) -> list[float]:
    """Seconds after t=0 at which each of ``instances`` launches is accepted, when they
    are asked for in calls of ``max_batch`` as fast as the buckets allow (all full at 0)."""
    check_number("max_batch", max_batch, lo=1, integer=True)
    if instances <= 0:
        return []
    tokens = [b.capacity for b in buckets]
    now = 0.0
    out: list[float] = []
    left = instances
    while left > 0:
        size = min(max_batch, left)
        needs = [float(size) if b.per_instance else 1.0 for b in buckets]
        if any(need > b.capacity for need, b in zip(needs, buckets)):   # split an oversize call
            size = int(min(b.capacity for b in buckets if b.per_instance))
            needs = [float(size) if b.per_instance else 1.0 for b in buckets]
        wait = max((max(0.0, need - tok) / b.refill_per_s for need, tok, b in zip(needs, tokens, buckets)),
                   default=0.0)
        now += wait
        tokens = [min(b.capacity, tok + b.refill_per_s * wait) - need
                  for tok, b, need in zip(tokens, buckets, needs)]
        out.extend([now] * size)
        left -= size
    return out


@dataclass(frozen=True, slots=True)
class PhaseEstimate:
    """Mean seconds per task in each phase, plus the run's totals."""

    submission_s: float
    scheduling_s: float
    env_startup_s: float
    execution_s: float
    launch_span_s: float        # until the last launch call is accepted
    makespan_s: float           # until the last task ends
    instance_hours: float       # billed, summed over instances

    @property
    def total_s(self) -> float:
        return self.submission_s + self.scheduling_s + self.env_startup_s + self.execution_s


def phase_estimate(*, tasks: int, minutes: float, slots: int, vcpus: float, profile: ProviderProfile,
                   image_gb: float, resident: bool = False, hazard_per_hour: float = 0.0,
                   submit_rate: float = SUBMIT_RATE, launch_offset: int = 0,
                   ) -> PhaseEstimate:
    """Phases of ``tasks`` tasks packed ``slots`` per instance of ``vcpus`` vCPUs on one
    provider, described by ``profile`` (boot latency, launch buckets, batch size).

    ``launch_offset`` instances were launched before these in the same buckets (when a
    plan mixes instance types of one provider)."""
    n_inst = math.ceil(tasks / slots)
    accepted = launch_times(launch_offset + n_inst, profile.buckets, profile.max_batch)[launch_offset:]
    # tasks on instance i: slots, the last instance the remainder
    per_inst = [slots] * n_inst
    per_inst[-1] = tasks - slots * (n_inst - 1)
    pulls = 0.0 if resident else pull_seconds(image_gb, vcpus, concurrent=slots)
    startup = profile.boot_s + pulls + CONTAINER_START_S
    execution = minutes * 60.0 * interruption_factor(hazard_per_hour, minutes / 60.0)
    sched_sum = sum(t * k for t, k in zip(accepted, per_inst))
    submission_mean = tasks / (2.0 * submit_rate)
    submission_all = tasks / submit_rate
    billed = sum((startup if k == slots else profile.boot_s + (0.0 if resident else
                  pull_seconds(image_gb, vcpus, concurrent=k)) + CONTAINER_START_S) + execution
                 for k in per_inst) / 3600.0
    return PhaseEstimate(submission_s=submission_mean, scheduling_s=sched_sum / tasks, env_startup_s=startup,
                         execution_s=execution, launch_span_s=max(accepted) if accepted else 0.0,
                         makespan_s=submission_all + (max(accepted) if accepted else 0.0) + startup + execution,
                         instance_hours=billed)


@dataclass(frozen=True, slots=True)
class Estimate:
    """One provider/region: the cheapest feasible plan, its phases and its total $."""

    provider: str
    region: str
    plan: Plan
    phases: PhaseEstimate
    total_usd: float
    rates_source: str

    @property
    def instances(self) -> int:
        return self.plan.instances

    @property
    def per_hour(self) -> float:
        return self.plan.cost_per_hour


@dataclass(frozen=True, slots=True)
class Infeasible:
    provider: str
    region: str
    error: NoFeasibleOffer


def estimate_plan(p: Plan, prof: ProviderProfile | None = None) -> tuple[PhaseEstimate, float]:
    """Phases (task-weighted means over the plan's lines) and total $ of a plan on one provider."""
    demand = p.demand
    offset = 0
    parts: list[tuple[int, PhaseEstimate]] = []
    total = 0.0
    for line in p.lines:
        row = line.score.row
        pr = prof or profile(row.provider)
        ph = phase_estimate(tasks=line.sandboxes, minutes=demand.minutes, slots=line.score.slots,
                            vcpus=row.cpus, profile=pr, image_gb=demand.image_gb,
                            resident=demand.is_resident(row.provider, row.region, row.instance_type),
                            hazard_per_hour=hazard_per_hour(row, line.score.market), launch_offset=offset)
        offset += line.instances
        parts.append((line.sandboxes, ph))
        paid = line.score.bid_per_hour if line.score.bid_per_hour is not None else line.score.price_per_hour
        total += paid * ph.instance_hours
    n = sum(k for k, _ in parts)

    def mean(attr: str) -> float:
        return sum(k * getattr(ph, attr) for k, ph in parts) / n

    merged = PhaseEstimate(submission_s=demand.count / (2.0 * SUBMIT_RATE), scheduling_s=mean("scheduling_s"),
                           env_startup_s=mean("env_startup_s"), execution_s=mean("execution_s"),
                           launch_span_s=max(ph.launch_span_s for _, ph in parts),
                           makespan_s=max(ph.makespan_s for _, ph in parts),
                           instance_hours=sum(ph.instance_hours for _, ph in parts))
    return merged, total


def estimate(rows: Sequence[CatalogRow], demand: Demand, *, policy: Policy = CHEAPEST,
             affinities: Mapping[str, TenantAffinity] | None = None,
             profiles: Mapping[str, ProviderProfile] | None = None,
             ) -> tuple[list[Estimate], list[Infeasible]]:
    """The cheapest feasible plan per provider/region (cheapest total first), and the
    provider/regions where nothing was feasible, with the gates that said why."""
    check_demand(demand)
    if not isinstance(policy, Policy):
        raise SpecError("policy", f"must be a Policy, got {policy!r}")
    groups: dict[tuple[str, str], list[CatalogRow]] = {}
    known: dict[str, set[str]] = {}   # provider -> its regions in the catalog
    for row in rows:
        if demand.providers and row.provider not in demand.providers:
            continue
        known.setdefault(row.provider, set()).add(row.region)
        if demand.regions and row.region not in demand.regions:
            continue
        groups.setdefault((row.provider, row.region), []).append(row)
    missing = [r for r in demand.regions if not any(r in regions for regions in known.values())]
    if missing:   # a region no row has (a typo, or another provider's): no plan could be made there
        where = f" of {', '.join(demand.providers)}" if demand.providers else ""
        listed = "; ".join(f"{prov}: {', '.join(map(repr, sorted(regions)[:6]))}"
                           + (f" and {len(regions) - 6} more" if len(regions) > 6 else "")
                           for prov, regions in sorted(known.items()))
        raise SpecError("demand.regions", f"{', '.join(map(repr, missing))}: no price catalog row{where} is in that "
                                          f"region; the catalog's regions: {listed or 'none'}")
    done: list[Estimate] = []
    failed: list[Infeasible] = []
    for (prov, region), group in sorted(groups.items()):
        local = replace(demand, providers=(prov,), regions=(region,))
        try:
            p = plan(group, local, policy, affinities)
        except NoFeasibleOffer as exc:
            failed.append(Infeasible(prov, region, exc))
            continue
        prof = (profiles or {}).get(prov) or profile(prov)
        phases, total = estimate_plan(p, prof)
        done.append(Estimate(prov, region, p, phases, total, prof.rates_source))
    done.sort(key=lambda e: (e.total_usd, e.provider, e.region))
    return done, failed


def centralized(rows: Sequence[CatalogRow], demand: Demand, instance_type: str, tasks_per_instance: int,
                profiles: Mapping[str, ProviderProfile] | None = None) -> Estimate:
    """MegaFlow's centralized baseline: ``instance_type`` machines holding
    ``tasks_per_instance`` tasks each (however many cores that leaves a task), warm
    (persistent) -- the cheapest priced row of that type."""
    check_demand(demand)
    check_number("tasks_per_instance", tasks_per_instance, lo=1, integer=True)
    mine = [r for r in rows if r.instance_type == instance_type]
    if not mine:
        raise NoFeasibleOffer(f"centralized {instance_type}", 0, ())
    best: tuple[float, Estimate] | None = None
    last_error: NoFeasibleOffer | None = None
    for row in mine:
        local = replace(demand, cpus=row.cpus / tasks_per_instance, memory_gb=row.memory_gb / tasks_per_instance,
                        gpus=0, gpu_name=None, model=None, mode="persistent", max_per_instance=tasks_per_instance,
                        providers=(row.provider,), regions=(row.region,), arch=None)
        try:
            p = plan([row], local, CHEAPEST)
        except NoFeasibleOffer as exc:
            last_error = exc
            continue
        prof = (profiles or {}).get(row.provider) or profile(row.provider)
        phases, total = estimate_plan(p, prof)
        est = Estimate(row.provider, row.region, p, phases, total, prof.rates_source)
        if best is None or total < best[0]:
            best = (total, est)
    if best is None:
        assert last_error is not None
        raise last_error
    return best[1]


__all__ = ["CHEAPEST", "Estimate", "Infeasible", "PhaseEstimate", "SUBMIT_RATE", "centralized", "estimate",
           "estimate_plan", "launch_times", "phase_estimate"]
