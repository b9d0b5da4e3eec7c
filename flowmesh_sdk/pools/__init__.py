"""Ephemeral, persistent and automatic pools, and the instance side they own."""

from .auto import AutoPool, AutoStats
from .base import Pool, PoolStats
from .ephemeral import EphemeralPool
from .machines import Machines, ReconcileResult
from .persistent import PersistentPool

__all__ = ["AutoPool", "AutoStats", "EphemeralPool", "Machines", "PersistentPool", "Pool", "PoolStats",
           "ReconcileResult"]
