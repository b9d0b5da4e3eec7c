"""The ``flowmesh`` command line: run recipes, inspect pools and tasks, reclaim leftovers."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from .. import gc as gc_mod
from ..config import home_dir
from ..control.store import MetadataStore
from ..errors import FlowMeshError
from ..provider import LABEL_INSTANCE, LABEL_POOL, available_providers, load_provider
from ..remote.local import LocalRunner
from ..remote.runtime import ContainerRuntime

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="FlowMesh SDK: sandboxes and GPU workers for RL, on any cloud.")
console = Console()
err = Console(stderr=True)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)", re.ASCII)


def parse_duration(text: str) -> float:
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise typer.BadParameter(f"{text!r}: use a number with s, m, h or d (e.g. 30m, 2h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _ms(v: float | None) -> str:
    return f"{v * 1000:.0f}" if v is not None else "-"


def _store() -> MetadataStore:
    return MetadataStore(home_dir() / "flowmesh.db")


def _find_recipe(name: str) -> Path:
    cand = Path(name)
    if cand.suffix == ".py" and cand.is_file():
        return cand
    roots = [Path.cwd() / "recipes", Path(__file__).resolve().parents[2] / "recipes"]
    for root in roots:
        path = root / f"{name.removesuffix('.py')}.py"
        if path.is_file():
            return path
    known = sorted({p.stem for r in roots if r.is_dir() for p in r.glob("*.py") if not p.stem.startswith("_")})
    raise typer.BadParameter(f"no recipe {name!r}; known: {', '.join(known) or 'none'}",
                             param_hint="RECIPE")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(ctx: typer.Context, recipe: str = typer.Argument(..., help="recipe name or path to a .py")) -> None:
    """Run a recipe script (recipes/NAME.py) with the remaining arguments."""
    path = _find_recipe(recipe)
    sys.argv = [str(path), *ctx.args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exc:
        raise typer.Exit(exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1))


@app.command()
def pools(explain: bool = typer.Option(False, "--explain",
                                       help="show each pool's launch decisions: winner and runner-up with "
                                            "T, C, G_loc and U, failovers and budget refusals"),
          pool: str = typer.Option(None, "--pool", help="only this pool (with --explain)")) -> None:
    """Pools recorded in the metadata store, with their task counts and spend."""
    store = _store()
    try:
        rows = store.pools()
        tasks = store.tasks(limit=1_000_000)
        spend = store.spend()
        decisions = store.decisions(pool=pool, limit=200) if explain else []
    finally:
        store.close()
    table = Table(title=f"pools ({home_dir()})")
    for col in ("fleet", "pool", "mode", "infra", "created", "drained", "tasks", "succeeded", "failed",
                "spent $", "burn $/h"):
        table.add_column(col)
    for p in rows:
        spec = json.loads(p.spec or "{}")
        mine = [t for t in tasks if t.fleet == p.fleet and t.pool == p.name]
        cost = [r for r in spend if r.fleet == p.fleet and r.pool == p.name]
        infra = spec.get("infra") or [spec.get("provider", "")]
        table.add_row(p.fleet, p.name, str(spec.get("mode", "")), ", ".join(map(str, infra)),
                      _when(p.created_at), _when(p.drained_at), str(len(mine)),
                      str(sum(t.state == "succeeded" for t in mine)),
                      str(sum(t.state in ("failed", "timed_out", "rejected") for t in mine)),
                      f"{sum(r.spent for r in cost):.4f}", f"{sum(r.burn_per_hour for r in cost):.4f}")
    console.print(table)
    if explain:
        _print_decisions(decisions)


def _print_decisions(decisions: list) -> None:  # list[DecisionRow]
    dt = Table(title="launch decisions (newest first)")
    for col in ("when", "pool", "what", "winner (T, C, G_loc, U)", "runner-up (T, C, G_loc, U)"):
        dt.add_column(col)
    for d in decisions:
        if d.kind == "decided":
            data = json.loads(d.detail)

            def side(x: dict | None) -> str:
                if not x:
                    return "-"
                return (f"{x['offer']} ${x['price_per_hour']:.4f}/h x{x['slots']}: "
                        f"T={x['T']:.3f} C={x['C']:.3f} G={x['G_loc']:g} U={x['U']:.3f}")
            dt.add_row(_when(d.at), d.pool, f"launch {data['count']}", side(data.get("winner")),
                       side(data.get("runner_up")))
        else:
            text = d.detail
            if d.kind == "refused":
                text = json.loads(d.detail).get("reason", d.detail)
            dt.add_row(_when(d.at), d.pool, d.kind, text, "")
    console.print(dt)


@app.command()
def status(limit: int = typer.Option(20, help="recent tasks to show")) -> None:
    """Live instances and the most recent tasks with per-phase latency (ms)."""
    store = _store()
    try:
        insts = store.instances(live_only=True)
        spend = store.spend()
        tasks = store.tasks(limit=limit)
        reuse = store.reuse_summary()
    finally:
        store.close()
    it = Table(title="instances not terminated")
    for col in ("id", "fleet", "pool", "state", "requested", "ready", "detail"):
        it.add_column(col)
    for i in insts:
        it.add_row(i.id, i.fleet, i.pool, i.state, _when(i.requested_at), _when(i.ready_at), i.detail[:60])
    console.print(it)
    if spend:
        st = Table(title="spend (launch to confirmed termination, at each offer's price)")
        for col in ("fleet", "pool", "provider", "spent $", "burn $/h", "live"):
            st.add_column(col)
        for r in spend:
            st.add_row(r.fleet, r.pool, r.provider, f"{r.spent:.4f}", f"{r.burn_per_hour:.4f}", str(r.live))
        console.print(st)
    tt = Table(title=f"last {limit} tasks (ms)")
    for col in ("task", "pool", "state", "exit", "queued", "sched", "env", "exec", "teardown", "detail"):
        tt.add_column(col)
    for t in tasks:
        tt.add_row(t.name, t.pool, t.state, "-" if t.exit_code is None else str(t.exit_code),
                   _ms(t.queued_s), _ms(t.scheduling_s), _ms(t.env_startup_s), _ms(t.execution_s),
                   _ms(t.teardown_s), (t.detail or "")[:60])
    console.print(tt)
    if reuse:
        # result reuse (flowmesh_sdk.reuse): requests answered without running anything
        rt = Table(title="result reuse")
        for col in ("fleet", "hits", "joins", "executions", "compute saved (s)", "requests saved"):
            rt.add_column(col)
        for r in reuse:
            total = r.hits + r.joins + r.executions
            rt.add_row(r.fleet, str(r.hits), str(r.joins), str(r.executions), f"{r.saved_s:.1f}",
                       f"{100 * (r.hits + r.joins) / total:.0f}%" if total else "-")
        console.print(rt)


@app.command()
def gc(provider: list[str] = typer.Option(["local"], "--provider", "-p",
                                          help="provider(s) to sweep (repeat); default local"),
       older_than: Optional[str] = typer.Option(None, help="also take instances whose owner is "
                                                "on another host and that are older than this (30m, 2h)"),
       all_: bool = typer.Option(False, "--all", help="take every SDK instance, even of live owners"),
       fleet: Optional[str] = typer.Option(None, "--fleet", help="only this fleet's instances and "
                                           "containers (default: every fleet of this FLOWMESH_HOME)"),
       yes: bool = typer.Option(False, "--yes", "-y", help="act; without it, only list (dry run)")) -> None:
    """Find instances and containers this FLOWMESH_HOME left behind (by their tags and its
    records) and remove them; removals are recorded in the metadata store."""
    known = available_providers()
    for name in provider:
        if name not in known:
            raise typer.BadParameter(f"unknown provider {name!r}; installed: {', '.join(sorted(known))}",
                                     param_hint="--provider")
    age = parse_duration(older_than) if older_than else None
    try:
        asyncio.run(_gc(provider, age, all_, yes, fleet))
    except FlowMeshError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc


async def _gc(names: list[str], age: float | None, all_: bool, yes: bool, fleet: str | None = None) -> None:
    store = _store()
    try:
        await _gc_with(store, names, age, all_, yes, fleet)
    finally:
        await store.flush()
        store.close()


async def _gc_with(store: MetadataStore, names: list[str], age: float | None, all_: bool, yes: bool,
                   fleet: str | None) -> None:
    providers = [load_provider(n) for n in names]
    runtime = ContainerRuntime(LocalRunner()) if "local" in names else None
    if runtime is not None:
        try:
            await runtime.probe()
        except FlowMeshError as exc:
            err.print(f"[yellow]skipping containers:[/yellow] {exc}")
            runtime = None
    known = {r.id for r in await asyncio.to_thread(store.instances)}   # what this home launched
    the_plan = await gc_mod.plan(providers, runtime, older_than_s=age, include_live=all_,
                                 known_instances=known, fleet=fleet)
    table = Table(title="left behind" + ("" if yes else " (dry run: --yes to remove)"))
    for col in ("kind", "provider", "id", "pool", "age", "why"):
        table.add_column(col)
    for o in the_plan.instances:
        table.add_row("instance", o.provider, o.instance_id, o.pool, f"{o.age_s:.0f}s", o.reason)
    for c in the_plan.containers:
        table.add_row("container", "local", c.name, c.labels.get(LABEL_POOL, ""), "-",
                      f"instance {c.labels.get(LABEL_INSTANCE, '?')}")
    total = len(the_plan.instances) + len(the_plan.containers)
    if not total:
        console.print("nothing left behind")
        return
    console.print(table)
    if not yes:
        console.print(f"{total} item(s) would be removed; run again with --yes")
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=console) as prog:
        bar = prog.add_task("removing", total=total)
        res = await gc_mod.execute(the_plan, providers, runtime,
                                   progress=lambda _i: prog.advance(bar), store=store)
    console.print(f"terminated {len(res.terminated)} instance(s), removed "
                  f"{len(res.containers_removed)} container(s)")
    if res.still_present:
        err.print(f"[red]still present after terminate:[/red] {', '.join(res.still_present)}")
        raise typer.Exit(2)


from .cost import register as _register_cost  # noqa: E402 - `offers`, `catalog`, `cost` (cli/cost.py)

_register_cost(app)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
