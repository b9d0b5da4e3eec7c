"""What providers that carve machines into instances share (``local`` carves this host,
``ssh`` the user's machines): launch checks, idempotency by request id, and the record
keeping behind describe, list_tagged and terminate.  A subclass decides where new
instances go (``_place``) and how their containers are removed (``_remove_containers``).
"""

from __future__ import annotations

import abc
import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.provider import TAG_FLEET, TAG_REQUEST, Instance, LaunchRequest, Provider, ProviderState
from flowmesh_sdk.specs import InstanceSpec

from .records import RecordDir


QUARANTINE_S = 600.0   # a machine given up on takes no new instance for this long


class SlicedProvider(Provider):
    region: str
    _records: RecordDir
    _quarantine: dict[str, float]   # machine address -> monotonic time it is usable again

    def mark_unhealthy(self, instances: Sequence[Instance], reason: str) -> None:
        """Keep new instances off these machines for ``QUARANTINE_S`` (a machine that failed
        bootstrap, or vanished under a task, is likely to do it again)."""
        until = time.monotonic() + QUARANTINE_S
        for inst in instances:
            if inst.address:
                self.quarantined()[inst.address] = until

    def quarantined(self) -> dict[str, float]:
        """Machines kept out of placement now, with the time each is back."""
        q = self.__dict__.setdefault("_quarantine", {})
        now = time.monotonic()
        for address in [a for a, t in q.items() if t <= now]:
            del q[address]
        return q

    @abc.abstractmethod
    def explain_misfit(self, spec: InstanceSpec) -> str: ...

    @abc.abstractmethod
    def _place(self, live: list[Instance], request: LaunchRequest) -> list[str | None]:
        """The machine (address) for each of ``request.count`` new instances, given the
        live ones; raise CapacityError when they do not fit."""

    @abc.abstractmethod
    async def _remove_containers(self, instances: list[Instance]) -> None: ...

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        if request.offer.provider != self.name:
            raise SpecError("launch.offer", f"offer from {request.offer.provider!r} given to {self.name}")
        if not await self.offers(request.spec):
            raise SpecError("pool.instance", self.explain_misfit(request.spec))
        return await asyncio.to_thread(self._launch_locked, request)

    def _launch_locked(self, request: LaunchRequest) -> list[Instance]:
        with self._records.locked():
            live = self._records.all()
            same = [i for i in live if i.tags.get(TAG_REQUEST) == request.request_id]
            if same:
                return same  # idempotent by request id
            tags = {**request.tags, TAG_REQUEST: request.request_id}
            out = []
            for address in self._place(live, request):
                prefix = f"{self.name}-{address}" if address else self.name
                inst = Instance(id=f"{prefix}-{uuid.uuid4().hex[:12]}", provider=self.name,
                                region=self.region, instance_type=request.offer.instance_type,
                                spec=request.spec, state=ProviderState.RUNNING, tags=tags,
                                launched_at=time.time(), address=address)
                self._records.write(inst)
                out.append(inst)
            return out

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = set(ids)
        return [i for i in await asyncio.to_thread(self._records.all) if i.id in wanted]

    async def terminate(self, ids: Sequence[str]) -> None:
        known = await self.describe(ids)
        if not known:
            return
        await self._remove_containers(known)

        def drop() -> None:
            with self._records.locked():
                for inst in known:
                    self._records.remove(inst.id)
        await asyncio.to_thread(drop)

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        live = await asyncio.to_thread(self._records.all)
        if not tags:
            return [i for i in live if TAG_FLEET in i.tags]
        return [i for i in live if all(i.tags.get(k) == v for k, v in tags.items())]
