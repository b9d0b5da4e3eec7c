"""``local``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): a 16-cpu, 64 GB machine, accounting only, kept
in a state folder of the test's; another coordinator on that state fills it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, filled_by

from .provider import LocalProvider


def rebuild(cpus: int, memory_gb: float, state_dir: str) -> LocalProvider:
    return LocalProvider(cpus=cpus, memory_gb=memory_gb, state_dir=state_dir)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    options: dict[str, Any] = {"cpus": 16, "memory_gb": 64, "state_dir": str(tmp / "local")}
    prov = rebuild(**options)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    (offer,) = await prov.offers(spec)
    async with cleaned_up(prov):
        yield ConformanceEnv("local", prov, spec, offer, filled_by(lambda: rebuild(**options)),
                             ("flowmesh_providers.local.conformance:rebuild", options))
