"""One coordinator as its own OS process, serving a shared queue with a trivial task (the
SHA-256 of the task's body, after ``--task-ms`` of sleep): what the shared-fleet tests and
``bench/shared_fleet.py`` start several of, and SIGKILL.

    python -m flowmesh_sdk.control.redis.worker_main --url redis://127.0.0.1:6379/0 \\
        [--fleet default] --queue q --results /shared/cas --log /tmp/c1.log [--submit 2000] [--lease-s 1]

Each result it publishes is appended to ``--log`` (``published <id>``) and flushed at once,
so a killed process's log still says what it published; the last line is ``done ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time

from ...cas.local import LocalDirStore
from .backend import RedisBackend
from .dispatch import Job, SharedQueue


async def amain(args: argparse.Namespace) -> int:
    be = RedisBackend(args.url, fleet=args.fleet, lease_s=args.lease_s)
    await be.start()
    log = open(args.log, "a", buffering=1)
    log.write(f"coordinator {be.coordinator.id} pid {os.getpid()}\n")
    sq = SharedQueue(be, args.queue, results=LocalDirStore(args.results), capacity=args.capacity)

    async def execute(job: Job) -> bytes:
        if args.task_ms:
            await asyncio.sleep(args.task_ms / 1000.0)
        return hashlib.sha256(job.body).hexdigest().encode()

    if args.submit:
        t0 = time.perf_counter()
        await sq.submit((f"{os.getpid()}-{i}".encode() for i in range(args.submit)), tenant=args.tenant)
        log.write(f"submitted {args.submit} in {time.perf_counter() - t0:.3f} s\n")
    published, logged = sq.stats.published, 0
    serving = asyncio.ensure_future(sq.serve(execute, concurrency=args.concurrency, until_empty=True))
    while True:
        await asyncio.wait([serving], timeout=0.01)
        for task_id in published[logged:]:   # what was published since, flushed line by line
            log.write(f"published {task_id}\n")
        logged = len(published)
        if serving.done():
            break
    serving.result()
    s = sq.stats
    log.write(f"done executed={s.executed} published={len(s.published)} already={s.already} "
              f"redispatched={s.redispatched} fenced={s.fenced}\n")
    log.close()
    await be.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--fleet", default="default")
    p.add_argument("--queue", default="shared")
    p.add_argument("--results", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--submit", type=int, default=0)
    p.add_argument("--tenant", default="default")
    p.add_argument("--capacity", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--task-ms", type=float, default=0.0)
    p.add_argument("--lease-s", type=float, default=1.0)
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
