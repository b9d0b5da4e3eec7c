"""``flowmesh serve-metrics`` and ``flowmesh top``: a FLOWMESH_HOME's metadata store as
Prometheus metrics, and as a live terminal view."""

from __future__ import annotations

import sys
import threading
import time
from typing import Optional

import typer

from ..config import home_dir
from ..control.store import MetadataStore
from ..errors import FlowMeshError


def _open_store() -> MetadataStore:
    return MetadataStore(home_dir() / "flowmesh.db")


def serve_metrics(port: int = typer.Option(9464, "--port", min=0, max=65535, help="TCP port of /metrics (0: any free one)"),
                  addr: str = typer.Option("127.0.0.1", "--addr", help="address to listen on"),
                  once: bool = typer.Option(False, "--once", help="print one scrape on stdout and exit")) -> None:
    """Serve the metadata store of this FLOWMESH_HOME as Prometheus metrics (flowmesh_store_*),
    read at each scrape; a fleet's own live metrics come from Fleet(metrics_port=...)."""
    import prometheus_client

    from ..observe import metrics
    try:
        registry = metrics.store_registry(_open_store)
        if once:
            sys.stdout.write(prometheus_client.generate_latest(registry).decode())
            return
        server, _thread = metrics.listen(registry, port, addr, field="--port/--addr")
    except FlowMeshError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"serving {home_dir() / 'flowmesh.db'} on http://{addr}:{server.server_port}/metrics "
               "(Ctrl-C to stop)", err=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


def top(interval: float = typer.Option(1.0, "--interval", help="seconds between refreshes"),
        fleet: Optional[str] = typer.Option(None, "--fleet", help="only this fleet (default: every fleet of the home)"),
        once: bool = typer.Option(False, "--once", help="draw one screen and exit"),
        json_out: bool = typer.Option(False, "--json", help="print one snapshot as JSON and exit (schema flowmesh.top/1)"),
        ) -> None:
    """A live view of a fleet from this FLOWMESH_HOME's metadata store: instances by provider,
    region and state, tasks by phase, throughput, failovers, spend and burn, slowest phases."""
    from rich.console import Console
    from rich.live import Live

    from .shared import shared_store
    from .top import TopSnapshot, as_json, render, snapshot
    if interval <= 0:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--interval")
    store = _open_store()
    home = str(home_dir())

    def take() -> TopSnapshot:
        shared = shared_store()   # FLOWMESH_STATE=redis://...: the whole shared fleet, replayed anew
        if shared is None:
            return snapshot(store, fleet)
        try:
            return snapshot(shared, fleet)
        finally:
            shared.close()
    try:
        if json_out:
            sys.stdout.write(as_json(take()) + "\n")
            return
        console = Console()
        if once:
            console.print(render(take(), home))
            return
        with Live(render(take(), home), console=console, auto_refresh=False, screen=console.is_terminal) as live:
            while True:
                time.sleep(interval)
                live.update(render(take(), home), refresh=True)
    except KeyboardInterrupt:
        pass
    except FlowMeshError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        store.close()


def register(app: typer.Typer) -> None:
    app.command("serve-metrics")(serve_metrics)
    app.command("top")(top)
