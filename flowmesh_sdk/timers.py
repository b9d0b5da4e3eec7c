"""Timeouts on the loop's clock without a loop timer each: the SDK's ``timeout``.

``async with timers.timeout(s):`` behaves as ``asyncio.timeout(s)``: past the deadline
the task is cancelled, and the block's ``CancelledError`` leaves it as ``TimeoutError``
unless someone else cancelled the task too (then the cancellation goes on).  Nested
deadlines and a cancellation from outside are told apart by the task's cancel count, as
``asyncio.timeout`` tells them apart.

What it saves is the timer.  ``asyncio.timeout`` makes a ``TimerHandle`` per block and
pushes it onto the loop's heap of timers, whose order is a Python ``__lt__`` called about
log2(n) times per timer, and a block that ends in time (nearly all of them) leaves its
cancelled handle in the heap until it comes to the top.  With thousands of sandboxes in
flight that heap holds tens of thousands of timers, a handful per command.  Here each
loop has one :class:`_Wheel`: deadlines wait in slots of :data:`TICK` seconds (a dict
each), the slots' numbers in a heap of ints (compared in C), and the loop holds a timer
for the earliest slot only.  Entering a block is a dict insert, leaving it a dict delete.  A
deadline fires at the end of its slot: up to ``TICK`` late, never early.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import weakref
from types import TracebackType

#: a deadline's slot, in seconds of the loop's clock: how late a deadline may fire
TICK = 0.001

_CREATED, _ENTERED, _EXPIRING, _EXPIRED, _EXITED = range(5)


class Deadline:
    """One ``async with timeout(...)`` block; ``expired()`` as ``asyncio.Timeout``'s."""

    __slots__ = ("_wheel", "_when", "_task", "_cancelling", "_slot", "_state")

    def __init__(self, wheel: _Wheel, when: float) -> None:
        self._wheel = wheel
        self._when = when
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._slot: int | None = None    # not in the wheel (no deadline, or not entered yet)
        self._state = _CREATED

    def expired(self) -> bool:
        return self._state in (_EXPIRING, _EXPIRED)

    async def __aenter__(self) -> Deadline:
        if self._state != _CREATED:
            raise RuntimeError("a deadline is entered once")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline is set inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._state = _ENTERED
        if self._when != math.inf:
            self._wheel.add(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._state == _ENTERED:
            self._state = _EXITED
            self._wheel.discard(self)
        elif self._state == _EXPIRING:
            self._state = _EXPIRED
            assert self._task is not None
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _expire(self) -> None:
        if self._state == _ENTERED:
            self._state = _EXPIRING
            assert self._task is not None
            self._task.cancel()


class _Wheel:
    """A loop's deadlines: ``slots`` maps a slot number to its deadlines (in the order set),
    ``due`` is a heap of slot numbers (some of them emptied already: skipped when they
    come up), ``armed`` the slot the loop's timer is set for (a timer set for another slot
    before is stale: it finds that out when it fires).  Nothing here holds the loop: it is
    the key the wheel is found by, and a closed loop is freed with its wheel."""

    __slots__ = ("loop", "slots", "due", "armed", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)
        self.slots: dict[int, dict[Deadline, None]] = {}
        self.due: list[int] = []
        self.armed: int | None = None

    def add(self, d: Deadline) -> None:
        slot = math.ceil(d._when / TICK)
        if slot * TICK < d._when:     # the division rounded down
            slot += 1
        d._slot = slot
        members = self.slots.get(slot)
        if members is None:
            members = self.slots[slot] = {}
            heapq.heappush(self.due, slot)
            if self.armed is None or slot < self.armed:
                self._arm(slot)
        members[d] = None

    def discard(self, d: Deadline) -> None:
        if d._slot is None:
            return
        members = self.slots.get(d._slot)
        if members is not None:
            members.pop(d, None)
            if not members:
                del self.slots[d._slot]   # its number stays in ``due`` until it comes up
                if len(self.due) > 2 * len(self.slots) + 64:   # mostly numbers of emptied slots
                    self.due = list(self.slots)
                    heapq.heapify(self.due)

    def _arm(self, slot: int) -> None:
        loop = self.loop()
        if loop is not None:
            self.armed = slot
            loop.call_at(slot * TICK, self._fire, slot)

    def _fire(self, slot: int) -> None:
        loop = self.loop()
        if slot != self.armed or loop is None:
            return        # stale: an earlier slot came since, and set the timer of its own
        self.armed = None
        now = loop.time()
        due, slots = self.due, self.slots
        while due and due[0] * TICK <= now:
            members = slots.pop(heapq.heappop(due), None)
            if members:
                for d in members:
                    d._expire()
        while due and due[0] not in slots:
            heapq.heappop(due)
        if due:
            self._arm(due[0])


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wheel] = weakref.WeakKeyDictionary()


def _wheel(loop: asyncio.AbstractEventLoop) -> _Wheel:
    wheel = _wheels.get(loop)
    if wheel is None:
        wheel = _wheels[loop] = _Wheel(loop)
    return wheel


def timeout(delay: float | None) -> Deadline:
    """A deadline ``delay`` seconds from now on the running loop's clock (as
    ``asyncio.timeout(delay)``: a delay of 0 or less expires at the loop's next turn,
    ``None`` sets none)."""
    loop = asyncio.get_running_loop()
    return Deadline(_wheel(loop), math.inf if delay is None else loop.time() + delay)
