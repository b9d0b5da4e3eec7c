"""The instances one pool holds, as its :class:`~.machines.Machines` and the components
it is made of (:mod:`.launching`, :mod:`.terminating`) share them: by id, by (provider,
region) -- one describe each -- and the ids whose termination failed (a reconcile
terminates them again) or is under way."""

from __future__ import annotations

from dataclasses import dataclass, field

from .instance import ManagedInstance


@dataclass(slots=True)
class Inventory:
    """One pool's instances (see the module docstring)."""

    instances: dict[str, ManagedInstance] = field(default_factory=dict)
    where: dict[tuple[str, str], dict[str, ManagedInstance]] = field(default_factory=dict)
    termination_failed: set[str] = field(default_factory=set)
    terminating: set[str] = field(default_factory=set)

    def add(self, mi: ManagedInstance) -> None:
        """``mi`` launched: held, and found by its provider and region."""
        self.instances[mi.id] = mi
        self.where.setdefault(mi.where, {})[mi.id] = mi

    def drop(self, mi: ManagedInstance) -> None:
        """``mi`` is gone: no longer held, nor found anywhere."""
        self.instances.pop(mi.id, None)
        self.termination_failed.discard(mi.id)
        group = self.where.get(mi.where)
        if group is not None:
            group.pop(mi.id, None)
            if not group:
                del self.where[mi.where]
