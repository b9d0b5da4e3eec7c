"""Micro-batching: requests that an engine can serve together wait a moment to share one call.

Requests are grouped by a key (:func:`group_key`: the model and the sampling parameters,
through :func:`flowmesh_sdk.identity.h_exec`, the SDK's *compatible match* identity).  A
group is sent when it holds ``max_batch`` requests, or ``max_wait_s`` after its first
request arrived, whichever comes first -- so batching adds at most ``max_wait_s`` of
latency.  Each requester gets back its own answer (the send function returns one result
per item, in order), or the batch's error.  :meth:`MicroBatcher.flush` sends every
waiting group at once and stops holding items back (used when a worker drains).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..errors import ProviderUnavailableError
from ..identity import h_exec, label_digest

T = TypeVar("T")
R = TypeVar("R")


def group_key(model: str, params: Mapping[str, object]) -> str:
    """Requests with equal keys may share a micro-batch: same model, same sampling
    parameters (the per-request prompt is not part of it)."""
    return h_exec(label_digest(f"model:{model}"), params, {"role": "inference"})


@dataclass
class _Group(Generic[T, R]):
    items: list[tuple[T, asyncio.Future[R]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class MicroBatcher(Generic[T, R]):
    """Collects items per key and calls ``send(key, items) -> results`` per batch."""

    def __init__(self, send: Callable[[str, list[T]], Awaitable[list[R]]], *, max_batch: int,
                 max_wait_s: float) -> None:
        self._send = send
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._groups: dict[str, _Group[T, R]] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self.sizes: list[int] = []   # size of every batch sent, for stats and tests
        self._eager = False          # after flush(): every item is sent as it arrives

    @property
    def waiting(self) -> int:
        """Items collected but not yet sent."""
        return sum(len(g.items) for g in self._groups.values())

    async def submit(self, key: str, item: T) -> R:
        """Add ``item`` to its group and wait for its own result."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        group = self._groups.setdefault(key, _Group())
        group.items.append((item, fut))
        if self._eager or len(group.items) >= self.max_batch:
            self._launch(key)
        elif group.timer is None:
            group.timer = loop.call_later(self.max_wait_s, self._launch, key)
        return await fut

    def _launch(self, key: str) -> None:
        group = self._groups.pop(key, None)
        if group is None:
            return
        if group.timer is not None:
            group.timer.cancel()
        live = [(item, fut) for item, fut in group.items if not fut.done()]  # drop cancelled callers
        if not live:
            return
        task = asyncio.create_task(self._send_batch(key, live))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send_batch(self, key: str, items: list[tuple[T, asyncio.Future[R]]]) -> None:
        self.sizes.append(len(items))
        try:
            results = await self._send(key, [item for item, _ in items])
            if len(results) != len(items):
                raise ProviderUnavailableError(f"a batch of {len(items)} got {len(results)} answers",
                                               code="BatchMismatch")
        except BaseException as exc:  # every requester gets the batch's error
            for _, fut in items:
                if not fut.done():
                    if isinstance(exc, asyncio.CancelledError):
                        fut.cancel()
                    else:
                        fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, fut), res in zip(items, results):
            if not fut.done():
                fut.set_result(res)

    async def flush(self) -> None:
        """Send every waiting group now, and from now on send each item as it arrives (a
        draining worker holds nothing back); wait until the batches in flight are answered."""
        self._eager = True
        for key in list(self._groups):
            self._launch(key)
        if self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)

    def cancel(self) -> None:
        """Stop: cancel batches in flight and fail the waiting items (their callers get
        CancelledError)."""
        for group in self._groups.values():
            if group.timer is not None:
                group.timer.cancel()
            for _, fut in group.items:
                fut.cancel()
        self._groups.clear()
        for task in list(self._sending):
            task.cancel()
