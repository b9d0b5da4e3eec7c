"""Instance and task lifecycles as explicit transition tables with timestamped history.

An invalid transition is a bug in the caller and raises :class:`LifecycleError`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .errors import LifecycleError


class InstanceState(str, enum.Enum):
    REQUESTED = "requested"    # launch call accepted by the provider
    RUNNING = "running"        # the machine runs; not yet bootstrapped
    READY = "ready"            # bootstrapped: runtime present, accepts sandboxes
    DRAINING = "draining"      # takes no new sandboxes; finishing the current ones
    STOPPED = "stopped"        # the cloud reports it stopped: not running, not gone
    FAILED = "failed"          # unhealthy: never used again, to be terminated
    TERMINATING = "terminating"    # terminate asked; retried until the provider no longer lists it
    TERMINATION_FAILED = "termination_failed"   # gave up: still listed (gc and the reconciler retry)
    TERMINATED = "terminated"  # gone (confirmed by the provider)


class TaskState(str, enum.Enum):
    SUBMITTED = "submitted"
    QUEUED = "queued"          # admitted by quota; waiting for a slot
    SCHEDULED = "scheduled"    # holds a slot; instance chosen or being launched
    STARTING = "starting"      # sandbox environment starting
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REJECTED = "rejected"      # refused at submission (quota, bad image)
    CANCELLED = "cancelled"


_I = InstanceState
INSTANCE_TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = {
    _I.REQUESTED: frozenset({_I.RUNNING, _I.FAILED, _I.TERMINATING, _I.TERMINATED}),
    _I.RUNNING: frozenset({_I.READY, _I.FAILED, _I.DRAINING, _I.STOPPED, _I.TERMINATING, _I.TERMINATED}),
    _I.READY: frozenset({_I.DRAINING, _I.FAILED, _I.STOPPED, _I.TERMINATING, _I.TERMINATED}),
    _I.DRAINING: frozenset({_I.TERMINATING, _I.TERMINATED, _I.FAILED}),
    _I.STOPPED: frozenset({_I.FAILED, _I.TERMINATING, _I.TERMINATED}),
    _I.FAILED: frozenset({_I.TERMINATING, _I.TERMINATED}),
    _I.TERMINATING: frozenset({_I.TERMINATED, _I.TERMINATION_FAILED}),
    _I.TERMINATION_FAILED: frozenset({_I.TERMINATING, _I.TERMINATED}),
    _I.TERMINATED: frozenset(),
}

_T = TaskState
_TASK_END = frozenset({_T.FAILED, _T.CANCELLED})
TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    _T.SUBMITTED: frozenset({_T.QUEUED, _T.REJECTED}) | _TASK_END,
    _T.QUEUED: frozenset({_T.SCHEDULED}) | _TASK_END,
    _T.SCHEDULED: frozenset({_T.STARTING}) | _TASK_END,
    # back to QUEUED: the instance was lost under the task, which is dispatched again
    _T.STARTING: frozenset({_T.RUNNING, _T.QUEUED}) | _TASK_END,
    _T.RUNNING: frozenset({_T.SUCCEEDED, _T.TIMED_OUT, _T.QUEUED}) | _TASK_END,
    _T.SUCCEEDED: frozenset(),
    _T.FAILED: frozenset(),
    _T.TIMED_OUT: frozenset(),
    _T.REJECTED: frozenset(),
    _T.CANCELLED: frozenset(),
}

S = TypeVar("S", InstanceState, TaskState)


@dataclass(frozen=True, slots=True)
class Transition(Generic[S]):
    state: S
    at: float  # wall-clock seconds since the epoch


class Lifecycle(Generic[S]):
    """A state machine over one transition table, remembering when each state began."""

    # The history is kept as one flat list (state, time, state, time, ...), not one
    # Transition each: a coordinator holds one lifecycle per task and instance, and the
    # garbage collector walks every object it holds (issue 29); :attr:`history` builds the
    # Transitions when asked.
    __slots__ = ("_table", "_log", "_what", "_state")

    def __init__(self, table: Mapping[S, frozenset[S]], initial: S, what: str = "") -> None:
        self._table: Mapping[S, frozenset[S]] = table
        self._log: list[Any] = [initial, time.time()]   # a state S, then its time (a float)
        self._what = what
        self._state: S = initial   # the last transition's, read far more often than it changes

    @property
    def state(self) -> S:
        return self._state

    @property
    def history(self) -> tuple[Transition[S], ...]:
        return tuple(map(Transition, self._log[0::2], self._log[1::2]))

    @property
    def terminal(self) -> bool:
        return not self._table[self.state]

    def can(self, new: S) -> bool:
        return new in self._table[self._state]

    def to(self, new: S) -> None:
        if new not in self._table[self._state]:
            allowed = ", ".join(sorted(s.value for s in self._table[self.state])) or "nothing"
            raise LifecycleError(f"{self._what or 'lifecycle'}: invalid transition "
                                 f"{self.state.value} -> {new.value} (allowed: {allowed})")
        self._log += (new, time.time())
        self._state = new

    def entered(self, state: S) -> float | None:
        """When ``state`` was last entered, or None."""
        log = self._log
        for i in range(len(log) - 2, -1, -2):
            if log[i] == state:
                return float(log[i + 1])
        return None

    def __repr__(self) -> str:
        return f"Lifecycle({self._what or ''} {self.state.value})"


def instance_lifecycle(instance_id: str = "") -> Lifecycle[InstanceState]:
    return Lifecycle(INSTANCE_TRANSITIONS, InstanceState.REQUESTED, f"instance {instance_id}")


def task_lifecycle(task_id: str = "") -> Lifecycle[TaskState]:
    return Lifecycle(TASK_TRANSITIONS, TaskState.SUBMITTED, f"task {task_id}")
