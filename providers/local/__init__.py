"""The ``local`` provider: this host carved into instances of the requested size."""

from .provider import LocalProvider

__all__ = ["LocalProvider"]
