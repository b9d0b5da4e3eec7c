"""``flowmesh cost simulate``: sweep concurrency on the fleet simulator (the real pools on
a simulated cloud, virtual time) and show execution time, cost and the per-phase
breakdown of distributed (ephemeral / persistent) against centralized execution, as a
table and a PNG.  See :mod:`flowmesh_sdk.sim.sweep` and docs/cost-model.md."""

from __future__ import annotations

import importlib.util
import time
from typing import Optional

import typer
from rich.table import Table

from ..catalog import Catalog
from ..catalog.records import canonical_provider
from ..errors import FlowMeshError, SpecError
from ..specs import check_number
from .console import console as tables
from .console import err, fail, prices
from .output import JSON_HELP, emit

MODES = ("ephemeral", "persistent", "centralized")


def cost_simulate(
        tasks: str = typer.Option("1,10,100,1000,10000", "--tasks",
                                  help="concurrency levels to sweep (comma-separated)"),
        minutes: float = typer.Option(100.0, "--minutes", help="minutes each task executes"),
        provider: Optional[str] = typer.Option(None, "--provider",
                                               help="catalog provider to simulate (default: the one whose "
                                                    "launch profile publishes the fullest API table)"),
        region: Optional[str] = typer.Option(None, "--region", help="region (default: the first in the catalog)"),
        instance: Optional[str] = typer.Option(None, "--instance",
                                               help="distributed instance type (default: cheapest 8 vCPU / 16 GiB)"),
        centralized: Optional[str] = typer.Option(None, "--centralized",
                                                  help="centralized instance type (default: most vCPUs)"),
        tasks_per_instance: int = typer.Option(50, "--tasks-per-instance",
                                               help="tasks per centralized machine (MegaFlow: 50)"),
        centralized_capacity: int = typer.Option(40, "--centralized-capacity",
                                                 help="most centralized machines available (MegaFlow: 40)"),
        modes: str = typer.Option(",".join(MODES), "--modes", help="which of ephemeral,persistent,centralized"),
        image_gb: float = typer.Option(2.0, "--image-gb", help="GB of image each task pulls"),
        price: Optional[list[str]] = typer.Option(None, "--price", help="TYPE=USD: use this $/h for TYPE (repeat)"),
        seed: int = typer.Option(0, "--seed", help="random seed (boot times, interruptions)"),
        plot: str = typer.Option("flowmesh-simulate.png", "--plot", help="where to write the PNG ('' for none)"),
        json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """MegaFlow's scaling experiment on the simulator, with a per-phase breakdown."""
    from ..sim.sweep import (SweepConfig, SweepRow, cloud_for, default_provider, phases_minutes, pick_rows,
                             plot as draw, run_sweep, sim_type)

    console = err if json_out else tables   # with --json, stdout carries only the document
    try:
        levels = [int(x) for x in tasks.split(",") if x.strip()]
    except ValueError:
        raise fail(SpecError("--tasks", f"must be comma-separated integers, got {tasks!r}")) from None
    if not levels or any(n < 1 or n > 100_000 for n in levels):
        raise fail(SpecError("--tasks", "each level must be in [1, 100000]"))
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise fail(SpecError("--plot", "drawing the PNG needs matplotlib: pip install 'flowmesh-sdk[plot]' "
                                        "(or --plot '' for tables only)"))
    try:   # before anything is printed: the workload's own checks would come after the preamble
        check_number("--minutes", minutes, lo=0, lo_open=True)
        check_number("--image-gb", image_gb, lo=0)
        check_number("--tasks-per-instance", tasks_per_instance, lo=1, integer=True)
        check_number("--centralized-capacity", centralized_capacity, lo=1, integer=True)
    except SpecError as exc:
        raise fail(exc) from exc
    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in wanted if m not in MODES]
    if bad or not wanted:
        raise fail(SpecError("--modes", f"choose from {', '.join(MODES)}; got {modes!r}"))
    try:
        prov = canonical_provider(provider or default_provider())
        catalog = Catalog.load([prov], warn=False).with_prices(prices(price))
        where, small, big = pick_rows(catalog, prov, region, instance, centralized)
        cloud = cloud_for(prov, where, [sim_type(small), sim_type(big, capacity=centralized_capacity)])
    except FlowMeshError as exc:
        raise fail(exc) from exc
    configs = {"ephemeral": SweepConfig("distributed ephemeral", small.instance_type, "ephemeral", 1, False),
               "persistent": SweepConfig("distributed persistent", small.instance_type, "persistent", 1, True),
               "centralized": SweepConfig(f"centralized ({tasks_per_instance}/machine)", big.instance_type,
                                          "persistent", tasks_per_instance, True, centralized_capacity)}
    chosen = [configs[m] for m in wanted]
    console.print(f"simulating {prov}/{where}: distributed {small.instance_type} "
                  f"({small.cpus:g} vCPU, ${cloud.type(small.instance_type).price_per_hour:.4f}/h), centralized "
                  f"{big.instance_type} ({big.cpus:g} vCPU, ${cloud.type(big.instance_type).price_per_hour:.4f}/h, "
                  f"at most {centralized_capacity}); {minutes:g}-minute tasks, {image_gb:g} GB image each")
    for note in cloud.notes:
        console.print(f"[dim]  {note}[/dim]")

    def progress(n: int, cfg: SweepConfig, row: SweepRow) -> None:
        r = row.result
        what = "no capacity" if r is None else f"{r.makespan_s / 60:.1f} min, ${r.cost_usd:,.2f}"
        console.print(f"[dim]  {n:>6} tasks  {cfg.label:<32} {what}  ({time.monotonic() - t0:.1f} s)[/dim]")

    t0 = time.monotonic()
    try:
        rows = run_sweep(cloud, chosen, levels, minutes=minutes, image_gb=image_gb, seed=seed, progress=progress)
    except FlowMeshError as exc:
        raise fail(exc) from exc
    if json_out:
        if plot:
            draw(rows, plot, f"{prov}/{where}: {small.instance_type} per task vs {big.instance_type} x "
                             f"{tasks_per_instance} tasks (simulated)")
        emit("cost.simulate", provider=prov, region=where, seed=seed, minutes=minutes, image_gb=image_gb,
             distributed_type=small.instance_type, centralized_type=big.instance_type, plot=plot or None,
             rows=[{"tasks": r.tasks, "configuration": r.config.label, "mode": r.config.mode,
                    "instance_type": r.config.instance_type, "tasks_per_instance": r.config.tasks_per_instance,
                    "result": None if r.result is None else {
                        "makespan_s": r.result.makespan_s, "cost_usd": r.result.cost_usd,
                        "instances_launched": r.result.instances_launched, "succeeded": r.result.succeeded,
                        "failed": r.result.failed, "interrupted": r.result.interrupted,
                        "failovers": r.result.failovers, "phases_mean_s": r.result.phases_mean}}
                   for r in rows])
        return
    table = Table(title=f"execution time and cost against concurrency ({prov}/{where}, seed {seed})")
    for col in ("tasks", "configuration", "instances", "exec time (min)", "cost $", "$ / task", "failed"):
        table.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        res = r.result
        if res is None:
            table.add_row(f"{r.tasks:,}", r.config.label, "-", "no capacity", "-", "-", "-")
            continue
        table.add_row(f"{r.tasks:,}", r.config.label, f"{res.instances_launched:,}", f"{res.makespan_s / 60:.1f}",
                      f"{res.cost_usd:,.2f}", f"{res.cost_usd / r.tasks:.3f}", str(res.failed))
    console.print(table)
    phases = Table(title="per-phase breakdown, mean minutes per task (MegaFlow's paper gives none)")
    for col in ("tasks", "configuration", "queued", "scheduling", "env startup", "execution", "teardown"):
        phases.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        if r.result is not None:
            phases.add_row(f"{r.tasks:,}", r.config.label,
                           *(f"{x:.2f}" for x in phases_minutes(r.result.phases_mean)))
    console.print(phases)
    by = {(r.tasks, r.config.label): r.result for r in rows if r.result}
    for n in levels:
        d, c = by.get((n, configs["ephemeral"].label)), by.get((n, configs["centralized"].label))
        if d and c and "ephemeral" in wanted and "centralized" in wanted:
            saving = 1 - d.cost_usd / c.cost_usd
            console.print(f"{n:,} tasks: distributed ephemeral costs {abs(saving) * 100:.1f}% "
                          f"{'less' if saving >= 0 else 'more'} than centralized")
    if plot:
        draw(rows, plot, f"{prov}/{where}: {small.instance_type} per task vs {big.instance_type} x "
                         f"{tasks_per_instance} tasks; {minutes:g}-min tasks (simulated)")
        console.print(f"plot written to {plot}")
