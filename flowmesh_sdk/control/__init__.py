"""Control plane: the three tiers (rate limits, semaphores, quotas), events, metadata."""

from .backend import ControlBackend, InProcessBackend
from .events import Event, EventBus, EventKind, Subscription
from .limits import Quota, QuotaLimits, Semaphore, TokenBucket
from .store import MetadataStore

__all__ = ["ControlBackend", "Event", "EventBus", "EventKind", "InProcessBackend", "MetadataStore",
           "Quota", "QuotaLimits", "Semaphore", "Subscription", "TokenBucket"]
