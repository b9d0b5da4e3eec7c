"""The reuse layer's vocabulary: what it needs of a pool, its policy, what it reports
(counts, lineage, call results), and the records passed between its parts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import SpecError
from ..specs import Provenance, ReuseKind, Task, TaskResult

__all__ = ["Answer", "CallResult", "Fresh", "LineageEntry", "Request", "ReuseCounts", "ReusePolicy", "TaskRunner"]


class TaskRunner(Protocol):
    """What the reuse layer needs of a pool."""

    name: str

    async def run_task(self, task: Task) -> TaskResult: ...


@dataclass(frozen=True, slots=True)
class ReusePolicy:
    """``cache_failures``: also publish a deterministic non-zero exit (1..127) -- a test
    run that fails on a patch is a real verdict worth keeping.  Timeouts, kills by signal
    and infra errors are never published, whatever this says."""

    cache_failures: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cache_failures, bool):
            raise SpecError("reuse.cache_failures", f"must be true or false, got {self.cache_failures!r}")


@dataclass(frozen=True, slots=True)
class ReuseCounts:
    """What the reuse layer did since it was made (this process)."""

    hits: int = 0
    joins: int = 0
    executions: int = 0
    bypassed: int = 0
    published: int = 0
    lost_races: int = 0         # executions whose publish lost to another writer
    corrupt: int = 0            # corrupt store entries detected (each recomputed)
    compute_saved_s: float = 0.0

    @property
    def requests(self) -> int:
        return self.hits + self.joins + self.executions + self.bypassed


@dataclass(frozen=True, slots=True)
class LineageEntry:
    """One request as the reuse layer answered it: who asked (tenant, workflow, name) for
    which work (``h_task``), how it was answered, and which result it got."""

    request_id: str
    name: str
    tenant: str
    workflow: str | None
    pool: str
    h_task: str | None              # None for a bypassed request
    outcome: ReuseKind
    result_digest: str | None       # the result record it got (None: nothing to store)
    computed_by: str | None         # task id of the run that computed that result
    saved_s: float                  # compute this request did not spend (hit or join)
    at: float


@dataclass(frozen=True, slots=True)
class CallResult:
    """The result of an in-process operator (an inference call, a training step, a reward
    function) run through :meth:`~flowmesh_sdk.reuse.ResultReuse.call`."""

    request_id: str
    name: str
    output: bytes | None
    error: str | None
    reuse: ReuseKind
    provenance: Provenance | None
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None and self.output is not None


@dataclass(slots=True)
class Fresh:
    """What one execution produced, before publishing."""

    record: dict[str, Any] | None   # the result record (None: nothing worth storing)
    publish: bool
    share: bool
    compute_s: float
    task_id: str
    pool: str
    instance_id: str | None
    inputs: Mapping[str, bytes] = field(default_factory=dict)
    native: Any = None              # the TaskResult / CallResult of the run itself


@dataclass(frozen=True, slots=True)
class Answer:
    """A result record and the provenance of the run that computed it."""

    record: dict[str, Any]
    provenance: Provenance


@dataclass(frozen=True, slots=True)
class Request:
    """One request for one work, as the reuse layer's parts pass it between them."""

    request_id: str
    name: str
    tenant: str
    workflow: str | None
    pool: str
    h_task: str
    h_exec: str
