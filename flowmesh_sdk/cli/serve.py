"""``flowmesh serve sandbox-fusion``: a SandboxFusion-compatible HTTP server
(:mod:`flowmesh_sdk.integrations.sandbox_fusion`) on a pool this command makes, until
SIGINT or SIGTERM, then the pool drained and the fleet closed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from typing import Any, Optional

import typer

from ..errors import FlowMeshError, SpecError

serve_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="Serve other projects' sandbox APIs on a FlowMesh pool.")


@serve_app.command("sandbox-fusion")
def sandbox_fusion(
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
        port: int = typer.Option(8080, "--port", help="TCP port (SandboxFusion's default 8080; 0: any free one)"),
        fleet_name: str = typer.Option("sandbox-fusion", "--fleet", help="the fleet's name"),
        pool_name: str = typer.Option("sandbox-fusion", "--pool", help="the pool's name"),
        mode: str = typer.Option("persistent", "--mode", help="persistent, ephemeral or auto"),
        infra: list[str] = typer.Option([], "--infra", "-p",
                                        help="a search-space entry: PROVIDER, PROVIDER/REGION or "
                                             "PROVIDER/REGION/ZONE (repeat; default local)"),
        cpus: Optional[int] = typer.Option(None, "--cpus", help="cpus per instance (default: this host's, at most 8)"),
        memory: Optional[float] = typer.Option(None, "--memory", help="GB per instance (default: 2 per cpu)"),
        slots: Optional[int] = typer.Option(None, "--slots", help="sandboxes per instance (default: one per cpu)"),
        min_instances: int = typer.Option(1, "--min-instances", help="warm instances kept (persistent)"),
        max_instances: int = typer.Option(1, "--max-instances", help="most instances at once"),
        spot: str = typer.Option("never", "--spot", help="never, prefer or only"),
        max_price: Optional[float] = typer.Option(None, "--max-price", help="$/h per instance at most"),
        budget_per_hour: Optional[float] = typer.Option(None, "--budget-per-hour", help="$/h the pool may burn"),
        budget_total: Optional[float] = typer.Option(None, "--budget-total", help="$ the pool may spend in all"),
        image: list[str] = typer.Option([], "--image", help="LANG=IMAGE: the image a language runs in (repeat)"),
        queue: int = typer.Option(256, "--queue", help="requests queued beyond the slots; more: 'overloaded'"),
        queue_timeout: float = typer.Option(600.0, "--queue-timeout", help="seconds a request may wait for a slot"),
        metrics_port: Optional[int] = typer.Option(None, "--metrics-port",
                                                   help="also serve the fleet's Prometheus metrics on this port"),
) -> None:
    """Serve SandboxFusion's /run_code and /run_jupyter on a FlowMesh pool (needs the sandbox-fusion extra).

    Each request runs in a fresh sandbox; python, bash, cpp and pytest by default, in
    localhost/flowmesh/code-runner:bookworm (built here if missing)."""
    from ..specs import InstanceSpec, PoolMode, PoolSpec, check_number
    try:
        from ..integrations.sandbox_fusion import ServerConfig, parse_image_overrides
        modes = {m.value: m for m in PoolMode}
        if mode not in modes:
            raise SpecError("--mode", f"must be one of {', '.join(modes)}, got {mode!r}")
        for name, value in (("--cpus", cpus), ("--slots", slots)):
            if value is not None:
                check_number(name, value, lo=1, integer=True)
        if memory is not None:
            check_number("--memory", memory, lo=0, lo_open=True)
        images = parse_image_overrides(image)
        n = min(8, os.cpu_count() or 1) if cpus is None else cpus
        spec = PoolSpec(name=pool_name, mode=modes[mode], infra=tuple(infra) or ("local",),
                        instance=InstanceSpec(cpus=n, memory_gb=2.0 * n if memory is None else memory),
                        sandboxes_per_instance=n if slots is None else slots,
                        min_instances=min_instances if mode != "ephemeral" else 0,
                        max_instances=max_instances, spot=spot, max_price=max_price,
                        budget_per_hour=budget_per_hour, budget_total=budget_total)
        config = ServerConfig(host=host, port=port, queue_size=queue, queue_timeout_s=queue_timeout)
        asyncio.run(_serve(fleet_name, spec, config, images, metrics_port))
    except FlowMeshError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


async def _serve(fleet_name: str, spec: Any, config: Any, images: dict[str, str], metrics_port: int | None) -> None:
    from ..fleet import Fleet
    from ..imagebuild import build
    from ..specs import PoolMode
    from ..integrations.sandbox_fusion import SandboxFusionServer, with_images

    languages = with_images(config.languages, images)
    if any(lang.image == build.CODE_RUNNER_IMAGE for lang in languages.values()) and \
            not await asyncio.to_thread(build.image_exists, build.CODE_RUNNER_IMAGE):
        typer.echo(f"building {build.CODE_RUNNER_IMAGE} (once)", err=True)
        await asyncio.to_thread(build.build_code_runner)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if spec.mode is PoolMode.PERSISTENT:   # a request starts on a container that is up already
        warm = tuple(sorted({lang.image for lang in languages.values()}))   # the slots shared among the images
        spec = dataclasses.replace(spec, warm_images=warm,
                                   warm_per_image=max(1, spec.sandboxes_per_instance // len(warm)))
    fleet = Fleet(fleet_name, metrics_port=metrics_port)
    try:
        pool = await fleet.pool(spec)
        server = SandboxFusionServer(pool, config, images=images)
        await server.start()
        typer.echo(f"sandbox-fusion: serving {server.url} (pool {spec.name}: {server.admission.slots} slots, "
                   f"queue {config.queue_size}; languages {', '.join(sorted(server.config.languages))}); "
                   "Ctrl-C to stop")
        try:
            await stop.wait()
        finally:
            typer.echo("sandbox-fusion: stopping (finishing what runs, draining the pool)", err=True)
            await server.stop()
    finally:
        await fleet.close(timeout_s=120)
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")
