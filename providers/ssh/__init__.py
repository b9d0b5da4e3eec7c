"""The ``ssh`` provider: the user's own machines (bring your own cluster), reached over SSH."""

from .inventory import SshHost, load_inventory
from .provider import SshProvider

__all__ = ["SshHost", "SshProvider", "load_inventory"]
