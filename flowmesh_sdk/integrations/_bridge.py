"""Calls from a worker thread into the event loop a FlowMesh sandbox or pool lives on.

mini-swe-agent's agents call ``env.execute`` synchronously, TRL calls its reward functions
from the training thread (or from a loop of its own); the sandboxes and pools they use
belong to the loop they were made on.  :class:`LoopBridge` runs a coroutine on that loop
and waits for it; an interrupt while waiting cancels the coroutine there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..errors import SpecError

T = TypeVar("T")


class LoopBridge:
    """Run coroutines on ``loop`` (a running loop in another thread) from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @classmethod
    def current(cls) -> LoopBridge:
        """The bridge to the loop running in this thread (call it from async code)."""
        try:
            return cls(asyncio.get_running_loop())
        except RuntimeError as exc:
            raise SpecError("loop", "no event loop is running here: create this object inside "
                                    "async code (the loop its sandbox or pool runs on), or pass "
                                    "a flowmesh_sdk.sync object") from exc

    @classmethod
    def of(cls, obj: Any) -> LoopBridge:
        """The bridge to the loop ``obj`` lives on: a ``flowmesh_sdk.sync`` object's private
        loop, else the loop running here (an async object is made and used on it)."""
        sync_loop = getattr(getattr(obj, "_loop", None), "loop", None)
        return cls(sync_loop) if isinstance(sync_loop, asyncio.AbstractEventLoop) else cls.current()

    def on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (blocking this thread)."""
        if self.on_loop():
            coro.close()
            raise SpecError("thread", "called on the event loop's own thread, where waiting would "
                                      "deadlock: run the blocking caller in a worker thread "
                                      "(await asyncio.to_thread(agent.run, task))")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    async def hop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the bridge's loop from any loop (directly when already on it)."""
        if self.on_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))
