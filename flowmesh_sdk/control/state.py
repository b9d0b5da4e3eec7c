"""Which backend keeps a fleet's control state: :func:`open_backend` reads the
``FLOWMESH_STATE`` setting (or a fleet's ``state=`` argument, see
:func:`~flowmesh_sdk.control.backend.state_url`) and makes the in-process backend or the
Redis one (:mod:`flowmesh_sdk.control.redis`, imported only when asked for)."""

from __future__ import annotations

from .backend import ControlBackend, InProcessBackend, state_url


def open_backend(state: str | None = None, *, fleet: str = "default", lease_s: float = 5.0) -> ControlBackend:
    """The backend :func:`state_url` names, else in-process.

    ``redis://host:port/db`` is the Redis backend (the ``[redis]`` extra) of ``fleet``
    (its keys are that fleet's); ``memory`` (or unset) is in-process.  Nothing is contacted
    here: the fleet's start does that, and a Redis that cannot be reached is an error, never
    a silent fall-back to in-process."""
    url = state_url(state)
    if url is None:
        return InProcessBackend()
    from .redis import RedisBackend

    return RedisBackend(url, fleet=fleet, lease_s=lease_s)


__all__ = ["open_backend"]
