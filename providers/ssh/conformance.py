"""``ssh``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): one real sshd on loopback (the suite's
``byo_sshd``), declared as a 16-cpu, 64 GB host (accounting only); another coordinator on
the same state fills it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, filled_by

from .inventory import SshHost
from .provider import SshProvider


def rebuild(inventory: str, state_dir: str) -> SshProvider:
    return SshProvider(inventory=inventory, state_dir=state_dir)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    d = fixture("byo_sshd")
    box: dict[str, Any] = {"name": "box1", "host": d.host, "port": d.port, "user": d.user,
                           "key_path": str(d.client_key_path), "host_key": d.host_public_key,
                           "cpus": 16, "memory_gb": 64}   # accounting only: one real sshd on loopback
    host = SshHost(**box)
    state = str(tmp / "ssh")
    prov = SshProvider([host], state_dir=state)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    (offer,) = await prov.offers(spec)
    inventory = tmp / "inventory.json"
    inventory.write_text(json.dumps({"hosts": [box]}))
    async with cleaned_up(prov):
        yield ConformanceEnv("ssh", prov, spec, offer, filled_by(lambda: SshProvider([host], state_dir=state)),
                             ("flowmesh_providers.ssh.conformance:rebuild",
                              {"inventory": str(inventory), "state_dir": state}))
