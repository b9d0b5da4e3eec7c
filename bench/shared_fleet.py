#!/usr/bin/env python3
"""One fleet shared by 4 coordinator processes on one redis-server (loopback), against the
in-process backend; then one coordinator SIGKILLed mid-run.

Tasks are *trivial tasks* (no sandbox): the admission phase times exactly what every
pool does per task through the ControlBackend seam -- the tenant's quota, then the pool's
semaphore (``Pool._lease``) -- with 50 workers per coordinator in a closed loop and a
semaphore large enough that nobody queues, so the latency is the admission's own cost.
The in-process run is the same 4 processes each with its own InProcessBackend (nothing is
shared: the floor).  The crash phase runs the shared queue
(``python -m flowmesh_sdk.control.redis.worker_main``: claim, permit, SHA-256 of the body
after a 2 ms sleep, publish to a shared content-addressed store, acknowledge), kills one
coordinator with SIGKILL once it has published a quarter of its tasks, and counts:

* lost: tasks submitted whose result was never published (refs in the store);
* duplicated: results published more than once (every process logs what it published);
* leaked_permits: permits and tenant slots still held once every survivor is done;
* adopt_s: server-clock seconds from the kill until every task the dead coordinator had
  claimed was claimed again (or finished) by a survivor -- target <= 2 x lease.

    python bench/shared_fleet.py [--coordinators 4] [--tasks 2000] [--lease-s 1.0] [--fsync everysec]

Last line: ``lost=<n> duplicated=<n> leaked_permits=<n> adopt_s=<x> admit_per_s=<y>``
(admit_per_s: admissions per second per coordinator through Redis, the mean of the 4).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import pct

from flowmesh_sdk.control import QuotaLimits
from flowmesh_sdk.control.backend import InProcessBackend
from flowmesh_sdk.control.redis import RedisBackend
from flowmesh_sdk.control.redis.localserver import LocalRedis

HERE = Path(__file__).resolve()


# ---- one coordinator of the admission phase (a child process) ------------------------------
async def admit_child(backend: str, url: str, tasks: int, workers: int, capacity: int) -> dict[str, float]:
    be = RedisBackend(url, namespace=f"bench{os.getppid()}", lease_s=5.0) if backend == "redis" else InProcessBackend()
    await be.start()
    quota = be.quota("fleet:bench:tenants", QuotaLimits(max_in_flight=10 * capacity))
    sem = be.semaphore("fleet:bench:pool:p", capacity)
    lat: list[float] = []
    todo = iter(range(tasks))

    async def worker() -> None:
        for _ in todo:
            t0 = time.perf_counter()
            await quota.admit_async("tenant")
            await sem.acquire()
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(0)            # the trivial task
            await sem.release_async()
            await quota.release_async("tenant")

    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    await be.close()
    return {"admit_per_s": tasks / wall, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "cpu_ms_per_task": cpu / tasks * 1e3}


def admission_phase(backend: str, url: str, n: int, tasks: int, workers: int) -> list[dict[str, float]]:
    cmd = [sys.executable, str(HERE), "--child", backend, "--url", url, "--tasks", str(tasks),
           "--workers", str(workers), "--capacity", str(n * workers)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=300)
        if p.returncode:
            raise SystemExit(f"admission child failed ({p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


# ---- the crash phase ---------------------------------------------------------------------
async def server_ms(be: RedisBackend) -> int:
    sec, usec = await be.client.command("time")
    return int(sec) * 1000 + int(usec) // 1000


async def claims_of(be: RedisBackend, coordinator: str, queue: str) -> set[str]:
    """The tasks ``coordinator`` holds claimed now (from its lease hash)."""
    claimed_key = be.key("q", queue, "claimed")
    fields = await be.client.command("hkeys", be.key("coord", coordinator, "leases"))
    return {f.decode().split("\t", 1)[1] for f in fields if f.decode().startswith(claimed_key + "\t")}


async def watch_adoption(be: RedisBackend, held: set[str], queue: str, kill_ms: int, deadline_s: float) -> float:
    """Server seconds from the kill until every task in ``held`` is done or claimed again
    (its dispatch count went up and it is claimed)."""
    base = be.key("q", queue)
    ids = sorted(held)
    before = await be.client.command("hmget", f"{base}:attempts", ids) if ids else []
    t_end = time.monotonic() + deadline_s
    while time.monotonic() < t_end:
        now = await server_ms(be)
        left = 0
        if ids:
            attempts = await be.client.command("hmget", f"{base}:attempts", ids)
            alive = await asyncio.gather(*(be.client.command("hexists", f"{base}:tasks", t) for t in ids))
            claimed = await asyncio.gather(*(be.client.command("zscore", f"{base}:claimed", t) for t in ids))
            for a0, a1, live, score in zip(before, attempts, alive, claimed):
                if live and not (score is not None and int(a1 or 0) > int(a0 or 0)):
                    left += 1
        if not left:
            return (now - kill_ms) / 1000.0
        await asyncio.sleep(0.01)
    return float("inf")


async def leaked(url: str, queue: str, capacity: int) -> int:
    be = RedisBackend(url, lease_s=5.0)
    await be.start()
    try:
        return (await be.semaphore(f"queue:{queue}", capacity).held()
                + await be.quota(f"queue:{queue}:tenants").in_flight_async("default"))
    finally:
        await be.close()


def crash_phase(srv: LocalRedis, d: Path, n: int, tasks: int, lease_s: float) -> dict[str, float]:
    queue, capacity = "bench", 32 * n

    def log(i: int) -> Path:
        return d / f"c{i}.log"

    def lines(i: int) -> list[str]:
        return log(i).read_text().splitlines() if log(i).exists() else []

    procs = [subprocess.Popen(
        [sys.executable, "-m", "flowmesh_sdk.control.redis.worker_main", "--url", srv.url, "--queue", queue,
         "--results", str(d / "cas"), "--log", str(log(i)), "--submit", str(tasks), "--task-ms", "2",
         "--lease-s", str(lease_s), "--capacity", str(capacity), "--concurrency", "32"],
        stderr=open(d / f"c{i}.err", "wb")) for i in range(n)]
    victim = 0
    t_end = time.monotonic() + 120
    while sum(x.startswith("published") for x in lines(victim)) < tasks // 4:
        if time.monotonic() > t_end or procs[victim].poll() is not None:
            raise SystemExit("the victim finished or stalled before it could be killed")
        time.sleep(0.005)
    dead = lines(victim)[0].split()[1]

    async def kill_and_watch() -> tuple[float, int]:
        be = RedisBackend(srv.url, lease_s=5.0)
        await be.start()
        try:
            held = await claims_of(be, dead, queue)            # just before the kill ...
            procs[victim].send_signal(signal.SIGKILL)
            kill_ms = await server_ms(be)
            held |= await claims_of(be, dead, queue)           # ... and just after
            return await watch_adoption(be, held, queue, kill_ms, 10 * lease_s), len(held)
        finally:
            await be.close()

    adopt_s, held_at_kill = asyncio.run(kill_and_watch())
    procs[victim].wait()
    for p in procs[1:]:
        if p.wait(300):
            raise SystemExit(f"a surviving coordinator failed: {p.returncode}")
    submitted = sum(tasks for i in range(n) if any(x.startswith("submitted") for x in lines(i)))
    refs_dir = d / "cas" / "refs" / "tasks" / queue
    refs = {p.name for p in refs_dir.iterdir()}
    published = [x.split()[1] for i in range(n) for x in lines(i) if x.startswith("published")]
    done = [x for i in range(1, n) for x in lines(i) if x.startswith("done")]
    return {"submitted": submitted, "lost": submitted - len(refs), "duplicated": len(published) - len(set(published)),
            "leaked_permits": asyncio.run(leaked(srv.url, queue, capacity)), "adopt_s": adopt_s,
            "held_at_kill": held_at_kill, "redispatched": sum(int(x.split("redispatched=")[1].split()[0]) for x in done),
            "rerun_already_published": sum(int(x.split("already=")[1].split()[0]) for x in done)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--coordinators", type=int, default=4)
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--workers", type=int, default=50)
    p.add_argument("--lease-s", type=float, default=1.0)
    p.add_argument("--fsync", choices=["everysec", "always"], default="always",
                   help="redis-server's appendfsync (docs/operations.md: what each survives)")
    p.add_argument("--child", choices=["redis", "memory"])
    p.add_argument("--url", default="")
    p.add_argument("--capacity", type=int, default=200)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(admit_child(args.child, args.url, args.tasks, args.workers, args.capacity))))
        return 0
    n = args.coordinators
    with tempfile.TemporaryDirectory(prefix="fm-shared-fleet-") as tmp:
        d = Path(tmp)
        with LocalRedis(d / "redis", fsync=args.fsync) as srv:
            print(f"redis-server {srv.url} (AOF, appendfsync {args.fsync}); {n} coordinator processes x "
                  f"{args.tasks} trivial tasks; {os.cpu_count()} CPUs")
            rows = {b: admission_phase(b, srv.url, n, args.tasks, args.workers) for b in ("memory", "redis")}
            print(f"{'backend':<12} {'admit/s per coord':>18} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/task':>12}")
            for b, rs in rows.items():
                mean = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}
                worst99 = max(r["p99_ms"] for r in rs)
                print(f"{'in-process' if b == 'memory' else 'redis':<12} {mean['admit_per_s']:>18,.0f} "
                      f"{mean['p50_ms']:>8.3f} {worst99:>8.3f} {mean['cpu_ms_per_task']:>12.3f}")
            redis_rate = sum(r["admit_per_s"] for r in rows["redis"]) / n
            mem_rate = sum(r["admit_per_s"] for r in rows["memory"]) / n
            print(f"redis / in-process admissions per second: {redis_rate / mem_rate:.3f}")
            c = crash_phase(srv, d / "crash", n, args.tasks, args.lease_s) if (d / "crash").mkdir() is None else {}
        print(f"crash: {c['submitted']} tasks submitted by {n} coordinators, one SIGKILLed after a quarter of "
              f"its tasks holding {c['held_at_kill']} claims; {c['redispatched']} claims re-dispatched, {c['rerun_already_published']} re-runs found "
              f"their result already published (not published again)")
        print(f"targets: lost=0 duplicated=0 leaked_permits=0 adopt_s <= {2 * args.lease_s:g} (2 x lease), "
              f"admit_per_s >= 2000 per coordinator")
        print(f"lost={c['lost']} duplicated={c['duplicated']} leaked_permits={c['leaked_permits']} "
              f"adopt_s={c['adopt_s']:.3f} admit_per_s={redis_rate:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
