"""``vast``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the Vast.ai emulator with the real ``vastai``
SDK (the suite's ``vast_emulator``), on-demand; capacity runs out when the cheapest
offer is taken between search and create."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture

from .provider import VastProvider


def rebuild(server_url: str, api_key: str) -> VastProvider:
    return VastProvider(server_url=server_url, api_key=api_key, spot=False)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("vast_emulator")
    prov = emu.provider(spot=False)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = min(await prov.offers(spec), key=lambda o: (o.price_per_hour or 0, o.offer_id))   # cheapest ask

    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        emu.gone(int(offer.offer_id))            # taken between search and create
        try:
            yield
        finally:
            for o in emu.offers:
                if o["id"] == int(offer.offer_id):
                    o.update(rented=False, _taken=False)

    try:
        yield ConformanceEnv("vast", prov, spec, offer, exhaust,
                             ("flowmesh_providers.vast.conformance:rebuild", {"server_url": emu.url,
                                                                              "api_key": emu.api_key}))
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
