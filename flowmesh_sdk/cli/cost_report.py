"""``flowmesh cost report``: what a run cost, from this home's metadata store (or a shared
fleet's, with ``FLOWMESH_STATE``), during or after it.  See
:mod:`flowmesh_sdk.observe.cost_report`."""

from __future__ import annotations

import importlib.util
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..control.store import MetadataStore
from ..errors import SpecError
from ..observe.cost_report import CostReport, cost_report, spend_over_time
from .console import console as tables
from .console import err, fail
from .output import JSON_HELP, emit
from .shared import open_store


def report(run: Optional[str] = typer.Option(None, "--run", help="one run (Fleet(run=...)); default every run"),
           pool: Optional[str] = typer.Option(None, "--pool", help="one pool; default every pool"),
           plot: str = typer.Option("", "--plot", help="also draw spend over time by provider to this PNG"),
           json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """What a run cost: tasks, solved and infrastructure-failed, $ in all, per task and per
    solved task, idle warm $, by provider/region/type and by tenant."""
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise fail(SpecError("--plot", "drawing the PNG needs matplotlib: pip install 'flowmesh-sdk[plot]'"))
    store = open_store()
    try:
        rep = cost_report(store, run=run, pool=pool)
        if run is not None and not rep.runs:
            known = sorted({t.run for t in store.tasks_of() if t.run})
            raise fail(SpecError("--run", f"no run {run!r} in this store; runs here: "
                                          f"{', '.join(known[-10:]) or 'none'}"))
        if plot:
            _draw(store, rep, plot)
    finally:
        store.close()
    if json_out:
        emit("cost.report", report=rep, plot=plot or None)
        return
    _print(rep)
    if plot:
        err.print(f"wrote {escape(plot)}")


def _usd(v: float | None) -> str:
    return "-" if v is None else f"${v:,.4f}"


def _print(rep: CostReport) -> None:
    scope = f"run {rep.run}" if rep.run else f"{len(rep.runs)} run(s)"
    tables.print(f"[bold]{escape(scope)}[/bold]" + (f", pool {escape(rep.pool)}" if rep.pool else "")
                 + f": {rep.tasks} task(s) ended ({rep.running} running), {rep.solved} solved, "
                 f"{rep.infra_failed} failed by the infrastructure"
                 + (" (" + ", ".join(f"{k} {n}" for k, n in rep.infra) + ")" if rep.infra else ""))
    tables.print(f"total {_usd(rep.total_usd)}: tasks {_usd(rep.tasks_usd)}, idle {_usd(rep.idle_usd)} "
                 f"(warm capacity, boots and billing minimums no task held); "
                 f"per task {_usd(rep.per_task_usd)}, per solved task {_usd(rep.per_solved_usd)}")
    places = Table(title="by provider, region and type")
    for col in ("provider", "region", "type", "market", "instances", "$"):
        places.add_column(col)
    for p in rep.by_place:
        places.add_row(p.provider, p.region, p.type, "spot" if p.spot else "on-demand", str(p.instances), _usd(p.usd))
    tables.print(places)
    tenants = Table(title="by tenant (the sum of its tasks' costs)")
    for col in ("tenant", "tasks", "solved", "infra failed", "$"):
        tenants.add_column(col)
    for t in rep.by_tenant:
        tenants.add_row(t.tenant, str(t.tasks), str(t.solved), str(t.infra_failed), _usd(t.usd))
    tables.print(tenants)


def _draw(store: MetadataStore, rep: CostReport, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = spend_over_time(store.charges(run=rep.run, pool=rep.pool))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for prov, points in series.items():
        ax.plot([t / 60.0 for t, _ in points], [usd for _, usd in points], label=prov)
    ax.set_xlabel("minutes since the first launch")
    ax.set_ylabel("$ spent (cumulative)")
    ax.set_title(f"spend by provider: {rep.run or 'every run'}")
    if series:
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:   # a folder that is not there, or not writable
        raise fail(SpecError("--plot", f"cannot write {path}: {exc.strerror or exc}")) from exc
    finally:
        plt.close(fig)


__all__ = ["report"]
