"""FlowMesh SDK: elastic, cost-aware pools of sandboxes and GPU workers for RL.

Importing this package imports no cloud SDK; providers load by name from the
``flowmesh_sdk.providers`` entry points.
"""

from .control import EventKind, QuotaLimits
from .errors import (AuthError, BootstrapError, BudgetExceededError, CapacityError, ContainerRuntimeError,
                     ControlPlaneUnavailableError, FlowMeshError, ImageNotFoundError, InstanceLost,
                     IntegrationMissingError, LifecycleError, NotFoundError, PoolClosedError, ProviderError,
                     ProviderUnavailableError, QuotaError, RegistryUnavailableError, RuntimeMissingError,
                     SandboxClosedError, SandboxFileError, SandboxTimeout, SpecError, StoreSchemaError,
                     ThrottledError)
from .bidder.gates import NoFeasibleOffer
from .cas.base import CasCorruptError, CasError, CasNotFoundError
from .imagebuild.build import ImageBuildError
from .registry.local import LocalRegistryError, RegistryNotInstalled
from .workers.errors import TrainingFailedError, WorkerStartError
from .fleet import Fleet
from .pools import AutoPool, EphemeralPool, PersistentPool, Pool
from .pools.bootstrap import BootstrapPolicy
from .sandbox import Sandbox
from .specs import InfraFailure, Provenance, ReuseKind
from .reuse import ResultReuse, ReusePolicy
from .workflows import Workflow
from .workers import InferenceEndpoint, InferenceSpec, InferenceWorker, TrainingSpec, TrainingWorker
from .specs import (ExecResult, InstanceSpec, Offer, PhaseTimings, PoolMode, PoolSpec, SandboxSize,
                    SandboxSpec, Task, TaskResult)

__version__ = "0.1.0"

__all__ = [
    "BootstrapPolicy",
    "InfraFailure", "Provenance", "ResultReuse", "ReuseKind", "ReusePolicy", "Workflow",
    "InferenceEndpoint", "InferenceSpec", "InferenceWorker", "TrainingSpec", "TrainingWorker",
    "AuthError", "AutoPool", "BudgetExceededError", "CapacityError", "EphemeralPool", "EventKind", "ExecResult", "Fleet", "FlowMeshError",
    "ImageNotFoundError", "InstanceLost", "InstanceSpec", "NotFoundError", "Offer", "PersistentPool",
    "PhaseTimings", "Pool", "PoolClosedError", "PoolMode", "PoolSpec", "ProviderError", "QuotaError",
    "QuotaLimits", "Sandbox", "SandboxSize", "SandboxSpec", "SandboxTimeout", "SpecError", "Task", "TaskResult",
    "ThrottledError",
    # the rest of the error tree (errors.py draws it)
    "BootstrapError", "CasCorruptError", "CasError", "CasNotFoundError", "ContainerRuntimeError",
    "ControlPlaneUnavailableError", "ImageBuildError", "IntegrationMissingError", "LifecycleError",
    "LocalRegistryError", "RegistryNotInstalled", "NoFeasibleOffer", "ProviderUnavailableError", "RegistryUnavailableError", "RuntimeMissingError",
    "SandboxClosedError", "SandboxFileError", "StoreSchemaError", "TrainingFailedError", "WorkerStartError",
]
