#!/usr/bin/env python3
"""SWE-ReX's own local container deployment against FlowMesh's SWE-ReX deployment, side
by side on the same image, the same machine and the same calls.

The image is swe-base with the installed swe-rex version put in OFFLINE: its wheels are
downloaded once with pip (``pip download swe-rex==VERSION pip``, cached under
``~/.cache/flowmesh/images/``), and ``podman build --network=none`` installs them with
pip run from its own wheel.  SWE-ReX runs it with ``DockerDeployment(image=...,
container_runtime="podman", pull="never")`` (this host's podman run flags in
``docker_args``: ``--runtime runc`` on cgroups v1, the ``--ulimit`` pins), which starts
the container, its ``swerex-remote`` server and talks to it over HTTP on 127.0.0.1.
FlowMesh runs :class:`~flowmesh_sdk.integrations.swerex.FlowMeshDeployment` on a
persistent pool of the local provider that keeps warm containers of the image.

Measured (``--n`` samples each after unmeasured warm-ups; the two sides alternate sample
by sample so a load swing on this shared machine hits both).  The round trips (b), (b') and
(c) are a started deployment's steady state: five warm-up calls of each side, then a
second's rest (a FlowMesh deployment's second ``execute`` starts, in the background, the
held shell the later ones run in; measured during that start, its figure was the start's):

(a) start to first command: ``await deployment.start()`` until
    ``runtime.execute(Command(command=["true"]))`` returns (then ``stop()``, untimed;
    FlowMesh waits, untimed, for its warm container to be back, as bench/sandbox_latency.py);
(b) ``execute`` round trip: ``runtime.execute(Command(command=["true"]))`` on a started
    deployment (both fork ``/usr/bin/true``);
(b') the same with output: ``runtime.execute(Command(command=["echo", "hi"]))`` (what most
    of an agent's commands are; both fork ``/bin/echo``);
(c) session command round trip: ``run_in_session(BashAction(command="true"))`` in a bash
    session made with ``create_session``;
(d) ``--concurrent`` (16) small tasks at once, each start, ``execute`` of
    ``python3 -c 'print(sum(range(10)))'``, stop: the wall time of all of them, p50 over
    ``--rounds`` after an unmeasured round of each.  SWE-ReX's run one thread and event
    loop each, as SWE-agent's batch mode runs them (its ``start()`` sleeps with a blocking
    ``time.sleep``: on one loop the starts cannot overlap and never come up); FlowMesh's
    run on one loop, its pool keeping 16 warm containers (refilled after the warm-up
    round; its design, SWE-ReX has none);
(e) idle memory per sandbox: ``podman stats`` of a started deployment with one bash session,
    after a second of idling.

Last line: ``ttfc_vs_swerex=<a> exec_vs_swerex=<b> session_vs_swerex=<c>
concurrent16_vs_swerex=<d> exec_output_vs_swerex=<b'>`` (FlowMesh p50 / SWE-ReX p50; (d)
wall over wall), against the targets 0.05, 0.5, 0.05 and 0.7 (and (b')'s reported beside).

    python bench/peer_swerex.py [--n 20] [--concurrent 16] [--base IMAGE]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as concurrent_futures
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

os.environ.setdefault("SWE_REX_LOG_STREAM_LEVEL", "WARNING")   # SWE-ReX logs every start at INFO

from rich.table import Table  # noqa: E402

from _common import console as bench_console, image_builder, pct  # noqa: E402  (bench/_common.py)

from swerex import __version__ as SWEREX_VERSION  # noqa: E402
from swerex.deployment.docker import DockerDeployment  # noqa: E402
from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest  # noqa: E402

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec  # noqa: E402
from flowmesh_sdk.integrations.swerex import FlowMeshDeployment  # noqa: E402
from flowmesh_sdk.remote.local import LocalRunner  # noqa: E402
from flowmesh_sdk.remote.runtime import ContainerRuntime  # noqa: E402

console = bench_console()
TARGETS = {"ttfc": 0.05, "exec": 0.5, "session": 0.05, "concurrent16": 0.7}
TRUE = Command(command=["true"])
ECHO = Command(command=["echo", "hi"])
SMALL = Command(command=["python3", "-c", "print(sum(range(10)))"])
WARM_TIMEOUT_S = 120.0
STEADY = 5            # warm-up calls before a round trip's samples
log = logging.getLogger("bench.peer_swerex")   # SWE-ReX's deployments log here
log.addHandler(logging.NullHandler())
log.propagate = False   # its stop() warns "Failed to kill container" when the container already exited


# --------------------------------------------------------------------------- #
# the image: swe-base + swe-rex, installed offline from downloaded wheels
# --------------------------------------------------------------------------- #

def swerex_image(base: str) -> str:
    build = image_builder()
    if base == build.SWE_BASE_IMAGE:
        build.build_swe_base()
    wheels = build.cache_dir() / f"swe-rex-{SWEREX_VERSION}-wheels"
    if not any(wheels.glob("swe_rex-*.whl")) or not any(wheels.glob("pip-*.whl")):
        console.print(f"downloading swe-rex {SWEREX_VERSION} and pip wheels into {wheels} (once)")
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--only-binary=:all:", "-d", str(wheels), f"swe-rex=={SWEREX_VERSION}", "pip"], check=True)
    names = sorted(p.name for p in wheels.glob("*.whl"))
    pip_whl = next(n for n in reversed(names) if n.startswith("pip-"))
    base_id = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", base], check=True,
                             capture_output=True, text=True).stdout.strip()
    tag = hashlib.sha256("\n".join([base_id, *names]).encode()).hexdigest()[:12]
    ref = f"localhost/flowmesh/swerex-peer:{SWEREX_VERSION}-{tag}"
    if build.image_exists(ref):
        return ref
    ctx = wheels.parent / f"swerex-peer-ctx-{os.getpid()}"
    ctx.mkdir(parents=True, exist_ok=True)
    try:
        (ctx / "wheels").mkdir(exist_ok=True)
        for n in names:
            shutil.copy2(wheels / n, ctx / "wheels" / n)
        (ctx / "Containerfile").write_text(
            f"FROM {base}\nCOPY wheels/ /tmp/swerex-wheels/\n"
            f"RUN python3 /tmp/swerex-wheels/{pip_whl}/pip install --no-index --find-links /tmp/swerex-wheels "
            "--break-system-packages --no-cache-dir --root-user-action=ignore --disable-pip-version-check -q "
            f"swe-rex=={SWEREX_VERSION} && rm -rf /tmp/swerex-wheels && swerex-remote --help >/dev/null\n")
        console.print(f"building {ref} (podman build --network=none, swe-rex from the wheels)")
        subprocess.run(["podman", "build", "-q", "--squash", *build.podman_build_args(), "-t", ref, str(ctx)],
                       check=True, stdout=subprocess.DEVNULL)
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    return ref


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #

def timed(fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[float]]:
    async def one() -> float:
        t0 = time.perf_counter()
        await fn()
        return time.perf_counter() - t0
    return one


async def alternate(n: int, label: str, rex: Callable[[], Awaitable[float]],
                    fm: Callable[[], Awaitable[float]], warmup: int = 1) -> tuple[list[float], list[float]]:
    """``warmup`` calls of each (then a second's rest, when more than one), then ``n``
    samples of each, alternating."""
    for _ in range(warmup):
        await rex()
        await fm()
    if warmup > 1:
        await asyncio.sleep(1.0)
    xs: list[float] = []
    ys: list[float] = []
    with console.status(f"{label}: 0/{n}") as status:
        for i in range(n):
            xs.append(await rex())
            ys.append(await fm())
            status.update(f"{label}: {i + 1}/{n}")
    return xs, ys


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3}


def container_memory(name: str) -> float:
    """Bytes in use by a container (``podman stats``, the cgroup's usage)."""
    out = subprocess.run(["podman", "stats", "--no-stream", "--format", "{{.MemUsage}}", name],
                         check=True, capture_output=True, text=True).stdout.strip()
    m = re.match(r"([\d.]+)\s*([kKmMgG]?i?[bB])", out)
    if not m:
        raise RuntimeError(f"podman stats {name}: cannot read {out!r}")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


async def stop(d: Any) -> None:
    """``d.stop()``; for SWE-ReX also remove its container: on podman its stop() kills the
    ``podman run`` client, which can leave the container behind (created or exited)."""
    name = getattr(d, "container_name", None)
    await d.stop()
    if name:
        await asyncio.to_thread(subprocess.run, ["podman", "rm", "-f", "-t", "0", "--ignore", name],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_warm(fleet: Fleet, pool: Any, want: int) -> None:
    """Until the pool holds ``want`` warm containers (event-driven, no sleeping)."""
    sub = fleet.bus.subscribe(EventKind.SANDBOX_READY)
    try:
        deadline = time.monotonic() + WARM_TIMEOUT_S
        while pool.stats().warm < want:
            try:
                await sub.next(max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise RuntimeError(f"pool {pool.name}: not {want} warm containers within "
                                   f"{WARM_TIMEOUT_S:g} s ({pool.stats()})") from None
    finally:
        sub.close()


# --------------------------------------------------------------------------- #
# the measurements
# --------------------------------------------------------------------------- #

async def run(image: str, n: int, concurrent: int, rounds: int) -> dict[str, Any]:
    info = await ContainerRuntime(LocalRunner()).probe()
    rex_args = list(info.run_flags)
    console.print(f"{info.binary} {info.version}, cgroups {info.cgroups}; SWE-ReX {SWEREX_VERSION} "
                  f"DockerDeployment(container_runtime='podman', docker_args={rex_args}); image {image}; "
                  f"{os.cpu_count()} cpus; n={n}")

    def rex_deployment() -> DockerDeployment:
        return DockerDeployment(image=image, container_runtime="podman", pull="never", docker_args=rex_args,
                                startup_timeout=120, logger=log)

    live: list[Any] = []
    res: dict[str, Any] = {}
    async with Fleet(name="bench-swerex") as fleet:
        pool = await fleet.pool(PoolSpec(name="peer", mode="persistent", instance=InstanceSpec(cpus=2, memory_gb=4),
                                         min_instances=1, max_instances=1, sandboxes_per_instance=2,
                                         warm_per_image=1, warm_images=(image,)))
        spec = pool.default_sandbox(image)
        try:
            # (a) start to first command
            async def rex_ttfc() -> float:
                d = rex_deployment()
                live.append(d)
                t0 = time.perf_counter()
                await d.start()
                await d.runtime.execute(TRUE)
                dt = time.perf_counter() - t0
                await stop(d)
                live.remove(d)
                return dt

            async def fm_ttfc() -> float:
                await wait_warm(fleet, pool, 1)
                d = FlowMeshDeployment(pool, spec=spec)
                t0 = time.perf_counter()
                await d.start()
                await d.runtime.execute(TRUE)
                dt = time.perf_counter() - t0
                await stop(d)
                return dt

            res["ttfc"] = await alternate(max(3, n // 2), "(a) start to first command", rex_ttfc, fm_ttfc)

            # (b), (c), (e) on one started deployment of each
            rex = rex_deployment()
            live.append(rex)
            await rex.start()
            await wait_warm(fleet, pool, 1)
            fm = FlowMeshDeployment(pool, spec=spec)
            live.append(fm)
            await fm.start()
            await wait_warm(fleet, pool, 1)      # the refill is done: nothing else starts now
            res["exec"] = await alternate(n, "(b) execute round trip", timed(lambda: rex.runtime.execute(TRUE)),
                                          timed(lambda: fm.runtime.execute(TRUE)), STEADY)
            res["exec_output"] = await alternate(n, "(b') execute with output",
                                                 timed(lambda: rex.runtime.execute(ECHO)),
                                                 timed(lambda: fm.runtime.execute(ECHO)), STEADY)
            for d in (rex, fm):
                await d.runtime.create_session(CreateBashSessionRequest())
            true = BashAction(command="true", timeout=30)
            res["session"] = await alternate(n, "(c) session command round trip",
                                             timed(lambda: rex.runtime.run_in_session(true)),
                                             timed(lambda: fm.runtime.run_in_session(true)), STEADY)
            await asyncio.sleep(1.0)             # (e) idle: both have a bash session open
            res["memory"] = (await asyncio.to_thread(container_memory, rex.container_name),
                             await asyncio.to_thread(container_memory, fm.sandbox.container_id))
            for d in (rex, fm):
                await stop(d)
                live.remove(d)
        finally:
            for d in list(live):
                await stop(d)
            live.clear()
        await pool.drain()

        # (d) N small tasks at once
        async def small(d: Any) -> None:
            try:
                await d.start()
                r = await d.runtime.execute(SMALL)
                if r.stdout.strip() != "45":
                    raise RuntimeError(f"{type(d).__name__}: the small task printed {r.stdout!r} {r.stderr!r}")
            finally:
                await stop(d)

        many = await fleet.pool(PoolSpec(name="peer16", mode="persistent",
                                         instance=InstanceSpec(cpus=2, memory_gb=8), min_instances=1,
                                         max_instances=1, sandboxes_per_instance=concurrent,
                                         warm_per_image=concurrent, warm_images=(image,)))
        spec16 = many.default_sandbox(image)
        loop = asyncio.get_running_loop()
        rex_walls: list[float] = []
        fm_walls: list[float] = []
        with concurrent_futures.ThreadPoolExecutor(concurrent, thread_name_prefix="swerex") as threads:
            for rnd in range(1 + rounds):        # round 0 is the unmeasured warm-up of each
                with console.status(f"(d) round {rnd}: {concurrent} concurrent small tasks: SWE-ReX"):
                    # one thread and event loop per task, as SWE-agent's batch mode runs them:
                    # DockerDeployment.start() waits with a blocking time.sleep, so starts on one
                    # loop cannot overlap (its 0.15 s liveness probes time out; it never comes up)
                    t0 = time.perf_counter()
                    await asyncio.gather(*(loop.run_in_executor(threads, asyncio.run, small(rex_deployment()))
                                           for _ in range(concurrent)))
                    rex_walls.append(time.perf_counter() - t0)
                with console.status(f"(d) round {rnd}: {concurrent} concurrent small tasks: FlowMesh"):
                    if rnd:   # the warm-up round's acquisitions refilled the warm pool: wait for it
                        await wait_warm(fleet, many, concurrent)
                    t0 = time.perf_counter()
                    await asyncio.gather(*(small(FlowMeshDeployment(many, spec=spec16)) for _ in range(concurrent)))
                    fm_walls.append(time.perf_counter() - t0)
        res["concurrent"] = (rex_walls[1:], fm_walls[1:])
    return res


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="peer_swerex.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20, help="samples per round-trip measurement (default 20)")
    p.add_argument("--concurrent", type=int, default=16, help="small tasks at once in (d) (default 16)")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds of (d), after a warm-up round (default 2)")
    p.add_argument("--base", default="localhost/flowmesh/swe-base:bookworm",
                   help="the image swe-rex is installed into (needs python3 and bash)")
    args = p.parse_args(argv)
    if min(args.n, args.concurrent, args.rounds) < 1:
        p.error("--n, --concurrent and --rounds must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    image = await asyncio.to_thread(swerex_image, args.base)
    res = await run(image, args.n, args.concurrent, args.rounds)
    table = Table(title="SWE-ReX DockerDeployment (podman) vs FlowMeshDeployment (ms)", title_justify="left")
    for col in ("measurement", "n", "SWE-ReX p50", "SWE-ReX p95", "FlowMesh p50", "FlowMesh p95", "ratio"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    labels = {"ttfc": "(a) start to first command", "exec": "(b) execute round trip",
              "exec_output": "(b') execute with output (echo hi)",
              "session": "(c) session command round trip",
              "concurrent": f"(d) {args.concurrent} concurrent small tasks (wall)"}
    ratios: dict[str, float] = {}
    for key, label in labels.items():
        xs, ys = res[key]
        ratios[key] = pct(ys, 50) / pct(xs, 50)
        table.add_row(label, str(len(xs)), f"{pct(xs, 50) * 1e3:.1f}", f"{pct(xs, 95) * 1e3:.1f}",
                      f"{pct(ys, 50) * 1e3:.1f}", f"{pct(ys, 95) * 1e3:.1f}", f"{ratios[key]:.3f}")
    console.print(table)
    rex_mem, fm_mem = res["memory"]
    console.print(f"(e) idle memory per sandbox (podman stats, one bash session open): SWE-ReX "
                  f"{rex_mem / 1e6:.1f} MB, FlowMesh {fm_mem / 1e6:.1f} MB: memory_vs_swerex={fm_mem / rex_mem:.3f}")
    keys = (("ttfc", "ttfc"), ("exec", "exec"), ("session", "session"), ("concurrent16", "concurrent"))
    for name, key in keys:
        met = ratios[key] <= TARGETS[name]
        console.print(f"{name}_vs_swerex = {ratios[key]:.3f}  target <= {TARGETS[name]:g}: "
                      + ("[bold green]MET[/]" if met else "[bold red]NOT MET[/]"))
    print(" ".join(f"{name}_vs_swerex={ratios[key]:.3f}" for name, key in keys)
          + f" exec_output_vs_swerex={ratios['exec_output']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
