"""One describe call for every instance a pool waits on in a provider's region.

Each launch call's instances are polled until they run (``Launcher._await_running``), on a
schedule that backs off from 0.5 s to 5 s.  A pool that launches in many calls (an
ephemeral pool of thousands of tasks: one call per burst) had as many pollers, each with
its own describe call: 1.1-1.2 calls per task at 10,000 tasks and more, against 0.17 when
one call launched them all (issue 29).  The pollers now wake on a shared grid (a multiple
of their delay) and describe through :class:`Describer`, which merges the calls made at
the same instant for one provider and region into one, so the calls per round no longer
grow with the number of launch calls -- and a real cloud's rate limit sees fewer of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ..provider import Instance, Provider
from ..provisioning import Provisioner


class _Round:
    __slots__ = ("ids", "done")

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.done: asyncio.Future[dict[str, Instance]] = asyncio.get_running_loop().create_future()
        # a round whose waiters were all cancelled: its error is nobody's to report
        self.done.add_done_callback(lambda f: f.cancelled() or f.exception())


class Describer:
    """Describe calls merged per provider and region (see the module doc)."""

    def __init__(self, provisioner: Provisioner) -> None:
        self._provisioner = provisioner
        self._rounds: dict[tuple[str, str], _Round] = {}
        self._calls: set[asyncio.Task[None]] = set()

    async def describe(self, provider: Provider, region: str, ids: Iterable[str]) -> dict[str, Instance]:
        """What ``provider`` reports of ``ids`` (and of the others asked about with them), by
        id; its error (a :class:`~flowmesh_sdk.errors.FlowMeshError`) to every caller of the
        round.  A caller that is cancelled leaves the round to the others."""
        key = (provider.name, region)
        rnd = self._rounds.get(key)
        if rnd is None:
            rnd = self._rounds[key] = _Round()
            call = asyncio.ensure_future(self._call(key, provider, region, rnd))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        rnd.ids.update(ids)
        return await asyncio.shield(rnd.done)

    async def _call(self, key: tuple[str, str], provider: Provider, region: str, rnd: _Round) -> None:
        await asyncio.sleep(0)   # the pollers woken at this instant join the round
        del self._rounds[key]
        ids = sorted(rnd.ids)
        try:
            got = await self._provisioner.call(provider, region, "describe", lambda: provider.describe(ids))
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                rnd.done.cancel()
                raise
            rnd.done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        rnd.done.set_result({i.id: i for i in got})
