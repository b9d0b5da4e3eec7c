"""The rows :class:`~flowmesh_sdk.control.store.MetadataStore` reads back: pools,
instances, tasks, reuse, spend, charges and launch decisions (each importable from
:mod:`flowmesh_sdk.control.store` too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolRow:
    fleet: str
    name: str
    spec: str
    created_at: float
    drained_at: float | None


@dataclass(frozen=True, slots=True)
class InstanceRow:
    id: str
    fleet: str
    pool: str
    state: str
    requested_at: float | None
    ready_at: float | None
    terminated_at: float | None
    detail: str
    run: str | None = None


@dataclass(frozen=True, slots=True)
class TaskRow:
    id: str
    fleet: str
    pool: str
    name: str
    state: str
    instance_id: str | None
    exit_code: int | None
    queued_s: float | None
    scheduling_s: float | None
    env_startup_s: float | None
    execution_s: float | None
    teardown_s: float | None
    submitted_at: float | None
    finished_at: float | None
    detail: str | None
    run: str | None = None
    tenant: str | None = None
    cost: float | None = None             # $ (TaskResult.cost)
    infra_failure: str | None = None      # TaskResult.infra_failure's value


@dataclass(frozen=True, slots=True)
class ReuseRow:
    id: str
    fleet: str
    pool: str
    name: str | None
    outcome: str                 # hit | joined | executed
    h_task: str | None
    tenant: str | None
    workflow: str | None
    result: str | None           # digest of the result record the request got
    computed_by: str | None      # task id of the run that computed it
    saved_s: float | None
    at: float


@dataclass(frozen=True, slots=True)
class ReuseSummary:
    fleet: str
    hits: int
    joins: int
    executions: int
    saved_s: float


@dataclass(frozen=True, slots=True)
class SpendRow:
    fleet: str
    pool: str
    provider: str
    spent: float            # $
    burn_per_hour: float    # $/h of the instances still live
    live: int


@dataclass(frozen=True, slots=True)
class ChargeRow:
    """One instance with what it cost: ``cost`` as the fleet's ledger recorded it at its
    confirmed termination (its own clock's), else ``billed(now)`` from its times here."""

    id: str
    fleet: str
    pool: str
    provider: str
    region: str | None
    type: str | None
    spot: bool
    price_per_hour: float
    billing_min_s: float
    run: str | None
    requested_at: float | None
    terminated_at: float | None
    cost: float | None          # $ recorded at termination (None: still live, or not recorded)

    def billed(self, now: float) -> float:
        if self.cost is not None:
            return self.cost
        start = self.requested_at or now
        return self.price_per_hour * max(self.billing_min_s, (self.terminated_at or now) - start) / 3600.0


@dataclass(frozen=True, slots=True)
class DecisionRow:
    fleet: str
    pool: str
    kind: str               # decided | failover | refused
    detail: str             # JSON for decided / refused; a sentence for failover
    at: float


__all__ = ["ChargeRow", "DecisionRow", "InstanceRow", "PoolRow", "ReuseRow", "ReuseSummary", "SpendRow", "TaskRow"]
