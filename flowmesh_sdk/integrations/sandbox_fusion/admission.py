"""Admission of the server's requests: as many at once as the pool has slots, a bounded
FIFO queue behind them, an answer at once when the queue is full, and a bounded wait in it.

The pool has its own (unbounded) queue; this one in front of it is what lets the server
say "overloaded" instead of holding a connection open for ever, the SandboxFusion
deployments' hang at many workers.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from ... import timers
from ...errors import SpecError
from ...specs import check_number

__all__ = ["Admission", "AdmissionStats", "Admit", "pool_slots"]


class Admit(enum.Enum):
    OK = "ok"                    # a slot is held: call release() when done
    OVERLOADED = "overloaded"    # every slot busy and the queue full: refused at once
    TIMED_OUT = "timed_out"      # queued, but no slot came within the wait
    CLOSED = "closed"            # the server is shutting down


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    slots: int
    queue_size: int
    running: int
    queued: int
    admitted: int       # since the start
    overloaded: int     # refused with the queue full
    timed_out: int      # gave up waiting in the queue


class Admission:
    """``slots`` requests at once, at most ``queue_size`` more waiting (FIFO)."""

    def __init__(self, slots: int, queue_size: int) -> None:
        check_number("server.slots", slots, lo=1, hi=1_000_000, integer=True)
        check_number("server.queue_size", queue_size, lo=0, hi=1_000_000, integer=True)
        self.slots = slots
        self.queue_size = queue_size
        self._sem = asyncio.Semaphore(slots)
        self._running = 0
        self._queued = 0
        self._admitted = 0
        self._overloaded = 0
        self._timed_out = 0
        self._closed = False

    async def acquire(self, wait_s: float) -> Admit:
        """Take a slot, queueing at most ``wait_s`` seconds for one."""
        if self._closed:
            return Admit.CLOSED
        if self._running >= self.slots and self._queued >= self.queue_size:
            self._overloaded += 1
            return Admit.OVERLOADED
        self._queued += 1
        try:
            async with timers.timeout(wait_s):
                await self._sem.acquire()   # a cancelled acquire gives a granted permit back
        except TimeoutError:
            self._timed_out += 1
            return Admit.TIMED_OUT
        finally:
            self._queued -= 1
        if self._closed:
            self._sem.release()
            return Admit.CLOSED
        self._running += 1
        self._admitted += 1
        return Admit.OK

    def release(self) -> None:
        self._running -= 1
        self._sem.release()

    def close(self) -> None:
        """Admit nothing more (those queued get ``CLOSED`` when their turn comes)."""
        self._closed = True

    def stats(self) -> AdmissionStats:
        return AdmissionStats(self.slots, self.queue_size, self._running, self._queued, self._admitted,
                              self._overloaded, self._timed_out)


def pool_slots(pool: Any) -> int:
    """How many sandboxes ``pool`` runs at once: its capacity (``concurrency``, else its
    instances times the slots of each; the slots per instance of a bidder-shaped pool are
    the best-ranked offer's, which only the pool knows).  An auto pool's requests take its
    default isolation's half."""
    inner = pool
    if hasattr(pool, "strict") and hasattr(pool, "shared"):   # an AutoPool
        inner = pool.strict if pool.spec.default_isolation == "strict" else pool.shared
    capacity = getattr(inner, "capacity", None)
    if not isinstance(capacity, int):
        raise SpecError("server.pool", f"must be a FlowMesh pool, got {type(pool).__name__}")
    return capacity
