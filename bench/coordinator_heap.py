#!/usr/bin/env python3
"""What the coordinator holds partway through a long batch on the simulated EC2 (the
REAL fleet, pools and store, as in bench/control_plane_scale.py): its resident memory,
the objects the collector tracks and the largest kinds of them, the pool instances still
held after they ended, and the events waiting for the metadata store's writer (issue 29).

A coordinator's heap should hold the tasks and instances in flight, not everything a long
batch has done so far: a launch once held every instance it had launched until its last
instance was up, and the store's writer fell behind a busy event loop without bound.

    python bench/coordinator_heap.py [--tasks 100000] [--at 45000] [--mode ephemeral]

``--at``: the virtual second of the run at which the census is taken (45,000 s into a
100,000-task ephemeral batch: about 91,000 instances launched, 12,000 of them live).

Last line: ``rss_mb=… tracked=… instances_held=<ended, still in memory> instances_live=…
store_queue=<events not yet written>``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import sys
from collections.abc import Awaitable, Callable, Iterable

from control_plane_scale import SMALL, rss

from flowmesh_providers.sim import ec2
from flowmesh_sdk.control import store as store_mod
from flowmesh_sdk.lifecycle import InstanceState
from flowmesh_sdk.pools import pool as pool_mod
from flowmesh_sdk.pools.instance import ManagedInstance
from flowmesh_sdk.sim import Workload, run_scenario
from flowmesh_sdk.specs import Task, TaskResult

_ENDED = (InstanceState.TERMINATED, InstanceState.FAILED)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=100_000)
    p.add_argument("--at", type=float, default=45_000.0)
    p.add_argument("--mode", default="ephemeral")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    stores: list[store_mod.MetadataStore] = []
    made = store_mod.MetadataStore.__init__

    def track(self: store_mod.MetadataStore, *a: object, **kw: object) -> None:
        made(self, *a, **kw)  # type: ignore[arg-type]
        stores.append(self)

    census: dict[str, float] = {}

    def take() -> None:
        objs = gc.get_objects()
        kinds: collections.Counter[str] = collections.Counter()
        size: collections.Counter[str] = collections.Counter()
        held = live = 0
        for o in objs:
            k = type(o).__qualname__
            kinds[k] += 1
            size[k] += sys.getsizeof(o)
            if isinstance(o, ManagedInstance):
                if o.state in _ENDED:
                    held += 1
                else:
                    live += 1
        census.update(rss_mb=rss() / 2**20, tracked=len(objs), instances_held=held, instances_live=live,
                      store_queue=sum(len(s._queue) for s in stores))
        print(f"at {args.at:g} s: resident {census['rss_mb']:.0f} MB, {len(objs):,} tracked objects; the largest kinds:")
        for k, b in size.most_common(15):
            print(f"  {b / 2**20:8.1f} MB {kinds[k]:>10,} {k}")

    run_tasks = pool_mod.run_tasks

    async def with_census(run_task: Callable[[Task], Awaitable[TaskResult]], tasks: Iterable[Task],
                          on_result: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
        asyncio.get_running_loop().call_later(args.at, take)
        return await run_tasks(run_task, tasks, on_result)

    store_mod.MetadataStore.__init__ = track  # type: ignore[method-assign]
    pool_mod.run_tasks = with_census  # type: ignore[assignment]
    r = run_scenario(ec2((SMALL,)), Workload(tasks=args.tasks, minutes=100, instance_type=SMALL.name,
                                             mode=args.mode), seed=args.seed)
    print(f"{r.succeeded:,} of {args.tasks:,} tasks succeeded")
    if not census:
        print(f"the run ended before {args.at:g} s", file=sys.stderr)
        return 1
    print(" ".join(f"{k}={v:.0f}" for k, v in census.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
