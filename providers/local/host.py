"""What this host has to carve into instances."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostCapacity:
    cpus: int
    memory_gb: float
    arch: str

    @classmethod
    def detect(cls) -> HostCapacity:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        mem_kb = 0
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemTotal:"):
                        mem_kb = int(line.split()[1])
                        break
        except OSError:
            pass
        machine = platform.machine()
        arch = "arm64" if machine in ("aarch64", "arm64") else "x86_64"
        return cls(cpus=cpus, memory_gb=round(mem_kb / 1024 / 1024, 2) or 1.0, arch=arch)
