"""Ephemeral, persistent (warm machines or warm pods) and automatic pools, and the instance side they own."""

from .auto import AutoPool, AutoStats
from .base import MachinePool, Pool, PoolStats
from .ephemeral import EphemeralPool
from .machines import Machines, ReconcileResult
from .persistent import PersistentPool
from .warm_pods import WarmPodPool

__all__ = ["AutoPool", "AutoStats", "EphemeralPool", "MachinePool", "Machines", "PersistentPool", "Pool", "PoolStats",
           "ReconcileResult", "WarmPodPool"]
