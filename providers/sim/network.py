"""Bandwidth in the simulated cloud: links shared fairly by the transfers on them.

A :class:`Link` is processor sharing: ``n`` transfers in flight each get ``capacity/n``.
It is kept exact in O(log n) per arrival or departure with the usual virtual-work
clock: ``work`` grows at ``capacity/n`` bytes per second; a transfer that arrived at
work ``w0`` with ``size`` bytes ends when ``work`` reaches ``w0 + size``.

A pull crosses two links -- the machine's NIC and the registry's egress -- and is done
when both have carried its bytes (:func:`transfer`).  Treating the two as independent
queues is an approximation (a flow slowed by one link does not free share on the other);
it is exact when one link is never the bottleneck, which is the case the simulator is
calibrated for (documented in docs/cost-model.md).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from flowmesh_sdk import clock


class Link:
    def __init__(self, name: str, capacity_bps: float) -> None:
        if capacity_bps <= 0:
            raise ValueError(f"link {name}: capacity must be > 0 bytes/s")
        self.name = name
        self.capacity = capacity_bps      # bytes per second
        self._work = 0.0                  # bytes each active transfer has received so far
        self._stamp = 0.0
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self.bytes_carried = 0.0

    @property
    def active(self) -> int:
        return len(self._heap)

    def _advance(self) -> None:
        now = clock.monotonic()
        if self._heap:
            self._work += (now - self._stamp) * self.capacity / len(self._heap)
        self._stamp = now

    async def carry(self, size: float) -> None:
        """Wait until ``size`` bytes have crossed this link."""
        if size <= 0:
            return
        self._advance()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (self._work + size, next(self._seq), fut))
        self.bytes_carried += size
        self._reschedule()
        try:
            await fut
        except asyncio.CancelledError:
            self._advance()
            self._heap = [h for h in self._heap if h[2] is not fut]
            heapq.heapify(self._heap)
            self._reschedule()
            raise

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._heap:
            return
        loop = asyncio.get_running_loop()
        ahead = (self._heap[0][0] - self._work) * len(self._heap) / self.capacity
        self._timer = loop.call_at(self._stamp + max(0.0, ahead), self._finish)

    def _finish(self) -> None:
        self._timer = None
        self._advance()
        eps = 1e-6 * max(1.0, self._work)
        while self._heap and self._heap[0][0] <= self._work + eps:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():
                fut.set_result(None)
        self._reschedule()


async def transfer(size: float, *links: Link | None) -> None:
    """Carry ``size`` bytes over every given link (concurrently; done when all are)."""
    await asyncio.gather(*(link.carry(size) for link in links if link is not None))
