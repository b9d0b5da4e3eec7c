"""``alibaba``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the ECS emulator (the suite's ``ecs_emulator``)
with the real ECS SDK; a sold-out type in a zone is its capacity error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, exhausting

from .provider import AlibabaProvider


def rebuild(endpoint: str, vswitch_ids: Mapping[str, str], security_group_id: str, key: str,
            secret: str) -> AlibabaProvider:
    return AlibabaProvider(endpoint=endpoint, vswitch_ids=vswitch_ids, security_group_id=security_group_id,
                           access_key_id=key, access_key_secret=secret)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("ecs_emulator")
    prov = emu.provider()
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    exhaust = exhausting(lambda: emu.sold_out(zone=offer.zone, instance_type=offer.instance_type), emu.restock)
    async with cleaned_up(prov):
        yield ConformanceEnv("alibaba", prov, spec, offer, exhaust,
                             ("flowmesh_providers.alibaba.conformance:rebuild",
                              {"endpoint": emu.url, "vswitch_ids": emu.vswitch_ids,
                               "security_group_id": emu.security_group_id, "key": emu.access_key_id,
                               "secret": emu.access_key_secret}))
