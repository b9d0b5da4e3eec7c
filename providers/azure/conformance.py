"""``azure``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the ARM emulator (the suite's ``azure_emulator``)
with the real azure-mgmt clients; an exhausted size is its capacity error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, exhausting

from .provider import AzureProvider


def rebuild(base_url: str, subscription: str, token: str, locations: Sequence[str]) -> AzureProvider:
    from flowmesh_sdk.testing.azure import StaticTokenCredential
    return AzureProvider(subscription_id=subscription, locations=list(locations), base_url=base_url,
                         allow_http=True, polling_interval_s=0.0, credential=StaticTokenCredential(token))


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("azure_emulator")
    prov = emu.provider()
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    exhaust = exhausting(lambda: emu.exhaust(offer.instance_type), emu.restore)
    async with cleaned_up(prov):
        yield ConformanceEnv("azure", prov, spec, offer, exhaust,
                             ("flowmesh_providers.azure.conformance:rebuild",
                              {"base_url": emu.url, "subscription": emu.subscription, "token": emu.token,
                               "locations": list(emu.locations)}))   # a test token
