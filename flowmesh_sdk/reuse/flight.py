"""Single-flight: the same ``H_task`` in flight in this process (any pool, any tenant) runs
once; the requests that arrive meanwhile join it, unless its run is not one to share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..specs import ReuseKind
from .lineage import Ledger
from .model import Answer, Fresh, Request
from .store import ResultIndex

__all__ = ["SingleFlight"]

_Resolved = tuple[ReuseKind, Answer | None, Fresh | None]


class SingleFlight:
    """Lookup, single-flight, execute, publish: ``index`` looks up, executes and publishes,
    ``ledger`` records the requests answered by a hit or a join."""

    def __init__(self, index: ResultIndex, ledger: Ledger) -> None:
        self.index = index
        self.ledger = ledger
        self._inflight: dict[str, asyncio.Future[Answer | None]] = {}
        self._waiting = 0

    def in_flight(self) -> int:
        """Distinct works running now (one leader each)."""
        return len(self._inflight)

    def waiting(self) -> int:
        """Requests waiting on a work in flight (would-be joins)."""
        return self._waiting

    async def resolve(self, req: Request, execute: Callable[[], Awaitable[Fresh]]) -> _Resolved:
        """Answer ``req``: join the same work in flight, else a stored hit, else execute it
        (as the leader of the requests that arrive meanwhile)."""
        joined = await self._join(req, execute)
        if joined is not None:
            return joined
        found = await self.index.lookup(req.h_task)
        if found is not None:
            return self.ledger.answered(req, ReuseKind.HIT, found), found, None
        joined = await self._join(req, execute)   # a leader appeared while we looked
        if joined is not None:
            return joined
        fut: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._inflight[req.h_task] = fut
        shared: Answer | None = None
        try:
            # a leader may have published between our lookup and our registration
            found = await self.index.lookup(req.h_task)
            if found is not None:
                shared = found
                return self.ledger.answered(req, ReuseKind.HIT, found), found, None
            fresh, answer = await self.index.execute(req, execute)
            shared = answer if fresh.share else None
            return ReuseKind.EXECUTED, answer, fresh
        finally:
            if self._inflight.get(req.h_task) is fut:
                del self._inflight[req.h_task]
            if not fut.done():
                fut.set_result(shared)   # None (nothing to share) also when the leader failed

    async def _join(self, req: Request, execute: Callable[[], Awaitable[Fresh]]) -> _Resolved | None:
        fut = self._inflight.get(req.h_task)
        if fut is None:
            return None
        self._waiting += 1
        try:
            shared = await asyncio.shield(fut)
        finally:
            self._waiting -= 1
        if shared is not None:
            return self.ledger.answered(req, ReuseKind.JOINED, shared), shared, None
        # the leader's run is not one to share (timed out, infra error, killed, cancelled):
        # every such follower runs its own, at once rather than one after the other
        fresh, answer = await self.index.execute(req, execute)
        return ReuseKind.EXECUTED, answer, fresh
