"""Where a simulated run's CPU goes: the SDK's control plane, or the simulator standing in
for the cloud and its machines (providers/sim: the API's answers, the machines' podman and
agent replies; flowmesh_sdk/sim: the cloud model and the workload driver).

A profiling timer (``ITIMER_PROF``, every ``period_s`` of process CPU) samples the running
Python stack; each sample goes to the *innermost* frame that is project code --
``flowmesh_sdk/`` (the control plane) or ``providers/sim/`` and ``flowmesh_sdk/sim/`` (the simulator) -- so the
standard library (asyncio, json) and the SDK's clock count for whoever called them, and SDK code that the
simulated workload calls counts as control plane.  Samples with neither (the event loop
between callbacks, the garbage collector's aftermath) count as control plane: the
conservative side.  The virtual-time loop's driver (flowmesh_sdk/sim/loop.py) is not the
simulator's work and is skipped, and so is everything below the event loop's own
``_run_once``: a sample in the loop itself (its timer heap, its selector, resuming a
task) counts as control plane, not as the ``run_scenario`` frame that started the loop.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from types import FrameType

# the simulator's package is flowmesh_providers.sim, found under providers/ in a checkout (the
# editable install) or as flowmesh_providers/ (a link to it, as in .typecheck/)
_SIM = ("/providers/sim/", "/flowmesh_providers/sim/", "/flowmesh_sdk/sim/")
_SDK = "/flowmesh_sdk/"
_LOOP = "/flowmesh_sdk/sim/loop.py"
_PASS = ("/flowmesh_sdk/clock.py",)   # helpers both sides call: they count for their caller
_RUN_ONCE = ("/asyncio/base_events.py", "_run_once")   # the event loop: below it is only its driver


@dataclass
class CpuSplit:
    control_plane: int = 0
    simulator: int = 0

    @property
    def control_plane_share(self) -> float:
        total = self.control_plane + self.simulator
        return self.control_plane / total if total else 1.0


class Sampler:
    def __init__(self, period_s: float = 0.001) -> None:
        self.period_s = period_s
        self.split = CpuSplit()

    def _sample(self, _sig: int, frame: FrameType | None) -> None:
        f = frame
        while f is not None:
            path = f.f_code.co_filename
            if f.f_code.co_name == _RUN_ONCE[1] and path.endswith(_RUN_ONCE[0]):
                break
            if path.endswith(_PASS):
                pass
            elif any(s in path for s in _SIM):
                if not path.endswith(_LOOP):
                    self.split.simulator += 1
                    return
            elif _SDK in path:
                self.split.control_plane += 1
                return
            f = f.f_back
        self.split.control_plane += 1

    def __enter__(self) -> CpuSplit:
        self.split = CpuSplit()
        self._old = signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, self.period_s, self.period_s)
        return self.split

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, self._old)
