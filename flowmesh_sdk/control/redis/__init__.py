"""The Redis control backend (the ``[redis]`` extra): one fleet shared by many
coordinators.  Importing this package does not import ``redis``; making a backend does,
with a clear error naming the extra when it is missing."""

from .backend import RedisBackend
from .client import RetrySettings
from ..shared import Adoption, SharedInstance
from .queue import Claim, TaskQueue

__all__ = ["Adoption", "Claim", "RedisBackend", "RetrySettings", "SharedInstance", "TaskQueue"]
