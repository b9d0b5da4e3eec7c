"""Errors of the GPU worker roles.  Both are :class:`ContainerRuntimeError` (a worker is a
container), so they sit in the SDK's one tree under :class:`FlowMeshError`."""

from __future__ import annotations

from ..errors import ContainerRuntimeError


class WorkerStartError(ContainerRuntimeError):
    """A worker did not join: its launch plan was refused, its container exited, or it did
    not pass its health check by the deadline.  The message carries the last health answer
    and the tail of the container's log; the container has been removed."""


class TrainingFailedError(ContainerRuntimeError):
    """A training job exited non-zero or ran past its deadline.  ``exit_code`` is None on a
    timeout; ``log_tail`` holds the job's last output lines."""

    def __init__(self, message: str, *, exit_code: int | None, log_tail: str) -> None:
        self.exit_code = exit_code
        self.log_tail = log_tail
        super().__init__(message)
