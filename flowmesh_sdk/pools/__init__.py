"""Ephemeral and persistent pools."""

from .base import Pool, PoolStats
from .ephemeral import EphemeralPool
from .persistent import PersistentPool

__all__ = ["EphemeralPool", "PersistentPool", "Pool", "PoolStats"]
