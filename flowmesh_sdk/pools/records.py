"""The records a pool is made of and reports: what a fleet lends each of its pools
(:class:`PoolContext`), one pass of a task through a pool (:class:`TaskRun`), and a pool's
numbers (:class:`PoolStats`).  A small module of its own so that the pool
(:mod:`.base`) and its instance side (:mod:`.machines`) both import it and neither the
other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .. import clock
from ..control.backend import ControlBackend
from ..control.events import EventBus
from ..control.limits import Quota
from ..control.spend import SpendLedger, SpendSummary
from ..images import ImageResolver, PullBudget
from ..lifecycle import Lifecycle, TaskState
from ..observe import tracing
from ..provisioning import Provisioner
from ..remote.runner import Runner
from ..remote.runtime import ContainerRuntime
from ..specs import ExecResult, InfraFailure, PhaseTimings
from .bootstrap import BootstrapPolicy


@dataclass(frozen=True, slots=True)
class PoolContext:
    """What a fleet lends each of its pools."""

    fleet: str
    owner: str
    bus: EventBus
    images: ImageResolver
    quota: Quota
    control: ControlBackend
    pulls: PullBudget
    provisioner: Provisioner
    authfile_for: Callable[[str], str | None]
    runtime_for: Callable[[Runner], ContainerRuntime]
    bootstrap_timeout_s: float = 600.0
    bootstrap: BootstrapPolicy = field(default_factory=BootstrapPolicy)
    spend: SpendLedger = field(default_factory=SpendLedger)
    fleet_budget_per_hour: float | None = None
    fleet_budget_total: float | None = None
    run: str = ""   # the fleet's run id: on every instance, container, event and result


@dataclass(slots=True)
class TaskRun:
    """One pass of a task through the pool, with the marks its phases are cut from."""

    id: str
    name: str
    tenant: str
    lifecycle: Lifecycle[TaskState]
    marks: dict[str, float] = field(default_factory=dict)
    instance_id: str | None = None
    result: ExecResult | None = None
    error: str | None = None
    cancelled: bool = False
    image_digest: str | None = None
    attempts_left: int = 0   # further dispatches allowed if its instance is lost under it
    attempts: int = 0        # dispatches so far
    failure: InfraFailure | None = None   # what ended it, when the infrastructure did
    cost: float = 0.0        # $ of the slots its dispatches held (SpendLedger.share)
    trace: tracing.Journey | None = None   # its spans, when a tracer is configured

    def mark(self, what: str) -> None:
        self.marks[what] = clock.monotonic()
        if self.trace is not None:
            self.trace.mark(what, self)

    def _span(self, a: str, b: str) -> float:
        m = self.marks
        return max(0.0, m[b] - m[a]) if a in m and b in m else 0.0

    def phases(self) -> PhaseTimings:
        """queued: waiting for the semaphore; scheduling: dispatch checks (image, quota)
        plus finding a slot; env_startup: instance and sandbox ready; execution: the work;
        teardown: sandbox destroyed and slot (or instance) given back."""
        return PhaseTimings(
            queued=self._span("checked", "admitted"),
            scheduling=self._span("submitted", "checked") + self._span("admitted", "placed"),
            env_startup=self._span("placed", "started"),
            execution=self._span("started", "finished"),
            teardown=self._span("finished", "torn_down"))


@dataclass(frozen=True, slots=True)
class PoolStats:
    name: str
    mode: str
    instances: int
    ready: int
    launching: int
    in_flight: int
    waiting: int
    free_slots: int
    warm: int
    warming: int
    spent: float = 0.0                 # $ so far (launch to confirmed termination)
    burn_per_hour: float = 0.0         # $/h of the instances live now
    by_provider: tuple[tuple[str, SpendSummary], ...] = ()


@dataclass(frozen=True, slots=True)
class AutoStats:
    name: str
    strict: PoolStats
    shared: PoolStats

    @property
    def spent(self) -> float:
        return self.strict.spent + self.shared.spent
