#!/usr/bin/env python3
"""Bursts of sandboxes: what an RL step that asks for hundreds at once gets.

For each N in ``--n`` (16, 64, 256) and each arrival pattern -- ``sequential`` (one after
another), ``staggered`` (a fixed arrival rate, ``--rate`` per second) and ``burst`` (all at
once) -- N requests for a sandbox each run their first command (``true``) on a persistent
pool of this host sized for them (one instance, N slots), twice:

* **warm**: ``warm_per_image=N``, the stock refilled before each pattern, so every request
  can take a started container;
* **cold**: ``warm_per_image=0``, every request starts its container;

and the same N requests as raw ``podman run --rm <the host's run flags> --network none
IMAGE true`` in the same arrival pattern (what a naive executor does).  Per row: p50 and
p99 time to first command (from the request to the first command's result) and sandboxes
ready per second (N over the time from the first request to the last result).

Published anchors for the same question: kubernetes-sigs/agent-sandbox's warm adoption p50
92 ms / p99 376 ms at 45 claims/s; hosted sandboxes' median time to first command 0.11 s
(Daytona), 0.44 s (E2B), 2.66 s with p99 22 s (Modal).  Targets (issue 29): a warm burst
of 256 at p99 <= 50 ms; a cold burst's throughput within 10 % of raw podman's.

    python bench/sandbox_burst.py [--n 16,64,256] [--patterns sequential,staggered,burst]
                                  [--rate 45] [--image IMG]

Last line: ``burst<N>_warm_p99_ms=<x> cold_throughput_vs_podman=<y>`` at the largest N
(cold burst ready/s over raw podman's burst ready/s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rich.table import Table

from _common import busybox_image, pct
from _common import console as bench_console

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, Pool, PoolSpec, SandboxSpec
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime, RuntimeInfo

PATTERNS = ("sequential", "staggered", "burst")
SANDBOX_GB = 0.0625   # 64 MB a sandbox: 256 of them are a 16 GB instance of this host
STOCK_TIMEOUT_S = 900.0

console = bench_console()


class StockShort(Exception):
    """The warm stock will not fill: the bench stops (its fleet cleans up) with this message."""


@dataclass(frozen=True)
class Row:
    n: int
    pattern: str
    side: str        # warm | cold | podman
    p50_ms: float
    p99_ms: float
    per_s: float


async def arrive(n: int, pattern: str, rate: float, one: Callable[[], Awaitable[float]]) -> tuple[list[float], float]:
    """Run ``one`` N times in ``pattern``; its times to first command and the ready rate."""
    t0 = time.perf_counter()
    if pattern == "sequential":
        times = [await one() for _ in range(n)]
    else:
        async def at(i: int) -> float:
            if pattern == "staggered":
                await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            return await one()
        times = list(await asyncio.gather(*(at(i) for i in range(n))))
    return times, n / (time.perf_counter() - t0)


async def stocked(fleet: Fleet, pool: Pool, want: int) -> None:
    """Until the pool holds ``want`` warm containers (woken by each one ready).

    A refill that fails publishes nothing (the pool logs it), so the stock is also looked at
    every second: short of ``want`` with no refill under way, it will not fill, and the
    bench stops there rather than wait out STOCK_TIMEOUT_S."""
    sub = fleet.bus.subscribe(EventKind.SANDBOX_READY)
    try:
        deadline = time.monotonic() + STOCK_TIMEOUT_S
        while (st := pool.stats()).warm < want:
            if st.warming == 0:
                raise StockShort(f"the warm stock stopped at {st.warm} of {want} with no refill under way: "
                                 "its refills failed (the pool's warnings above say why)")
            left = deadline - time.monotonic()
            if left <= 0:
                raise StockShort(f"the warm stock reached {st.warm} of {want} in {STOCK_TIMEOUT_S:.0f} s")
            with contextlib.suppress(TimeoutError):
                await sub.next(min(1.0, left))
    finally:
        sub.close()


async def sdk_rows(image: str, n: int, patterns: list[str], rate: float, warm: bool) -> list[Row]:
    spec = PoolSpec(name=f"burst-{'warm' if warm else 'cold'}", mode="persistent", min_instances=1,
                    max_instances=1, sandboxes_per_instance=n, warm_per_image=n if warm else 0,
                    warm_images=(image,) if warm else (), idle_timeout_s=3600, heartbeat_s=None,
                    instance=InstanceSpec(cpus=1, memory_gb=n * SANDBOX_GB))
    sb = SandboxSpec(image=image, cpus=0.25, memory_gb=SANDBOX_GB)
    rows = []
    async with Fleet(name="bench-burst", reconcile_interval_s=None) as fleet:
        pool = await fleet.pool(spec)
        if warm:
            sb = pool.default_sandbox(image)   # the warm containers' shape

        async def one() -> float:
            t = time.perf_counter()
            async with pool.sandbox(sb) as box:
                res = await box.exec("true")
                dt = time.perf_counter() - t
            if res.exit_code != 0:
                raise RuntimeError(f"true exited {res.exit_code}: {res.stderr}")
            return dt

        for pattern in patterns:
            if warm:
                with console.status(f"stocking {n} warm sandboxes"):
                    await stocked(fleet, pool, n)
            times, per_s = await arrive(n, pattern, rate, one)
            rows.append(Row(n, pattern, "warm" if warm else "cold", pct(times, 50) * 1e3, pct(times, 99) * 1e3, per_s))
        await pool.drain()
    return rows


async def podman_rows(info: RuntimeInfo, image: str, n: int, patterns: list[str], rate: float) -> list[Row]:
    argv = [info.binary, "run", "--rm", *info.run_flags, "--network", "none", image, "true"]

    async def one() -> float:
        t = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err.decode()[-300:]}")
        return time.perf_counter() - t

    rows = []
    for pattern in patterns:
        times, per_s = await arrive(n, pattern, rate, one)
        rows.append(Row(n, pattern, "podman", pct(times, 50) * 1e3, pct(times, 99) * 1e3, per_s))
    return rows


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", default="16,64,256", help="burst sizes (comma-separated)")
    p.add_argument("--patterns", default=",".join(PATTERNS), help="of sequential,staggered,burst")
    p.add_argument("--rate", type=float, default=45.0, help="arrivals per second when staggered")
    p.add_argument("--image", default=None, help="image (default: the project's busybox)")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.n.split(",") if x.strip()]
    patterns = [x.strip() for x in args.patterns.split(",") if x.strip()]
    if not sizes or any(s < 1 or s > 1024 for s in sizes) or any(x not in PATTERNS for x in patterns) or not patterns:
        p.error(f"--n: sizes in [1, 1024]; --patterns: of {', '.join(PATTERNS)}")
    image = args.image or busybox_image()
    info = await ContainerRuntime(LocalRunner()).probe()
    rows: list[Row] = []
    for n in sizes:
        for warm in (True, False):
            rows += await sdk_rows(image, n, patterns, args.rate, warm)
        rows += await podman_rows(info, image, n, patterns, args.rate)
    table = Table(title=f"time to first command, {image} ({info.binary} {info.version})")
    for col in ("N", "pattern", "side", "p50 ms", "p99 ms", "ready/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r.n), r.pattern, r.side, f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", f"{r.per_s:.1f}")
    console.print(table)
    top = max(sizes)

    def pick(side: str) -> Row | None:
        want = "burst" if "burst" in patterns else patterns[-1]
        return next((r for r in rows if r.n == top and r.side == side and r.pattern == want), None)

    warm, cold, raw = pick("warm"), pick("cold"), pick("podman")
    assert warm and cold and raw
    console.print(f"targets: warm burst of 256 at p99 <= 50 ms; cold burst throughput >= 0.9 x raw podman's "
                  f"(anchors: agent-sandbox warm p50 92 / p99 376 ms; Daytona 0.11 s, E2B 0.44 s, Modal 2.66 s)")
    print(f"burst{top}_warm_p99_ms={warm.p99_ms:.1f} cold_throughput_vs_podman={cold.per_s / raw.per_s:.3f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except StockShort as e:
        sys.exit(f"sandbox_burst: {e}")
