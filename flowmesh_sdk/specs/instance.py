"""The size of one machine: :class:`InstanceSpec`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from .checks import check_choice, check_number

ARCHES = ("x86_64", "arm64")


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """The size of one machine (a VM, a marketplace box, or a slice of this host)."""

    cpus: int = 8
    memory_gb: float = 16.0
    gpus: int = 0
    gpu_name: str | None = None
    disk_gb: int = 100
    arch: str = "x86_64"

    def __post_init__(self) -> None:
        check_number("instance.cpus", self.cpus, lo=1, hi=1024, integer=True)
        check_number("instance.memory_gb", self.memory_gb, lo=0, hi=32768, lo_open=True)
        check_number("instance.gpus", self.gpus, lo=0, hi=16, integer=True)
        check_number("instance.disk_gb", self.disk_gb, lo=1, hi=65536, integer=True)
        check_choice("instance.arch", self.arch, ARCHES)
        if self.gpu_name is not None and (not isinstance(self.gpu_name, str) or not self.gpu_name.strip()
                                          or not self.gpu_name.isprintable()):
            raise SpecError("instance.gpu_name", f"must be a GPU model name such as 'H100', got {self.gpu_name!r}")
        if self.gpu_name is not None and self.gpus == 0:
            raise SpecError("instance.gpu_name", "set only when instance.gpus >= 1")
