"""``vast``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the Vast.ai emulator (the suite's
``vast_emulator``) with the real vastai client; an offer taken between search and create
is its capacity error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, exhausting

from .provider import VastProvider


def rebuild(server_url: str, api_key: str) -> VastProvider:
    return VastProvider(server_url=server_url, api_key=api_key, spot=False)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("vast_emulator")
    prov = emu.provider(spot=False)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = min(await prov.offers(spec), key=lambda o: (o.price_per_hour or 0, o.offer_id))   # cheapest ask
    taken = int(offer.offer_id)

    def back() -> None:
        for o in emu.offers:
            if o["id"] == taken:
                o.update(rented=False, _taken=False)

    async with cleaned_up(prov):            # the offer taken between search and create
        yield ConformanceEnv("vast", prov, spec, offer, exhausting(lambda: emu.gone(taken), back),
                             ("flowmesh_providers.vast.conformance:rebuild",
                              {"server_url": emu.url, "api_key": emu.api_key}))
