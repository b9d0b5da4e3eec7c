"""The lifecycle of a GPU worker, an explicit transition table like the instance's.

``STARTING`` (container starting, weights loading) -> ``READY`` (inference: the health
check passed and the model is listed, so it accepts requests; training: the job runs)
-> ``DRAINING`` (takes nothing new, finishes what it has, flushes) -> ``STOPPED``.
``FAILED`` is reachable from every state that is not terminal; a failed worker is never
used again.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from ..control.events import Event, EventBus, EventKind
from ..lifecycle import Lifecycle


class WorkerState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


_W = WorkerState
WORKER_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    _W.STARTING: frozenset({_W.READY, _W.FAILED, _W.STOPPED}),
    _W.READY: frozenset({_W.DRAINING, _W.FAILED}),
    _W.DRAINING: frozenset({_W.STOPPED, _W.FAILED}),
    _W.STOPPED: frozenset(),
    _W.FAILED: frozenset(),
}


def worker_lifecycle(name: str = "") -> Lifecycle:
    """A fresh lifecycle in STARTING (``Lifecycle`` checks against this table)."""
    return Lifecycle(WORKER_TRANSITIONS, WorkerState.STARTING, f"worker {name}")


class WorkerBase:
    """What both roles share: the lifecycle, and worker events on the fleet's bus."""

    name: str
    fleet: str
    instance_id: str | None
    bus: EventBus | None
    lifecycle: Lifecycle

    @property
    def state(self) -> WorkerState:
        return self.lifecycle.state

    def _emit(self, kind: EventKind, detail: str = "") -> None:
        if self.bus is not None:
            self.bus.publish(Event(kind, self.fleet, instance_id=self.instance_id, task_name=self.name,
                                   detail=detail))
