"""The cost side of the ``flowmesh`` command: ``offers``, ``catalog refresh|show`` and
``cost estimate``.  It reads the price catalog and asks the bidder; it launches nothing.

``register(app)`` adds the commands to the main typer app (``cli/main.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import warnings
from collections.abc import Iterable
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .. import backends
from ..bidder import Demand, Estimate, ModelSpec, Policy, centralized, estimate
from ..bidder.gates import GateResult
from ..bidder.scoring import Score, score
from ..catalog import Catalog, StaleCatalogWarning, refresh
from ..catalog.records import canonical_provider
from ..errors import FlowMeshError, SpecError
from .console import console, err
from .console import fail as _fail
from .console import prices as _prices
from .console import split as _split
from .output import JSON_HELP, emit, plain


cost_app = typer.Typer(add_completion=False, no_args_is_help=True,
                       help="What a workload will cost, per provider/region and phase, before you launch it.")
catalog_app = typer.Typer(add_completion=False, no_args_is_help=True,
                          help="The price catalog: the shipped dated snapshot and live refreshes.")


# --------------------------------------------------------------------------- #
# shared helpers
# --------------------------------------------------------------------------- #

def _load(providers: tuple[str, ...]) -> Catalog:
    """The catalog, with each stale-snapshot warning printed as a note on stderr."""
    names = [canonical_provider(p) for p in providers] if providers else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StaleCatalogWarning)
        catalog = Catalog.load(names)
    if any(issubclass(w.category, StaleCatalogWarning) for w in caught):
        ages = ", ".join(f"{s.provider} {'undated' if s.age_days is None else f'{s.age_days:.0f} days old'}"
                         for s in catalog.stale())
        err.print(f"[yellow]note:[/yellow] stale price catalogs ({ages}); prices move -- "
                  "`flowmesh catalog refresh --provider NAME`, `flowmesh catalog show`")
    return catalog


def _policy(preset: str, weights: Optional[str]) -> Policy:
    return Policy.parse(weights) if weights else Policy.preset(preset)


def _gates_note(gates: Iterable[GateResult]) -> str:
    hit = [f"{g.gate} -{g.removed}" for g in gates if g.removed]
    return "gates removed: " + (", ".join(hit) if hit else "nothing")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f}"


def _score_json(s: Score) -> dict[str, object]:
    r = s.row
    return {"offer": r.key, "provider": r.provider, "region": r.region, "zone": r.zone,
            "instance_type": r.instance_type, "market": s.market, "cpus": r.cpus, "memory_gb": r.memory_gb,
            "gpus": r.gpus, "gpu_name": r.gpu_name, "slots": s.slots, "price_per_hour": s.price_per_hour,
            "bid_per_hour": s.bid_per_hour, "cost_per_hour": s.cost_per_hour, "cost_per_slot": s.cost_per_slot,
            "t_eff": s.t_eff, "t_unit": s.t_unit, "t_norm": s.t_norm, "c_norm": s.c_norm, "g_loc": s.g_loc,
            "utility": s.utility, "available": s.available}


# --------------------------------------------------------------------------- #
# flowmesh offers
# --------------------------------------------------------------------------- #

def offers(cpus: float = typer.Option(8.0, "--cpus", help="vCPUs per sandbox (or per GPU worker)"),
           memory: float = typer.Option(16.0, "--memory", help="GiB of memory per sandbox"),
           gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU model, e.g. H100 (implies --gpus 1)"),
           gpus: int = typer.Option(0, "--gpus", help="GPUs per worker"),
           model_params: Optional[float] = typer.Option(None, "--model-params",
                                                        help="billions of parameters the GPU worker serves"),
           kv_cache: float = typer.Option(8.0, "--kv-cache", help="GB of KV cache per worker (with --model-params)"),
           preset: str = typer.Option("balanced", "--preset", help="latency, cost or balanced"),
           weights: Optional[str] = typer.Option(None, "--weights", help="custom w_t,w_c,w_l (overrides --preset)"),
           market: str = typer.Option("on-demand", "--market", help="on-demand, spot or any"),
           spot: bool = typer.Option(False, "--spot", help="the spot / interruptible market (= --market spot)"),
           provider: Optional[list[str]] = typer.Option(None, "--provider", "-p",
                                                        help="allowed provider(s); repeat or comma-separate"),
           region: Optional[list[str]] = typer.Option(None, "--region", help="allowed region(s)"),
           max_price: Optional[float] = typer.Option(None, "--max-price", help="USD per instance-hour, at most"),
           arch: str = typer.Option("x86_64", "--arch", help="x86_64, arm64 or any"),
           mode: str = typer.Option("persistent", "--mode", help="ephemeral or persistent"),
           minutes: float = typer.Option(60.0, "--minutes", help="minutes per task (throughput and interruptions)"),
           image_gb: float = typer.Option(2.0, "--image-gb", help="GB of image pulled per instance"),
           resident: Optional[list[str]] = typer.Option(None, "--resident",
                                                        help="where the image/weights are cached: provider, "
                                                             "provider/region or provider/region/type"),
           gpu_hosts: bool = typer.Option(False, "--gpu-hosts", help="let CPU sandboxes use GPU instances"),
           limit: int = typer.Option(15, "--limit", min=1, help="rows to show"),
           json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
           ) -> None:
    """Rank the catalog's offers for one sandbox size with every term of U = w_t*T - w_c*C + w_l*G."""
    try:
        model = ModelSpec(params_b=model_params, kv_cache_gb=kv_cache) if model_params else None
        demand = Demand(cpus=cpus, memory_gb=memory, gpus=gpus, gpu_name=gpu, model=model,
                        arch=None if arch == "any" else arch, max_price=max_price, providers=_split(provider),
                        regions=_split(region), market="spot" if spot else market, mode=mode, minutes=minutes,
                        image_gb=image_gb, resident=_split(resident), gpu_hosts=gpu_hosts)
        policy = _policy(preset, weights)
        catalog = _load(())
        scored = score(catalog.rows, demand, policy)
    except FlowMeshError as exc:
        raise _fail(exc) from exc
    top = scored.ranking(limit)
    if json_out:
        emit("offers", demand=demand, policy=policy, feasible=len(scored), considered=scored.feasible.considered,
             gates=scored.gates, offers=[_score_json(s) for s in top])
        return
    unit = top[0].t_unit if top else ""
    table = Table(title=f"offers for {cpus:g} vCPU / {memory:g} GiB"
                        + (f" / {demand.gpus} x {gpu or 'GPU'}" if demand.gpus else "")
                        + f" ({demand.mode}, {demand.market}; w_t={policy.w_t:g} w_c={policy.w_c:g} "
                          f"w_l={policy.w_l:g})")
    for col in ("#", "offer", "market", "vCPU", "GiB", "GPU", "slots", "$/h", "C $/slot-h",
                f"T_eff {unit}", "T^", "C^", "G_loc", "U"):
        table.add_column(col, justify="left" if col in ("offer", "market", "GPU") else "right")
    for i, s in enumerate(top, 1):
        r = s.row
        gpu_txt = f"{r.gpus}x {r.gpu_name or '?'}" if r.gpus else "-"
        price = f"{s.price_per_hour:.4f}" + (f" (bid {s.bid_per_hour:.4f})" if s.bid_per_hour is not None else "")
        table.add_row(str(i), escape(r.key), s.market, f"{r.cpus:g}", f"{r.memory_gb:g}", escape(gpu_txt),
                      str(s.slots), price, f"{s.cost_per_slot:.4f}", f"{s.t_eff:.3f}", f"{s.t_norm:.3f}",
                      f"{s.c_norm:.3f}", f"{s.g_loc:g}", f"{s.utility:.3f}")
    console.print(table)
    console.print(f"{len(scored)} feasible of {scored.feasible.considered} offers; {_gates_note(scored.gates)}")
    console.print("T^ = T_eff / fastest; C^ = (C / slots) / cheapest; U = w_t*T^ - w_c*C^ + w_l*G_loc "
                  "(docs/cost-model.md)")


# --------------------------------------------------------------------------- #
# flowmesh catalog refresh | show
# --------------------------------------------------------------------------- #

@catalog_app.command("refresh")
def catalog_refresh(provider: str = typer.Option(..., "--provider", "-p",
                                                 help=f"one of {', '.join(backends.catalog_providers())}"),
                    endpoint: Optional[str] = typer.Option(None, "--endpoint",
                                                           help="the price API's base URL (default: the real one)"),
                    region: Optional[list[str]] = typer.Option(None, "--region",
                                                               help="region(s) to fetch (default: the adapter's)"),
                    json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
                    ) -> None:
    """Fetch live prices from the provider's own price API into the user's cache directory."""
    try:
        result = asyncio.run(refresh(provider, endpoint=endpoint, regions=_split(region)))
    except FlowMeshError as exc:
        raise _fail(exc) from exc
    if json_out:
        emit("catalog.refresh", result=result)
        return
    console.print(f"{result.provider}: {result.rows} rows ({result.priced} priced) in "
                  f"{len(result.regions)} region(s) -> {result.path} (fetched {result.fetched_at})")


@catalog_app.command("show")
def catalog_show(provider: Optional[list[str]] = typer.Option(None, "--provider", "-p",
                                                              help="provider(s) to show (default: all)"),
                 json_out: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Where each provider's prices come from, how many rows, and how old they are."""
    try:
        catalog = Catalog.load(list(_split(provider)) or None, warn=False)
    except FlowMeshError as exc:
        raise _fail(exc) from exc
    if json_out:
        emit("catalog.show", sources=[{**plain(s), "regions": len({r.region for r in catalog.rows
                                                                    if r.provider == s.provider})}
                                       for s in catalog.sources])
        return
    table = Table(title="price catalog")
    for col in ("provider", "origin", "rows", "priced", "regions", "fetched", "age (days)", "stale", "file"):
        table.add_column(col)
    for s in catalog.sources:
        regions = sorted({r.region for r in catalog.rows if r.provider == s.provider})
        table.add_row(s.provider, s.origin, str(s.rows), str(s.priced), str(len(regions)), s.fetched_at or "undated",
                      "-" if s.age_days is None else f"{s.age_days:.0f}", "yes" if s.stale else "no",
                      escape(s.path))
    console.print(table)
    stale = catalog.stale()
    if stale:
        console.print(f"stale: {', '.join(s.provider for s in stale)} -- refresh with "
                      "`flowmesh catalog refresh --provider NAME`")


# --------------------------------------------------------------------------- #
# flowmesh cost estimate
# --------------------------------------------------------------------------- #

def _estimate_row(e: Estimate, label: str = "") -> list[str]:
    lines = "; ".join(f"{ln.instances} x {ln.score.row.instance_type}" + (" spot" if ln.score.market == "spot" else "")
                      + (f" (bid {ln.score.bid_per_hour:.3f})" if ln.score.bid_per_hour is not None else "")
                      for ln in e.plan.lines)
    ph = e.phases
    return [label or f"{e.provider}/{e.region}", escape(lines), str(e.instances), f"{e.plan.listed_per_hour:,.2f}",
            f"{e.total_usd:,.2f}", _minutes(ph.launch_span_s), f"{ph.submission_s:.1f}s", _minutes(ph.scheduling_s),
            _minutes(ph.env_startup_s), _minutes(ph.execution_s), _minutes(ph.makespan_s)]


def _estimate_json(e: Estimate) -> dict[str, object]:
    return {"provider": e.provider, "region": e.region, "instances": e.instances,
            "listed_per_hour": e.plan.listed_per_hour, "cost_per_hour": e.per_hour, "total_usd": e.total_usd,
            "rates_source": e.rates_source, "phases": e.phases,
            "plan": [{"instance_type": ln.score.row.instance_type, "market": ln.score.market,
                      "instances": ln.instances, "sandboxes": ln.sandboxes, "bid_per_hour": ln.score.bid_per_hour,
                      "price_per_hour": ln.score.price_per_hour, "price_source": ln.score.row.source}
                     for ln in e.plan.lines]}


def _price_sources(estimates: list[Estimate]) -> list[str]:
    """Where the prices of the plans shown came from: one line per provider and source."""
    seen: dict[tuple[str, str], list[str]] = {}
    for e in estimates:
        for ln in e.plan.lines:
            types = seen.setdefault((e.provider, ln.score.row.source), [])
            if ln.score.row.instance_type not in types:
                types.append(ln.score.row.instance_type)
    return [f"{prov} ({', '.join(types)}): {src or 'no source recorded'}" for (prov, src), types in seen.items()]


_EST_COLS = ("where", "plan", "instances", "$/h", "total $", "launch (min)", "submit", "sched (min)",
             "env start (min)", "exec (min)", "makespan (min)")


@cost_app.command("estimate")
def cost_estimate(tasks: int = typer.Option(..., "--tasks", help="tasks submitted at once"),
                  minutes: float = typer.Option(..., "--minutes", help="minutes each task executes"),
                  cpus: float = typer.Option(8.0, "--cpus", help="vCPUs per task"),
                  memory: float = typer.Option(16.0, "--memory", help="GiB per task"),
                  mode: str = typer.Option("ephemeral", "--mode",
                                           help="ephemeral (an instance per task) or persistent (packed)"),
                  spot: bool = typer.Option(False, "--spot", help="spot / interruptible instances"),
                  providers: Optional[list[str]] = typer.Option(None, "--providers",
                                                                help="provider(s) to plan on; comma-separate"),
                  region: Optional[list[str]] = typer.Option(None, "--region", help="region(s) to plan in"),
                  compare_centralized: Optional[str] = typer.Option(None, "--compare-centralized",
                                                                    help="instance type of MegaFlow's centralized "
                                                                         "baseline (big machines, many tasks each)"),
                  tasks_per_instance: Optional[int] = typer.Option(None, "--tasks-per-instance",
                                                                   help="tasks per centralized machine"),
                  price: Optional[list[str]] = typer.Option(None, "--price",
                                                            help="TYPE=USD: use this $/h for TYPE (repeat)"),
                  image_gb: float = typer.Option(2.0, "--image-gb", help="GB of image each instance pulls"),
                  top: int = typer.Option(10, "--top", min=1, help="provider/regions to show"),
                  json_out: bool = typer.Option(False, "--json", help=JSON_HELP),
                  ) -> None:
    """The cheapest feasible plan per provider/region, with launch time under each provider's
    published rate limits and MegaFlow's four phases; optionally beside the centralized baseline."""
    if (compare_centralized is None) != (tasks_per_instance is None):
        raise _fail(SpecError("--compare-centralized", "needs --tasks-per-instance K, and the other way round"))
    try:
        market = "spot" if spot else "on-demand"
        demand = Demand(count=tasks, cpus=cpus, memory_gb=memory, mode=mode, market=market, minutes=minutes,
                        providers=tuple(canonical_provider(p) for p in _split(providers)),
                        regions=_split(region), image_gb=image_gb, arch=None)
        catalog = _load(demand.providers).with_prices(_prices(price), market)
        done, failed = estimate(catalog.rows, demand)
        base = None
        if compare_centralized is not None and tasks_per_instance is not None:   # both or neither: checked above
            rows = Catalog.load(warn=False).with_prices(_prices(price), market).rows
            base = centralized(rows, dataclasses.replace(demand, providers=(), regions=()), compare_centralized,
                               int(tasks_per_instance))
    except FlowMeshError as exc:
        raise _fail(exc) from exc
    if json_out:
        emit("cost.estimate", demand=demand, estimates=[_estimate_json(e) for e in done[:top]],
             more=max(0, len(done) - top), centralized=_estimate_json(base) if base is not None else None,
             infeasible=[{"provider": f.provider, "region": f.region, "gates": f.error.gates} for f in failed])
        if not done:
            raise typer.Exit(1)
        return
    table = Table(title=f"{tasks} tasks x {minutes:g} min, {cpus:g} vCPU / {memory:g} GiB each, {mode}, {market}"
                        f" -- cheapest plan per provider/region")
    for col in _EST_COLS:
        table.add_column(col, justify="left" if col in ("where", "plan") else "right")
    for e in done[:top]:
        table.add_row(*_estimate_row(e))
    if base is not None:
        table.add_section()
        table.add_row(*_estimate_row(base, f"centralized {base.provider}/{base.region}"))
    console.print(table)
    if len(done) > top:
        console.print(f"({len(done) - top} more provider/regions; --top to show them)")
    for line in _price_sources(done[:top] + ([base] if base is not None else [])):
        console.print(f"[dim]prices: {escape(line)}[/dim]", soft_wrap=True)
    by_provider: dict[str, list] = {}
    for f in failed:
        by_provider.setdefault(f.provider, []).append(f)
    for prov, fails in sorted(by_provider.items()):
        removed: dict[str, int] = {}
        for f in fails:
            for g in f.error.gates:
                removed[g.gate] = removed.get(g.gate, 0) + g.removed
        where = escape(fails[0].region) if len(fails) == 1 else f"{len(fails)} regions"
        console.print(f"[dim]{prov} ({where}): no feasible offer -- gates removed: "
                      + ", ".join(f"{k} -{v}" for k, v in removed.items() if v) + "[/dim]")
    if base is not None and done:
        same = [e for e in done if e.provider == base.provider] or done
        best = same[0]
        saving = 1.0 - best.total_usd / base.total_usd
        console.print(f"distributed ({best.provider}/{best.region}, ${best.total_usd:,.2f}) vs centralized "
                      f"{compare_centralized} x {base.instances} (${base.total_usd:,.2f}): "
                      f"{saving * 100:.1f}% {'less' if saving >= 0 else 'more'}")
    if not done:
        raise typer.Exit(1)
    console.print("phases are per-task means (submission, scheduling = waiting for the launch call under the "
                  "provider's rate limits, environment startup, execution); docs/cost-model.md")


def register(app: typer.Typer) -> None:
    """Add ``offers``, ``catalog`` and ``cost`` to the main ``flowmesh`` app."""
    from .cost_report import report
    from .simulate import cost_simulate
    cost_app.command("simulate")(cost_simulate)
    cost_app.command("report")(report)
    app.command("offers")(offers)
    app.add_typer(catalog_app, name="catalog")
    app.add_typer(cost_app, name="cost")


__all__ = ["catalog_app", "cost_app", "offers", "register"]
