"""Typed, validated records that cross every boundary of the SDK.

Bad input raises :class:`~flowmesh_sdk.errors.SpecError` naming the field, the value
given and the allowed range, at construction time.

This package is a face: each family of records lives in its own module, and every name is
imported from here as before (``from flowmesh_sdk.specs import PoolSpec``).

==============  ==================================================================
module          records
==============  ==================================================================
``checks``      the field checks (``check_number``, ``check_choice``, ...), ``ISOLATIONS``
``instance``    ``InstanceSpec``, ``ARCHES``
``sandbox``     ``SandboxSpec``, its network policy, ``KERNELS``, the sandbox minimums
``pool``        ``PoolSpec``, ``PoolMode``, ``SandboxSize``, ``SPOT_CHOICES``
``infra``       ``InfraEntry``, ``parse_infra``: a pool's search space, entry by entry
``policy``      ``Policy``, ``PRESETS``: the bidder's weights a pool holds
``offer``       ``Offer``
``task``        ``Task``, ``ExecResult``, ``PhaseTimings``, ``InfraFailure``, ``TaskResult``
``provenance``  ``ReuseKind``, ``Provenance``
``bootstrap``   ``BootstrapStep``, ``BootstrapReport``
==============  ==================================================================

The records import nothing above them (no bidder, no placement): what a record needs
lives here.
"""

from __future__ import annotations

from .bootstrap import BootstrapReport, BootstrapStep
from .checks import ISOLATIONS, check_choice, check_name, check_number, frozen_env
from .infra import InfraEntry, parse_infra
from .instance import ARCHES, InstanceSpec
from .offer import Offer
from .policy import PRESETS, Policy
from .pool import SPOT_CHOICES, PoolMode, PoolSpec, SandboxSize
from .provenance import Provenance, ReuseKind
from .sandbox import (KERNELS, MIN_SANDBOX_CPUS, MIN_SANDBOX_MEMORY_GB, SandboxSpec, allow_list_host,
                      network_policy)
from .task import ExecResult, InfraFailure, PhaseTimings, Task, TaskResult

__all__ = [
    "ARCHES", "ISOLATIONS", "KERNELS", "MIN_SANDBOX_CPUS", "MIN_SANDBOX_MEMORY_GB", "PRESETS", "SPOT_CHOICES",
    "BootstrapReport", "BootstrapStep", "ExecResult", "InfraEntry", "InfraFailure", "InstanceSpec", "Offer",
    "PhaseTimings", "Policy", "PoolMode", "PoolSpec", "Provenance", "ReuseKind", "SandboxSize", "SandboxSpec",
    "Task", "TaskResult", "allow_list_host", "check_choice", "check_name", "check_number", "frozen_env",
    "network_policy", "parse_infra",
]
