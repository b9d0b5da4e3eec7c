"""Whose fault a task's end was: the :class:`~flowmesh_sdk.specs.InfraFailure` a pool
records in ``TaskResult.infra_failure`` (None: the task's own command decided it).

The error that ended the task says it (an ``InstanceLost`` says whether its instance was
preempted), with one exception: the instance it ran on was
given up (heartbeat, reconcile, a failed probe after an error), and then the reason the
instance was given up (:attr:`ManagedInstance.loss`: preempted or lost) is the answer.
A sandbox that died under its command while its instance stayed up is the command's own
outcome (``None``): a sandbox can kill itself, and masking that as an infrastructure
failure would spare the reward of a rollout that did it.  Bad input (``SpecError``) and
cancellation are not the infrastructure's either.
"""

from __future__ import annotations

from ..bidder.gates import NoFeasibleOffer
from ..errors import (AuthError, BootstrapError, BudgetExceededError, CapacityError, ContainerRuntimeError,
                      FlowMeshError, ImageNotFoundError, InstanceLost, PoolClosedError, ProviderError, QuotaError,
                      RegistryUnavailableError, SandboxClosedError, SandboxTimeout, SpecError)
from ..specs import InfraFailure
from .instance import ManagedInstance

_BY_CLASS: tuple[tuple[type[FlowMeshError] | tuple[type[FlowMeshError], ...], InfraFailure], ...] = (
    ((ImageNotFoundError, RegistryUnavailableError), InfraFailure.IMAGE_PULL),
    (BudgetExceededError, InfraFailure.BUDGET),
    ((CapacityError, QuotaError, NoFeasibleOffer), InfraFailure.CAPACITY),
    (PoolClosedError, InfraFailure.POOL_CLOSED),
    (InstanceLost, InfraFailure.INSTANCE_LOST),
    ((BootstrapError, ContainerRuntimeError, SandboxClosedError, SandboxTimeout), InfraFailure.SANDBOX_START),
    ((AuthError, ProviderError), InfraFailure.PROVIDER),
)


def lost_kind(exc: BaseException) -> InfraFailure | None:
    """What an error under a sandbox says of its instance: ``PREEMPTED`` or
    ``INSTANCE_LOST`` for an :class:`InstanceLost`, else None (the sandbox alone failed).
    What the sandbox-level integrations (SWE-ReX, mini-swe-agent) report."""
    if isinstance(exc, InstanceLost):
        return InfraFailure.PREEMPTED if exc.preempted else InfraFailure.INSTANCE_LOST
    return None


def infra_failure(exc: BaseException, inst: ManagedInstance | None, *, started: bool) -> InfraFailure | None:
    """What ended a task that raised ``exc`` on ``inst`` (None when nothing was placed);
    ``started``: its sandbox was running its command by then."""
    if inst is not None and inst.loss is not None:
        return inst.loss
    if not isinstance(exc, FlowMeshError) or isinstance(exc, SpecError):
        return None
    if started and not isinstance(exc, InstanceLost):
        return None   # its sandbox failed under its command, the instance still up
    if isinstance(exc, InstanceLost):
        return lost_kind(exc)
    for classes, kind in _BY_CLASS:
        if isinstance(exc, classes):
            return kind
    return InfraFailure.SANDBOX_START
