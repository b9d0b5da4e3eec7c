"""``ec2``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): moto in server mode (the suite's ``moto_ec2``)
with the real boto3, behind the fault proxy (``ec2_proxy``) that provokes
InsufficientInstanceCapacity."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, exhausting

from .provider import Ec2Provider


def rebuild(endpoint_url: str, image_id: str, session: dict[str, Any]) -> Ec2Provider:
    return Ec2Provider(regions=["us-east-1"], endpoint_url=endpoint_url, image_id=image_id, session_kwargs=session)


def rebuild_options(moto: Any) -> dict[str, Any]:
    """What :func:`rebuild` needs to reach ``moto`` (a MotoEc2) from another process."""
    return {"endpoint_url": moto.endpoint_url, "image_id": moto.a_valid_ami("us-east-1"),
            "session": moto.session_kwargs}


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    moto, proxy = fixture("moto_ec2"), fixture("ec2_proxy")
    prov = moto.provider(endpoint_url=proxy.endpoint_url)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)

    exhaust = exhausting(lambda: proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None), proxy.clear)
    async with cleaned_up(prov):
        yield ConformanceEnv("ec2", prov, spec, offer, exhaust,
                             ("flowmesh_providers.ec2.conformance:rebuild", rebuild_options(moto)))
