"""How an instance came up: :class:`BootstrapStep` and :class:`BootstrapReport`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BootstrapStep:
    """One step of bringing an instance up.  ``changed`` is False when the step found
    things already so (a second bootstrap of the same machine changes nothing)."""

    name: str
    seconds: float
    changed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class BootstrapReport:
    """The steps an instance went through before it was READY, in order, timed."""

    instance_id: str
    steps: tuple[BootstrapStep, ...]

    @property
    def total_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    def summary(self) -> str:
        """One line: ``reach 0.01s, runtime 0.20s (podman 4.3.1), ...``."""
        return ", ".join(f"{s.name} {s.seconds:.2f}s" + (f" ({s.detail})" if s.detail else "")
                         for s in self.steps)
