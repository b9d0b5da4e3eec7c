"""What providers that carve machines into instances share (``local`` carves this host,
``ssh`` the user's machines): launch checks, idempotency by request id, and the record
keeping behind describe, list_tagged and terminate.  A subclass decides where new
instances go (``_place``), how their containers are removed (``_remove_containers``) and
on which port a machine's sshd listens (``_port_of``; None: not reached over SSH).

Ids are ``<provider>[-<machine>]-<12 random hex digits>``: unique, never reused.  Tags go
through the declared ``Capabilities.tags`` codec (encoded when written, decoded when read).
These machines have no zones (``Instance.zone`` is None).
"""

from __future__ import annotations

import abc
import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace

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

    def _port_of(self, address: str | None) -> int | None:
        """Where the sshd of the machine at ``address`` listens (None: not over SSH)."""
        return None

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        if request.offer.provider != self.name:
            raise SpecError("launch.offer", f"offer from {request.offer.provider!r} given to {self.name}")
        if not await self.offers(request.spec):
            raise SpecError("pool.instance", self.explain_misfit(request.spec))
        return await asyncio.to_thread(self._launch_locked, request)

    def _launch_locked(self, request: LaunchRequest) -> list[Instance]:
        with self._records.locked():
            live = self._records.all()
            same = [self._decoded(i) for i in live
                    if self.capabilities.tags.decode(i.tags).get(TAG_REQUEST) == request.request_id]
            if same:
                return same  # idempotent by request id
            codec = self.capabilities.tags
            tags = codec.encode({**request.tags, TAG_REQUEST: request.request_id})
            out = []
            taken = {i.id for i in live}
            for address in self._place(live, request):
                prefix = f"{self.name}-{address}" if address else self.name
                iid = f"{prefix}-{uuid.uuid4().hex[:12]}"
                while iid in taken or self._records.known(iid):
                    iid = f"{prefix}-{uuid.uuid4().hex[:12]}"
                taken.add(iid)
                inst = Instance(id=iid, provider=self.name,
                                region=self.region, instance_type=request.offer.instance_type,
                                spec=request.spec, state=ProviderState.RUNNING, tags=tags,
                                launched_at=time.time(), address=address,
                                price_per_hour=request.offer.price_per_hour or 0.0,
                                port=self._port_of(address), zone=None)
                self._records.write(inst)
                out.append(self._decoded(inst))
            return out

    def _decoded(self, inst: Instance) -> Instance:
        tags = self.capabilities.tags.decode(inst.tags)
        return inst if tags == inst.tags else replace(inst, tags=tags)

    def _all(self) -> list[Instance]:
        return [self._decoded(i) for i in self._records.all()]

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        wanted = set(ids)
        return [i for i in await asyncio.to_thread(self._all) if i.id in wanted]

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
        codec = self.capabilities.tags
        raw = await asyncio.to_thread(self._records.all)
        if not tags:
            return [self._decoded(i) for i in raw if TAG_FLEET in codec.decode(i.tags)]
        wanted = codec.encode(tags)   # equal SDK tags encode equal: filter on the cloud's form
        return [self._decoded(i) for i in raw if all(i.tags.get(k) == v for k, v in wanted.items())]
