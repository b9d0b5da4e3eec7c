"""``ec2``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): moto in server mode with the real boto3 (the
suite's ``moto_ec2``), reached through a fault proxy (``ec2_proxy``) that answers
RunInstances with InsufficientInstanceCapacity when capacity is to run out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture

from .provider import Ec2Provider


def rebuild(endpoint_url: str, image_id: str, session_kwargs: dict[str, Any]) -> Ec2Provider:
    return Ec2Provider(regions=["us-east-1"], endpoint_url=endpoint_url, image_id=image_id,
                       session_kwargs=session_kwargs)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    moto, proxy = fixture("moto_ec2"), fixture("ec2_proxy")
    prov = moto.provider(endpoint_url=proxy.endpoint_url)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None)
        try:
            yield
        finally:
            proxy.clear()

    options = {"endpoint_url": moto.endpoint_url, "image_id": moto.a_valid_ami("us-east-1"),
               "session_kwargs": moto.session_kwargs}
    try:
        yield ConformanceEnv("ec2", prov, spec, offer, exhaust, ("flowmesh_providers.ec2.conformance:rebuild", options))
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
