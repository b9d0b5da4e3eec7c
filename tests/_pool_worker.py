"""One coordinator of a shared pool as its own OS process (tests/test_shared_tasks.py): a
Fleet on a shared Redis state (1 s lease) with a persistent local pool ``eval``, serving
the pool's shared task queue until nothing is queued or claimed fleet-wide.

    python tests/_pool_worker.py REDIS_URL FLOWMESH_HOME LOCAL_STATE CAS IMAGE [N_TO_SUBMIT [RETRIES]]

RETRIES is the pool's ``retry_infra_failures`` (default 2); every coordinator is of run ``shared-run``.

Prints ``submitted <id> ...`` (when it submitted), then ``done executed=.. redispatched=..``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from flowmesh_providers.local import LocalProvider

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.cas.local import LocalDirStore
from flowmesh_sdk.control.redis import RedisBackend
from flowmesh_sdk.pools.shared import SharedTasks


async def main(url: str, home: Path, state: Path, cas: Path, image: str, submit: int, retries: int) -> None:
    be = RedisBackend(url, fleet="shared-tasks", lease_s=1.0)
    provider = LocalProvider(cpus=4, memory_gb=16, state_dir=state)
    async with Fleet("shared-tasks", home=home, control=be, providers={"local": provider},
                     reconcile_interval_s=None, run="shared-run") as fleet:
        pool = await fleet.pool(PoolSpec(name="eval", instance=InstanceSpec(cpus=1, memory_gb=2), min_instances=1,
                                         max_instances=1, sandboxes_per_instance=2, warm_per_image=0,
                                         retry_infra_failures=retries))
        tasks = SharedTasks(fleet, pool, results=LocalDirStore(cas), capacity=4)
        if submit:
            sandbox = SandboxSpec(image=image, cpus=0.5, memory_gb=0.25)
            ids = await tasks.submit([Task(name=f"t{i}", sandbox=sandbox, command=f"sleep 1.5; echo out-{i}")
                                      for i in range(submit)])
            print("submitted", *ids, flush=True)
        else:
            print("serving", flush=True)
        s = await tasks.serve(concurrency=2, until_empty=True)
        print(f"done executed={s.executed} published={len(s.published)} redispatched={s.redispatched}", flush=True)
    await be.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], Path(a[1]), Path(a[2]), Path(a[3]), a[4], int(a[5]) if len(a) > 5 else 0,
                     int(a[6]) if len(a) > 6 else 2))
