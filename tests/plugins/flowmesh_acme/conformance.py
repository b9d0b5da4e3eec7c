"""acme's environment for the provider conformance suite (flowmesh_sdk.testing.conformance)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, filled_by

from .provider import AcmeProvider


def rebuild(state_dir: str) -> AcmeProvider:
    return AcmeProvider(cpus=16, memory_gb=64, state_dir=state_dir)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    state = str(tmp / "acme")
    prov = rebuild(state)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    (offer, *_) = await prov.offers(spec)
    async with cleaned_up(prov):
        yield ConformanceEnv("acme", prov, spec, offer, filled_by(lambda: rebuild(state)),
                             ("flowmesh_acme.conformance:rebuild", {"state_dir": state}))
