"""A coordinator that launches two tagged instances and then waits to be killed.

Usage: python _coordinator.py RECIPE_JSON FLEET  (prints the instance ids, then sleeps)."""

import asyncio
import json
import sys
import uuid

from flowmesh_sdk.config import Owner
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, LaunchRequest
from flowmesh_sdk.specs import InstanceSpec


def build(recipe: dict):
    if recipe["provider"] == "local":
        from flowmesh_providers.local import LocalProvider
        return LocalProvider(cpus=recipe["cpus"], memory_gb=recipe["memory_gb"],
                             state_dir=recipe["state_dir"])
    if recipe["provider"] == "ssh":
        from flowmesh_providers.ssh import SshProvider
        return SshProvider(inventory=recipe["inventory"], state_dir=recipe["state_dir"])
    if recipe["provider"] == "alibaba":   # the ECS emulator (flowmesh_sdk.testing.ecs)
        from flowmesh_providers.alibaba import AlibabaProvider
        return AlibabaProvider(endpoint=recipe["endpoint"], vswitch_ids=recipe["vswitch_ids"],
                               security_group_id=recipe["security_group_id"], access_key_id=recipe["key"],
                               access_key_secret=recipe["secret"])
    if recipe["provider"] == "vast":   # the Vast.ai emulator (flowmesh_sdk.testing.vast)
        from flowmesh_providers.vast import VastProvider
        return VastProvider(server_url=recipe["server_url"], api_key=recipe["api_key"], spot=False)
    if recipe["provider"] == "gce":   # the GCE emulator (flowmesh_sdk.testing.gce)
        from google.auth.credentials import AnonymousCredentials

        from flowmesh_providers.gce import GceProvider
        return GceProvider(project=recipe["project"], zones=recipe["zones"], endpoint=recipe["endpoint"],
                           credentials=AnonymousCredentials())
    if recipe["provider"] == "azure":   # the ARM emulator (flowmesh_sdk.testing.azure)
        from flowmesh_providers.azure import AzureProvider
        from flowmesh_sdk.testing.azure import StaticTokenCredential
        return AzureProvider(subscription_id=recipe["subscription"], locations=recipe["locations"],
                             base_url=recipe["base_url"], allow_http=True, polling_interval_s=0.0,
                             credential=StaticTokenCredential(recipe["token"]))
    from flowmesh_providers.ec2 import Ec2Provider
    return Ec2Provider(regions=["us-east-1"], endpoint_url=recipe["endpoint_url"],
                       image_id=recipe["image_id"], session_kwargs=recipe["session"])


async def main() -> None:
    recipe, fleet = json.loads(sys.argv[1]), sys.argv[2]
    prov = build(recipe)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)
    rid = f"crash-{uuid.uuid4().hex[:8]}"
    count = 2 if offer.available is None else min(2, offer.available)   # a Vast offer is one machine
    launched = await prov.launch(LaunchRequest(offer=offer, spec=spec, count=count, request_id=rid, tags={
        TAG_FLEET: fleet, TAG_POOL: "doomed", TAG_OWNER: str(Owner.current())}))
    print(" ".join(i.id for i in launched), flush=True)
    await asyncio.sleep(3600)  # killed before it records or terminates anything


asyncio.run(main())
