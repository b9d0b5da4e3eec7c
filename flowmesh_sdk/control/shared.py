"""Records of a fleet shared by several coordinators (the Redis backend makes them; the
fleet, ``flowmesh status`` and ``flowmesh gc`` read them).  Nothing here talks to Redis."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SharedInstance:
    """An instance the fleet owns, as the shared state lists it."""

    id: str
    fleet: str
    pool: str
    provider: str
    holder: str          # the live coordinator responsible for it (an adopter after a crash)
    host: str = ""       # the host of the coordinator that launched it


@dataclass(frozen=True, slots=True)
class Adoption:
    """One dead coordinator's work taken over (``flowmesh status`` lists them)."""

    dead: str
    adopter: str
    leases: int        # permits, tenant slots and task claims dropped
    tasks: int         # claimed tasks put back at the front of their queues
    instances: int     # instances now held by the adopter
    at_ms: int         # server time of the adoption
    adopted: tuple[SharedInstance, ...] = ()   # those instances (holder: the adopter)


@dataclass(frozen=True, slots=True)
class SharedHolders:
    """What the shared state says about a fleet's instances now: each one's holder, and
    which coordinators still hold a lease (``flowmesh gc`` never takes an instance a live
    coordinator holds -- an adopted one included -- and takes those of lapsed ones)."""

    instances: tuple[SharedInstance, ...]
    live: frozenset[str]
