"""A coordinator to be SIGKILLed (tests/test_shared_adoption.py): a Fleet on a shared
Redis state with a 1 s lease, a persistent local pool of one instance holding one open
sandbox; prints ``ready <instance id> <coordinator id>`` and waits to be killed.

    python tests/_fleet_victim.py REDIS_URL FLOWMESH_HOME FLEET IMAGE
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from flowmesh_providers.local import LocalProvider

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.control.redis import RedisBackend


async def main(url: str, home: Path, fleet_name: str, image: str) -> None:
    be = RedisBackend(url, fleet=fleet_name, lease_s=1.0)
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=home / "local" / "instances")
    async with Fleet(fleet_name, home=home, control=be, providers={"local": provider},
                     reconcile_interval_s=None) as fleet:
        pool = await fleet.pool(PoolSpec(name="warm", instance=InstanceSpec(cpus=2, memory_gb=4), min_instances=1,
                                         max_instances=1, warm_per_image=0))
        async with pool.sandbox(SandboxSpec(image=image, cpus=1, memory_gb=0.5)) as sb:
            assert (await sb.exec("echo up")).ok
            print("ready", sb.instance_id, be.coordinator.id, flush=True)
            await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]))
