"""Virtual time for the simulator: an asyncio event loop whose clock jumps.

:class:`VirtualTimeLoop` is a normal selector event loop except for two things: its
``time()`` is a counter, and when nothing is ready to run its selector, instead of
sleeping until the next timer, moves the counter to that timer at once.  Everything
that waits on the loop's clock -- ``asyncio.sleep``, ``wait_for`` deadlines, and the
control plane's own marks, which read :func:`flowmesh_sdk.clock.monotonic` -- therefore
runs on virtual time, and a hundred simulated minutes pass in the CPU time the code
itself needs.  Real I/O still works (the selector is polled first), and while work
submitted with ``run_in_executor`` is in flight the clock stands still and the loop
waits for it for real, so a thread's work takes no virtual time.

The run is deterministic for a given program: timers fire in order of their virtual
time, ties in the order they were scheduled.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar, TypeVarTuple, Unpack

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_REAL_WAIT_S = 0.05   # how long to wait for real I/O while a thread works


class _JumpSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        loop = self.loop
        if ready or timeout == 0 or loop is None:
            return ready
        if timeout is None:
            return super().select(None)     # no timer at all: only real I/O can wake us
        if loop.executor_jobs:
            return super().select(min(timeout, _REAL_WAIT_S))
        loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        selector = _JumpSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = float(start)
        self.executor_jobs = 0

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def run_in_executor(self, executor: Executor | None, func: Callable[[Unpack[Ts]], T],
                        *args: Unpack[Ts]) -> asyncio.Future[T]:
        fut = super().run_in_executor(executor, func, *args)
        self.executor_jobs += 1
        fut.add_done_callback(self._job_done)
        return fut

    def _job_done(self, _fut: asyncio.Future[Any]) -> None:
        self.executor_jobs -= 1


def run(main: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """``asyncio.run`` on a fresh :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
