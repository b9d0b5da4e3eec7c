"""The ``flowmesh`` command line: run recipes, inspect pools and tasks, reclaim leftovers."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import importlib.util
import inspect
import json
import os
import re
import runpy
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperCommand
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from .. import gc as gc_mod
from .. import settings
from ..config import home_dir
from ..control.store import DecisionRow, MetadataStore
from ..errors import FlowMeshError
from ..observe import logs
from ..provider import LABEL_INSTANCE, LABEL_POOL, available_providers, load_provider
from ..remote.local import LocalRunner
from ..remote.runtime import ContainerRuntime
from .output import JSON_HELP, emit
from .shared import SharedGc, open_store, print_shared, shared_gc, shared_status

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="FlowMesh SDK: sandboxes and GPU workers for RL, on any cloud.")
console = Console()
err = Console(stderr=True)



@app.callback()
def _global(verbose: int = typer.Option(0, "--verbose", "-v", count=True,
                                        help="log more to stderr: -v info, -vv debug"),
            log_level: Optional[str] = typer.Option(None, "--log-level",
                                                    help=f"the flowmesh logger's level: {', '.join(logs.LEVELS)} "
                                                         "(overrides -v)"),
            log_json: bool = typer.Option(False, "--log-json", help="log JSON lines to stderr")) -> None:
    """FlowMesh SDK: sandboxes and GPU workers for RL, on any cloud."""
    try:   # argument > FLOWMESH_LOG_LEVEL / FLOWMESH_LOG_JSON > flowmesh.toml [log] > warning, text
        if log_level is None and verbose == 0:
            log_level = settings.value("log.level")
        level = logs.level_from(verbose, log_level)
        json_lines = bool(settings.value("log.json", True if log_json else None))
    except (ValueError, FlowMeshError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--log-level") from None
    logs.configure(level, json_lines=json_lines)


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


_store = open_store


def recipe_roots() -> list[Path]:
    """Where ``flowmesh run NAME`` looks, first match wins: ``./recipes`` (your own), then
    the recipes shipped in the package (``flowmesh_recipes``, the checkout's ``recipes/``
    in a development install)."""
    roots = [Path.cwd() / "recipes"]
    spec = importlib.util.find_spec("flowmesh_recipes")
    if spec is not None and spec.submodule_search_locations:
        roots.extend(Path(p) for p in spec.submodule_search_locations)
    return roots


def known_recipes(roots: list[Path] | None = None) -> list[str]:
    """The recipe names ``flowmesh run`` finds (helpers, ``_*.py``, left out)."""
    return sorted({p.stem for r in (roots if roots is not None else recipe_roots()) if r.is_dir()
                   for p in r.glob("*.py") if not p.stem.startswith("_")})


def _find_recipe(name: str) -> Path:
    cand = Path(name)
    if cand.suffix == ".py" and cand.is_file():
        return cand
    roots = recipe_roots()
    for root in roots:
        path = root / f"{name.removesuffix('.py')}.py"
        if path.is_file():
            return path
    raise typer.BadParameter(f"no recipe {name!r}; known: {', '.join(known_recipes(roots)) or 'none'}",
                             param_hint="RECIPE")


class _RunCommand(TyperCommand):
    """``flowmesh run``'s help ends with the recipes it finds from here (``--help`` is
    only the run command's own before RECIPE: everything after it goes to the recipe)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:   # click's Context and HelpFormatter
        self.epilog = f"Known recipes: {', '.join(known_recipes()) or 'none'}."
        super().format_help(ctx, formatter)


# allow_interspersed_args=False: option parsing stops at RECIPE, so every argument after it
# (--help and -h included) reaches the recipe untouched, in order
@app.command(cls=_RunCommand,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                               "allow_interspersed_args": False})
def run(ctx: typer.Context,
        recipe: Optional[str] = typer.Argument(None, show_default=False, metavar="RECIPE",
                                               help="recipe name or path to a .py; every argument after "
                                                    "it, --help included, goes to the recipe")) -> None:
    """Run a recipe script (./recipes/NAME.py, else one shipped in the package) with the remaining arguments.

    Every argument after RECIPE goes to the recipe: `flowmesh run RECIPE --help` shows the recipe's own options."""
    if recipe is None:
        ctx.fail(f"Missing argument 'RECIPE': the recipe to run (known: {', '.join(known_recipes()) or 'none'}).")
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
          pool: str = typer.Option(None, "--pool", help="only this pool (with --explain)"),
          json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Pools recorded in the metadata store, with their task counts and spend."""
    store = _store()
    try:
        rows = store.pools()
        tasks = store.tasks(limit=1_000_000)
        spend = store.spend()
        decisions = store.decisions(pool=pool, limit=200) if explain else []
    finally:
        store.close()
    summary: list[dict[str, Any]] = []
    for p in rows:
        spec = json.loads(p.spec or "{}")
        mine = [t for t in tasks if t.fleet == p.fleet and t.pool == p.name]
        cost = [r for r in spend if r.fleet == p.fleet and r.pool == p.name]
        summary.append({
            "fleet": p.fleet, "pool": p.name, "mode": str(spec.get("mode", "")),
            "infra": [str(x) for x in (spec.get("infra") or [spec.get("provider", "")])],
            "created_at": p.created_at, "drained_at": p.drained_at, "tasks": len(mine),
            "succeeded": sum(t.state == "succeeded" for t in mine),
            "failed": sum(t.state in ("failed", "timed_out", "rejected") for t in mine),
            "spent_usd": sum(r.spent for r in cost), "burn_usd_per_hour": sum(r.burn_per_hour for r in cost)})
    if json_out:
        emit("pools", home=str(home_dir()), pools=summary,
             decisions=[_decision_json(d) for d in decisions] if explain else None)
        return
    table = Table(title=f"pools ({home_dir()})")
    for col in ("fleet", "pool", "mode", "infra", "created", "drained", "tasks", "succeeded", "failed",
                "spent $", "burn $/h"):
        table.add_column(col)
    for r in summary:
        table.add_row(r["fleet"], r["pool"], r["mode"], ", ".join(r["infra"]), _when(r["created_at"]),
                      _when(r["drained_at"]), str(r["tasks"]), str(r["succeeded"]), str(r["failed"]),
                      f"{r['spent_usd']:.4f}", f"{r['burn_usd_per_hour']:.4f}")
    console.print(table)
    if explain:
        _print_decisions(decisions)


def _decision_json(d: DecisionRow) -> dict[str, object]:
    """A decision with its detail parsed (decided / refused carry JSON, failover a sentence)."""
    try:
        detail: object = json.loads(d.detail) if d.kind in ("decided", "refused") else d.detail
    except ValueError:
        detail = d.detail
    return {"fleet": d.fleet, "pool": d.pool, "kind": d.kind, "at": d.at, "detail": detail}


def _print_decisions(decisions: list[DecisionRow]) -> None:
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
def status(limit: int = typer.Option(20, min=1, help="recent tasks to show"),
           json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Live instances and the most recent tasks with per-phase latency (ms)."""
    store = _store()
    try:
        insts = store.instances(live_only=True)
        spend = store.spend()
        tasks = store.tasks(limit=limit)
        reuse = store.reuse_summary()
    finally:
        store.close()
    if json_out:
        emit("status", home=str(home_dir()), instances=insts, spend=spend, tasks=tasks, reuse=reuse,
             **({"shared": shared_status()} if shared_status() else {}))
        return
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
        for ru in reuse:
            total = ru.hits + ru.joins + ru.executions
            rt.add_row(ru.fleet, str(ru.hits), str(ru.joins), str(ru.executions), f"{ru.saved_s:.1f}",
                       f"{100 * (ru.hits + ru.joins) / total:.0f}%" if total else "-")
        console.print(rt)
    print_shared(console)


@app.command()
def gc(provider: list[str] = typer.Option(["local"], "--provider", "-p",
                                          help="provider(s) to sweep (repeat); default local"),
       older_than: Optional[str] = typer.Option(None, help="also take instances whose owner is "
                                                "on another host and that are older than this (30m, 2h)"),
       all_: bool = typer.Option(False, "--all", help="take every SDK instance, even of live owners"),
       fleet: Optional[str] = typer.Option(None, "--fleet", help="only this fleet's instances and "
                                           "containers (default: every fleet of this FLOWMESH_HOME)"),
       run: Optional[str] = typer.Option(None, "--run", help="only what this run left (Fleet(run=...)), "
                                         "its coordinators on other hosts included, never what a live one holds"),
       yes: bool = typer.Option(False, "--yes", "-y", help="act; without it, only list (dry run)"),
       json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Find instances and containers this FLOWMESH_HOME left behind and remove them.

    They are found by their tags and the metadata store's records; removals are recorded
    there.  With -p ssh, also the containers of instances terminated while their machine
    did not answer, once it answers (machines that do not are named); with -p k8s, also the
    agent-sandbox warm pools (SandboxWarmPool and its template) of coordinators gone."""
    known = available_providers()
    for name in provider:
        if name not in known:
            raise typer.BadParameter(f"unknown provider {name!r}; installed: {', '.join(sorted(known))}",
                                     param_hint="--provider")
    age = parse_duration(older_than) if older_than else None
    try:
        asyncio.run(_gc(_store(), provider, age, all_, yes, fleet, json_out, run))
    except FlowMeshError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc


async def _gc(store: MetadataStore, names: list[str], age: float | None, all_: bool, yes: bool,
              fleet: str | None = None, json_out: bool = False, run: str | None = None) -> None:
    try:
        await _gc_with(store, names, age, all_, yes, fleet, json_out, run)
    finally:
        await store.flush()
        store.close()


async def _gc_with(store: MetadataStore, names: list[str], age: float | None, all_: bool, yes: bool,
                   fleet: str | None, json_out: bool = False, run: str | None = None) -> None:
    providers = [load_provider(n) for n in names]
    runtime = ContainerRuntime(LocalRunner()) if "local" in names else None
    if runtime is not None:
        try:
            await runtime.probe()
        except FlowMeshError as exc:
            err.print(f"[yellow]skipping containers:[/yellow] {exc}")
            runtime = None
    known = {r.id for r in await asyncio.to_thread(store.instances)}   # what this home launched
    async with shared_gc(fleet) as shared:
        the_plan = await gc_mod.plan(providers, runtime, older_than_s=age, include_live=all_,
                                     known_instances=known, fleet=fleet, shared=shared.holders,
                                     leftovers=True, run=run)
        if json_out:
            await _gc_json(the_plan, providers, runtime, store, yes, shared)
        else:
            await _gc_table(the_plan, providers, runtime, store, yes, shared)


async def _gc_table(the_plan: gc_mod.GcPlan, providers: list, runtime: ContainerRuntime | None,
                    store: MetadataStore, yes: bool, shared: SharedGc) -> None:
    table = Table(title="left behind" + ("" if yes else " (dry run: --yes to remove)"))
    for col in ("kind", "provider", "id", "pool", "age", "why"):
        table.add_column(col)
    for o in the_plan.instances:
        table.add_row("instance", o.provider, o.instance_id, o.pool, f"{o.age_s:.0f}s", o.reason)
    for c in the_plan.containers:
        table.add_row("container", "local", c.name, c.labels.get(LABEL_POOL, ""), "-",
                      f"instance {c.labels.get(LABEL_INSTANCE, '?')}")
    for prov, lo in the_plan.found_leftovers:
        name = lo.container_name if lo.kind == "container" else f"{lo.machine}/{lo.container_name}"
        table.add_row(lo.kind, prov, name, lo.pool, f"{lo.age_s:.0f}s" if lo.age_s else "-", lo.reason)
    _print_unreachable(the_plan.unreachable)
    total = len(the_plan.instances) + len(the_plan.containers) + len(the_plan.found_leftovers)
    if not total:
        console.print("nothing left behind" + (" on what answered" if the_plan.unreachable else ""))
        if yes and the_plan.unreachable:
            raise typer.Exit(2)
        return
    console.print(table)
    if not yes:
        console.print(f"{total} item(s) would be removed; run again with --yes")
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=console) as prog:
        bar = prog.add_task("removing", total=total)
        res = await gc_mod.execute(the_plan, providers, runtime,
                                   progress=lambda _i: prog.advance(bar), store=store, record=shared.record)
    kinds: dict[str, int] = {"container": 0}
    for lo in res.swept:
        kinds[lo.kind] = kinds.get(lo.kind, 0) + 1
    others = "".join(f", {n} {kind}(s)" for kind, n in sorted(kinds.items()) if kind != "container")
    console.print(f"terminated {len(res.terminated)} instance(s), removed "
                  f"{len(res.containers_removed) + kinds['container']} container(s){others}")
    _print_unreachable(res.unreachable)
    if res.still_present:
        err.print(f"[red]still present after terminate:[/red] {', '.join(res.still_present)}")
    if res.still_present or res.unreachable:
        raise typer.Exit(2)


def _print_unreachable(unreachable: tuple[gc_mod.Unreachable, ...]) -> None:
    for u in unreachable:
        err.print(f"[yellow]could not reach[/yellow] {escape(u.machine)} ({u.provider}): {escape(u.why)}; "
                  "what it holds stays until it answers (run gc again then)")


async def _gc_json(the_plan: gc_mod.GcPlan, providers: list, runtime: ContainerRuntime | None,
                   store: MetadataStore, yes: bool, shared: SharedGc) -> None:
    found = {"instances": [dataclasses.asdict(o) for o in the_plan.instances],
             "containers": [{"name": c.name, "pool": c.labels.get(LABEL_POOL, ""),
                             "instance": c.labels.get(LABEL_INSTANCE, "")} for c in the_plan.containers],
             "leftovers": [{"provider": prov, **dataclasses.asdict(lo)} for prov, lo in the_plan.found_leftovers],
             "unreachable": [dataclasses.asdict(u) for u in the_plan.unreachable]}
    if not yes:
        emit("gc", dry_run=True, found=found, result=None)
        return
    res = await gc_mod.execute(the_plan, providers, runtime, store=store, record=shared.record)
    emit("gc", dry_run=False, found=found, result=res)
    if res.still_present or res.unreachable:
        raise typer.Exit(2)


from .cost import register as _register_cost  # noqa: E402 - `offers`, `catalog`, `cost` (cli/cost.py)

_register_cost(app)

from .observe import register as _register_observe  # noqa: E402 - serve-metrics, top

_register_observe(app)

from .config import register as _register_config  # noqa: E402 - config show

_register_config(app)

from .serve import register as _register_serve  # noqa: E402 - serve sandbox-fusion (cli/serve.py)

_register_serve(app)


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """Each command's summary in a ``--help`` list: its docstring's first paragraph as one
    line of prose (typer's panel keeps the docstring's own line breaks, a ragged column)."""
    for info in typer_app.registered_commands:
        doc = inspect.getdoc(info.callback) if info.callback is not None and info.help is None else info.help
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.split("\n\n", 1)[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


_one_line_summaries(app)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
