"""``alibaba``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the ECS emulator with the real ECS SDK (the
suite's ``ecs_emulator``), whose zone's instance type can sell out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture

from .provider import AlibabaProvider


def rebuild(endpoint: str, vswitch_ids: dict[str, str], security_group_id: str, access_key_id: str,
            access_key_secret: str) -> AlibabaProvider:
    return AlibabaProvider(endpoint=endpoint, vswitch_ids=vswitch_ids, security_group_id=security_group_id,
                           access_key_id=access_key_id, access_key_secret=access_key_secret)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("ecs_emulator")
    prov = emu.provider()
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        emu.sold_out(zone=offer.zone, instance_type=offer.instance_type)
        try:
            yield
        finally:
            emu.restock()

    options = {"endpoint": emu.url, "vswitch_ids": dict(emu.vswitch_ids), "security_group_id": emu.security_group_id,
               "access_key_id": emu.access_key_id, "access_key_secret": emu.access_key_secret}
    try:
        yield ConformanceEnv("alibaba", prov, spec, offer, exhaust,
                             ("flowmesh_providers.alibaba.conformance:rebuild", options))
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
