"""The one clock the control plane reads: the running event loop's.

Under a normal asyncio loop ``loop.time()`` *is* ``time.monotonic()``, so nothing
changes; under the simulator's virtual-time loop (:mod:`flowmesh_sdk.sim.loop`) every
deadline, token bucket, phase mark and idle timer of the real pools runs on virtual
time, which is what lets 10,000 hundred-minute tasks play out in seconds.  Outside a
loop it falls back to ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import time


def monotonic() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
