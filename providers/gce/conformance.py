"""``gce``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the Compute Engine emulator (the suite's
``gce_emulator``) with the real google-cloud-compute; an exhausted zone is its capacity error."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, exhausting

from .provider import GceProvider


def rebuild(endpoint: str, project: str, zones: Sequence[str]) -> GceProvider:
    from google.auth.credentials import AnonymousCredentials
    return GceProvider(project=project, zones=list(zones), endpoint=endpoint, credentials=AnonymousCredentials())


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu = fixture("gce_emulator")
    prov = emu.provider()
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    exhaust = exhausting(lambda: emu.exhaust(zone=offer.zone), emu.restore)
    async with cleaned_up(prov):
        yield ConformanceEnv("gce", prov, spec, offer, exhaust,
                             ("flowmesh_providers.gce.conformance:rebuild",
                              {"endpoint": emu.url, "project": emu.project, "zones": list(emu.zones)}))
