#!/usr/bin/env python3
"""SandboxFusion's ``run_code`` through FlowMesh's server, beside ``podman run --rm`` per request.

A persistent local pool (one instance, ``--slots`` sandboxes, warm containers of the
image kept ready) behind :class:`SandboxFusionServer` on 127.0.0.1; the real
``sandbox-fusion`` client (``run_code_async``) sends a one-line Python program
(``print(1)``) ``--n`` times at each concurrency of ``--concurrency`` (default 1, 16, 64;
more requests than slots queue in the server).  Each answer must be ``Success`` with
``1\\n``.  Per concurrency: requests per second (requests / wall time) and the p50 and p99
latency of one request.  Beside it, in the same run, what a naive executor does: ``podman
run --rm <the runtime probe's run flags> --network none IMAGE python3 -c 'print(1)'`` per
request, ``--podman-n`` times at concurrency 1 and at 16.

The last line printed is exactly ``sf_rps_c16=<r> sf_p99_ms_c16=<ms> sf_vs_podman_run_p50=<x>``,
x = p50 of a request through the server at concurrency 1 over p50 of one ``podman run --rm``.

    python bench/sandbox_fusion_api.py [--n 200] [--concurrency 1,16,64] [--podman-n 20] [--slots N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass

from rich.table import Table

from _common import console as bench_console, image_builder, pct  # bench/_common.py (on sys.path)

import sandbox_fusion as sf

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec
from flowmesh_sdk.integrations.sandbox_fusion import SandboxFusionServer, ServerConfig
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime

PROGRAM = "print(1)"
console = bench_console()


@dataclass(frozen=True)
class Level:
    what: str
    concurrency: int
    requests: int
    wall_s: float
    latencies_s: list[float]

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s

    def p(self, q: float) -> float:
        return pct(self.latencies_s, q)


async def closed_loop(n: int, concurrency: int, one) -> tuple[float, list[float]]:  # type: ignore[no-untyped-def]
    """``n`` calls of ``one`` with ``concurrency`` in flight; (wall seconds, each latency)."""
    latencies: list[float] = []
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            t0 = time.perf_counter()
            await one()
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, n))))
    return time.perf_counter() - t0, latencies


async def through_server(url: str, n: int, concurrency: int) -> Level:
    async def one() -> None:
        r = await sf.run_code_async(sf.RunCodeRequest(code=PROGRAM, language="python"), endpoint=url,
                                    max_attempts=1)
        if r.status != sf.RunStatus.Success or r.run_result.stdout != "1\n":
            raise RuntimeError(f"unexpected answer: {r}")

    await one()   # warm-up
    wall, lat = await closed_loop(n, concurrency, one)
    return Level("server run_code", concurrency, n, wall, lat)


async def podman_run(argv: list[str], n: int, concurrency: int) -> Level:
    async def one() -> None:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
        out, err = await proc.communicate()
        if proc.returncode != 0 or out != b"1\n":
            raise RuntimeError(f"podman run exited {proc.returncode}: {err.decode(errors='replace')[-300:]}")

    await one()
    wall, lat = await closed_loop(n, concurrency, one)
    return Level("podman run --rm", concurrency, n, wall, lat)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sandbox_fusion_api.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="requests per concurrency (default 200)")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated (default 1,16,64; must include 1, 16)")
    p.add_argument("--podman-n", type=int, default=20, help="podman run --rm samples per concurrency (default 20)")
    p.add_argument("--slots", type=int, default=None, help="sandboxes in the pool (default: this host's cpus)")
    p.add_argument("--image", default=None, help="the image (default: localhost/flowmesh/code-runner:bookworm)")
    a = p.parse_args(argv)
    a.levels = sorted({int(c) for c in a.concurrency.split(",") if c.strip()})
    if not {1, 16} <= set(a.levels) or a.n < 1 or a.podman_n < 1:
        p.error("--concurrency must include 1 and 16; --n and --podman-n must be >= 1")
    return a


async def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    build = image_builder()
    image = a.image or build.build_code_runner()
    cpus = os.cpu_count() or 1
    slots = a.slots or cpus
    info = await ContainerRuntime(LocalRunner()).probe()
    argv_podman = [info.binary, "run", "--rm", *info.run_flags, "--network", "none", image, "python3", "-c", PROGRAM]
    spec = PoolSpec(name="bench-sf", mode="persistent", instance=InstanceSpec(cpus=cpus, memory_gb=max(2.0, slots)),
                    min_instances=1, max_instances=1, sandboxes_per_instance=slots, warm_images=(image,),
                    warm_per_image=slots)
    levels: list[Level] = []
    async with Fleet("bench-sf") as fleet:
        pool = await fleet.pool(spec)
        async with SandboxFusionServer(pool, ServerConfig(queue_size=max(a.levels) * 2)) as server:
            console.print(f"server {server.url}: {server.admission.slots} slots, image {image}")
            for c in a.levels:
                with console.status(f"run_code through the server, concurrency {c}"):
                    levels.append(await through_server(server.url, a.n, c))
    console.print(f"[dim]{' '.join(argv_podman)}[/]")
    for c in (1, 16):
        with console.status(f"podman run --rm, concurrency {c}"):
            levels.append(await podman_run(argv_podman, a.podman_n, c))
    table = Table(title=f"run_code of {PROGRAM!r} ({slots} sandbox slots, {cpus} cpus)")
    for col in ("how", "concurrency", "requests", "req/s", "p50 ms", "p99 ms"):
        table.add_column(col)
    for lv in levels:
        table.add_row(lv.what, str(lv.concurrency), str(lv.requests), f"{lv.rps:.1f}", f"{lv.p(50) * 1000:.0f}",
                      f"{lv.p(99) * 1000:.0f}")
    console.print(table)
    sf16 = next(lv for lv in levels if lv.what.startswith("server") and lv.concurrency == 16)
    sf1 = next(lv for lv in levels if lv.what.startswith("server") and lv.concurrency == 1)
    pod1 = next(lv for lv in levels if lv.what.startswith("podman") and lv.concurrency == 1)
    print(f"sf_rps_c16={sf16.rps:.2f} sf_p99_ms_c16={sf16.p(99) * 1000:.1f} "
          f"sf_vs_podman_run_p50={sf1.p(50) / pod1.p(50):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
