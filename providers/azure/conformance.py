"""``azure``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the ARM emulator with the real azure-mgmt clients
(the suite's ``azure_emulator``), whose VM size can run out of capacity."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture

from .provider import AzureProvider


def rebuild(base_url: str, subscription_id: str, token: str, locations: list[str]) -> AzureProvider:
    from flowmesh_sdk.testing.azure import StaticTokenCredential   # the emulator's test token
    return AzureProvider(subscription_id=subscription_id, locations=locations, base_url=base_url, allow_http=True,
                         polling_interval_s=0.0, credential=StaticTokenCredential(token))


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("azure_emulator")
    prov = emu.provider()
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        emu.exhaust(offer.instance_type)
        try:
            yield
        finally:
            emu.restore()

    options = {"base_url": emu.url, "subscription_id": emu.subscription, "token": emu.token,
               "locations": list(emu.locations)}
    try:
        yield ConformanceEnv("azure", prov, spec, offer, exhaust,
                             ("flowmesh_providers.azure.conformance:rebuild", options))
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
