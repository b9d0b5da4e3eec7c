"""A coordinator that launches two tagged instances and then waits to be killed.

Usage: python _coordinator.py REBUILD_JSON FLEET  (prints the instance ids, then sleeps).
REBUILD_JSON is a conformance environment's ``rebuild``, ``["module:function", {kwargs}]``
(flowmesh_sdk.testing.conformance.rebuild)."""

import asyncio
import json
import sys
import uuid

from flowmesh_sdk.config import Owner
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, LaunchRequest
from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import rebuild


async def main() -> None:
    (ref, options), fleet = json.loads(sys.argv[1]), sys.argv[2]
    prov = rebuild(ref, options)
    spec = InstanceSpec(cpus=2, memory_gb=4)
    offer = next(o for o in await prov.offers(spec) if not o.spot)
    rid = f"crash-{uuid.uuid4().hex[:8]}"
    count = 2 if offer.available is None else min(2, offer.available)   # a Vast offer is one machine
    launched = await prov.launch(LaunchRequest(offer=offer, spec=spec, count=count, request_id=rid, tags={
        TAG_FLEET: fleet, TAG_POOL: "doomed", TAG_OWNER: str(Owner.current())}))
    print(" ".join(i.id for i in launched), flush=True)
    await asyncio.sleep(3600)  # killed before it records or terminates anything


asyncio.run(main())
