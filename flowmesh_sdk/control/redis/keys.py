"""Where a fleet's state lives in Redis: every key one fleet's coordinators write is under
``<namespace>:fleet:<fleet>:`` (namespace ``flowmesh`` by default), so one Redis can hold
several fleets and none reads, claims or adopts another's work.

    flowmesh:fleet:<fleet>:coords | epoch | adoptions | _wake     its coordinators
    flowmesh:fleet:<fleet>:coord:<id> [:leases | :instances]      one coordinator's lease
    flowmesh:fleet:<fleet>:q:<queue>:ready|tasks|claimed|...      its shared task queues
    flowmesh:fleet:<fleet>:sem:<key> | quota:<key>:... | bucket:<key>   the three tiers
    flowmesh:fleet:<fleet>:events | charges | instances | holder  stream, spend, instances

No key is shared between fleets: two fleets on one cloud account do not share the rate
limits of its API either (as two fleets on two Redis servers never did).  Pub/sub
channels are named after the keys they wake for, so they are the fleet's too.

The layout before the fleet was in every key (``flowmesh:q:<queue>:...``,
``flowmesh:coords``, ``flowmesh:events:<fleet>``) is :attr:`FleetKeys.legacy`; the
fleet's spend and instance hashes had the fleet in them already and kept their names.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import SpecError
from ...specs import check_name


@dataclass(frozen=True, slots=True)
class FleetKeys:
    namespace: str     # without a trailing ':'
    fleet: str

    def __post_init__(self) -> None:
        if not self.namespace or any(c in self.namespace for c in ":*?[]\\ \t\n"):
            raise SpecError("state.namespace", f"must be a non-empty name without ':', spaces or glob "
                                               f"characters, got {self.namespace!r}")
        check_name("fleet.name", self.fleet)

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:fleet:{self.fleet}:"

    @property
    def legacy(self) -> str:
        """The prefix of the layout without the fleet (read only to move what it holds)."""
        return f"{self.namespace}:"

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def of(self, fleet: str) -> FleetKeys:
        """Another fleet's keys in the same namespace (the readers: ``flowmesh status``, gc)."""
        return FleetKeys(self.namespace, fleet)

    def pattern(self, suffix: str = "") -> str:
        """A SCAN pattern: every fleet's keys in this namespace (ending in ``:suffix``)."""
        return f"{self.namespace}:fleet:*" + (f":{suffix}" if suffix else "")

    def fleet_of(self, key: str) -> str | None:
        """The fleet a key of this namespace belongs to (None: not a fleet's key)."""
        head = f"{self.namespace}:fleet:"
        if not key.startswith(head):
            return None
        fleet, sep, _ = key[len(head):].partition(":")
        try:
            check_name("fleet.name", fleet)
        except SpecError:
            return None
        return fleet if sep else None
