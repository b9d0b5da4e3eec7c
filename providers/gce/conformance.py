"""``gce``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the Compute Engine emulator with the real
google-cloud-compute (the suite's ``gce_emulator``), whose zone can run out of capacity."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture

from .provider import GceProvider


def rebuild(endpoint: str, project: str, zones: list[str]) -> GceProvider:
    from google.auth.credentials import AnonymousCredentials   # the emulator takes no credentials
    return GceProvider(project=project, zones=zones, endpoint=endpoint, credentials=AnonymousCredentials())


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("gce_emulator")
    prov = emu.provider()
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        emu.exhaust(zone=offer.zone)
        try:
            yield
        finally:
            emu.restore()

    options = {"endpoint": emu.url, "project": emu.project, "zones": list(emu.zones)}
    try:
        yield ConformanceEnv("gce", prov, spec, offer, exhaust, ("flowmesh_providers.gce.conformance:rebuild", options))
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
