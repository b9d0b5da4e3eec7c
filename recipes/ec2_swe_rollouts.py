#!/usr/bin/env python3
"""The main job's SWE-style batch on EC2 spot instances (8 vCPU / 16 GB class).

``--dry-run`` prints the plan and makes no API call: the offers that fit (from the price
catalog, ``flowmesh_sdk.catalog`` -- the shipped EC2 snapshot, or the newer cache
``flowmesh catalog refresh --provider ec2`` writes, or ``--prices CSV``; read directly:
``Ec2Provider.offers()`` would call DescribeInstanceTypes), the chosen instance type and
how many, the estimated cost, and how long EC2's RunInstances token buckets take to let
that many instances through.  Without ``--dry-run`` it runs the batch: the same tasks,
task images and throw-away registry as ``recipes/local_swe_eval.py`` (imported as a
module), on a persistent pool of provider ``ec2`` whose offers (shapes, from
DescribeInstanceTypes) the fleet prices from the same catalog (``Fleet(catalog=...)``)
and whose spot preference is ``prefer`` for ``--spot`` (spot where the catalog has a spot
price, on-demand as the fallback) or ``never``; it prints the verdicts with per-phase latency, the
instances launched, any LAUNCH_FAILOVER events, then drains and asks the provider
whether anything tagged with this run's fleet is still alive.

    python recipes/ec2_swe_rollouts.py --dry-run [--tasks 1000 --max-instances 250]
    python recipes/ec2_swe_rollouts.py --emulator          # offline: moto on 127.0.0.1
    python recipes/ec2_swe_rollouts.py --endpoint-url http://127.0.0.1:5000 --ami ami-...

``--emulator`` (alias ``--moto``) starts moto's EC2 in server mode on 127.0.0.1
(``flowmesh_sdk.testing.moto.MotoEc2``) behind the counting fault proxy.  moto has no
machines: its instances exist only as records, so the sandboxes of every "instance" run
on THIS host through ``LocalRunner`` (``Ec2Provider(runner_factory=lambda inst:
LocalRunner())``); so does a run against ``--endpoint-url`` on a loopback address (an
emulator you started).  This recipe does not use the provider's SSH mode
(``Ec2Provider(ssh=SshMode())``, docs/ssh.md), which is how real EC2 instances are
reached: it refuses a non-loopback ``--endpoint-url`` (exit 2, before any EC2 API call)
rather than launch machines it would not use.

Cost arithmetic (also printed)::

    instances = min(--max-instances, ceil(tasks / --sandboxes-per-instance))
    slots     = instances * sandboxes_per_instance
    waves     = ceil(tasks / slots)            # tasks run slots at a time
    hours     = waves * --task-minutes / 60
    cost      = instances * price_per_hour * hours

EC2 bills Linux instances per second with a 60-second minimum; boot and bootstrap time,
EBS volumes and data transfer are not in the estimate.

Launch-rate arithmetic (EC2 "Request throttling for the Amazon EC2 API"; the buckets are
the ``ec2`` provider's declared ``Capabilities.rates``): RunInstances spends one token of
a request bucket (5, refilled 2/s) per call and one token of a resource bucket (1000,
refilled 2/s) per instance.  K instances in calls of at most ``max_batch`` (1000) need
``ceil(K / 1000)`` calls; with both buckets full at the start the last call can go after
``max((calls - 5) / 2, (K - 1000) / 2)`` seconds (0 for K <= 1000).

Exit status: 0 when every verdict matched and nothing tagged with the fleet is left; 1
otherwise; 2 when the run cannot start (no endpoint or AMI, a non-loopback endpoint, images,
registry).
Importable too: ``await main(["--dry-run"])`` returns the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import sys
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling _main_job (also in an installed wheel)

from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, Offer, PoolSpec, SandboxSpec, Task  # noqa: E402
from flowmesh_sdk.backoff import is_loopback_host  # noqa: E402
from flowmesh_sdk.catalog import Catalog, read_csv  # noqa: E402
from flowmesh_sdk.errors import FlowMeshError  # noqa: E402
from flowmesh_sdk.provider import TAG_FLEET, ApiRate, Instance, LaunchRequest  # noqa: E402
from flowmesh_sdk.registry.local import LocalRegistry  # noqa: E402
from flowmesh_providers.ec2 import Ec2Provider  # noqa: E402
from flowmesh_providers.ec2.client import DOC_THROTTLING  # noqa: E402
from _main_job import load_main_job  # noqa: E402

swe_eval = load_main_job()

console = swe_eval.console
ENV_ENDPOINT = "FLOWMESH_EC2_ENDPOINT_URL"
ENV_AMI = "FLOWMESH_EC2_AMI"
POOL_NAME = "swe-ec2"
# What each sandbox gets: the stand-in runs every "instance" on this 2-cpu host, so a
# sandbox is 1 cpu and 1 GB whatever the instance type (on real EC2 it would be sized to
# its share of the instance).
SANDBOX_CPUS = 1.0
SANDBOX_MEMORY_GB = 1.0
TOP_OFFERS = 10


# --------------------------------------------------------------------------- #
# the plan (no API call)
# --------------------------------------------------------------------------- #

@dataclass(frozen=True)
class SnapshotInfo:
    path: str
    snapshot_date: str
    source: str
    rows: int


def load_catalog(prices_path: str | None = None) -> tuple[Catalog, str]:
    """The EC2 price catalog and where it came from: ``prices_path`` (a CSV of the
    catalog's columns), else the catalog the fleet itself would load (the shipped
    snapshot, or the newer ``flowmesh catalog refresh`` cache)."""
    if prices_path:
        return Catalog(read_csv(prices_path)), prices_path
    catalog = Catalog.load(["ec2"], warn=False)
    return catalog, ", ".join(f"{s.path} ({s.origin})" for s in catalog.sources) or "the catalog"


def snapshot_offers(region: str, prices_path: str | None = None) -> tuple[list[Offer], SnapshotInfo]:
    """Every priced offer of the EC2 catalog in ``region``, without any API call: one per
    priced market of each row (:meth:`CatalogRow.offers`)."""
    catalog, where = load_catalog(prices_path)
    rows = [r for r in catalog.rows if r.provider == "ec2"]
    offers: list[Offer] = []
    dates: set[str] = set()
    sources: set[str] = set()
    for row in rows:
        if row.region != region or row.cpus != int(row.cpus):
            continue
        made = row.offers()
        if made:
            dates.add(row.fetched_at or "undated")
            sources.add(row.source.split(":", 1)[0] or "-")
        offers.extend(made)
    offers.sort(key=lambda o: (o.price_per_hour or 0.0, o.instance_type, o.spot))
    info = SnapshotInfo(where, ", ".join(sorted(dates)) or "-", ", ".join(sorted(sources)) or "-",
                        sum(1 for r in rows if r.on_demand_per_hour is not None or r.spot_per_hour is not None))
    return offers, info


def catalog_regions(prices_path: str | None = None) -> list[str]:
    catalog, _ = load_catalog(prices_path)
    return sorted({r.region for r in catalog.rows if r.provider == "ec2" and r.offers()})


def select_market(offers: Sequence[Offer], market: str) -> tuple[list[Offer], str | None]:
    """The offers of the market asked for; for spot with no spot offer at all, the
    on-demand offers and a note saying why."""
    if market == "on-demand":
        return [o for o in offers if not o.spot], None
    spot = [o for o in offers if o.spot]
    if spot:
        return spot, None
    on_demand = [o for o in offers if not o.spot]
    return on_demand, ("spot asked for, but the price catalog has no spot price for any type that "
                       "fits (it holds on-demand list prices only; a spot offer is made only where "
                       "the catalog has a spot price, never estimated): FALLING BACK TO ON-DEMAND "
                       "offers (the pool's spot preference is 'prefer': spot where priced, else on-demand)")


@dataclass(frozen=True)
class LaunchMath:
    instances: int
    calls: int
    request_wait_s: float
    resource_wait_s: float

    @property
    def seconds(self) -> float:
        return max(self.request_wait_s, self.resource_wait_s)


def _launch_rates() -> tuple[ApiRate, ApiRate]:
    """RunInstances' (request bucket, instance bucket), as the provider declares them."""
    rates = Ec2Provider.capabilities.rates
    return (next(r for r in rates if r.api == "launch" and not r.per_instance),
            next(r for r in rates if r.api == "launch" and r.per_instance))


def launch_math(k: int, *, max_batch: int | None = None) -> LaunchMath:
    """Seconds until the last of ``k`` instances may be asked for, both RunInstances
    buckets full at the start (from the provider's declared rates)."""
    batch = max_batch or Ec2Provider.capabilities.max_batch
    req, res = _launch_rates()
    calls = math.ceil(k / batch) if k > 0 else 0
    return LaunchMath(k, calls, max(0.0, calls - req.burst) / req.rate_per_s,
                      max(0.0, k - res.burst) / res.rate_per_s)


@dataclass(frozen=True)
class Plan:
    region: str
    spec: InstanceSpec
    market: str                      # what was asked for
    fallback: str | None             # why another market is used
    snapshot: SnapshotInfo           # the price catalog the plan (and the run) price from
    fitting: list[Offer]             # of the market used, cheapest first
    all_offers: list[Offer]          # every priced offer of the catalog in the region
    chosen: Offer
    tasks: int
    sandboxes_per_instance: int
    max_instances: int
    task_minutes: float

    @property
    def instances(self) -> int:
        return min(self.max_instances, math.ceil(self.tasks / self.sandboxes_per_instance))

    @property
    def slots(self) -> int:
        return self.instances * self.sandboxes_per_instance

    @property
    def waves(self) -> int:
        return math.ceil(self.tasks / self.slots)

    @property
    def hours(self) -> float:
        return self.waves * self.task_minutes / 60.0

    @property
    def price(self) -> float:
        return self.chosen.price_per_hour or 0.0

    @property
    def cost(self) -> float:
        return self.instances * self.price * self.hours

    @property
    def billed_cost(self) -> float:
        return self.instances * self.price * max(self.hours, 1 / 60)


class PlanError(Exception):
    pass


def make_plan(args: argparse.Namespace) -> Plan:
    spec = InstanceSpec(cpus=args.cpus, memory_gb=args.memory_gb)
    every, snap = snapshot_offers(args.region, args.prices)
    if not every:
        raise PlanError(f"the price catalog {snap.path} has no EC2 price for region {args.region} "
                        f"(it covers {', '.join(catalog_regions(args.prices)) or 'no region'}; "
                        "`flowmesh catalog refresh --provider ec2 --region ...` fetches more)")
    fits = [o for o in every if o.fits(spec)]
    fitting, fallback = select_market(fits, args.market)
    if not fitting:
        raise PlanError(f"no priced EC2 type in {args.region} has {spec.cpus} vCPUs and "
                        f"{spec.memory_gb:g} GiB ({spec.arch})")
    return Plan(region=args.region, spec=spec, market=args.market, fallback=fallback, snapshot=snap,
                fitting=fitting, all_offers=every, chosen=fitting[0], tasks=args.tasks,
                sandboxes_per_instance=args.sandboxes_per_instance,
                max_instances=args.max_instances, task_minutes=args.task_minutes)


def _market(o: Offer) -> str:
    return "spot" if o.spot else "on-demand"


def _dur(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    return f"{s:.0f} s ({s / 60:.1f} min)"


def print_plan(plan: Plan) -> None:
    snap, spec, c = plan.snapshot, plan.spec, plan.chosen
    console.print(f"[bold]EC2 plan[/] for {plan.tasks} SWE task(s) in {plan.region}")
    spot_types = len({o.instance_type for o in plan.all_offers if o.spot})
    console.print(f"price catalog: {snap.path} ({snap.rows} priced rows, dated {snap.snapshot_date}, "
                  f"source {snap.source}); list prices, region level; "
                  + (f"spot prices for {spot_types} type(s)" if spot_types else "no spot prices"))
    console.print(f"instance wanted: >= {spec.cpus} vCPU, >= {spec.memory_gb:g} GiB, {spec.arch}; "
                  f"market asked: {plan.market}")
    if plan.fallback:
        console.print(f"[bold yellow]note:[/] {plan.fallback}")
    t = Table(title=f"offers that fit ({len(plan.fitting)}, cheapest first"
                    + (f"; first {TOP_OFFERS}" if len(plan.fitting) > TOP_OFFERS else "") + ")",
              title_justify="left")
    for col in ("#", "instance type", "vCPU", "GiB", "GPUs", "arch", "market", "$/h"):
        t.add_column(col, justify="right" if col in ("#", "vCPU", "GiB", "GPUs", "$/h") else "left")
    for i, o in enumerate(plan.fitting[:TOP_OFFERS], 1):
        t.add_row(str(i), o.instance_type, str(o.cpus), f"{o.memory_gb:g}", str(o.gpus), o.arch,
                  _market(o), f"{o.price_per_hour or 0.0:.4f}")
    console.print(t)
    console.print(f"chosen instance type: {c.instance_type} ({_market(c)}, {c.cpus} vCPU, "
                  f"{c.memory_gb:g} GiB) at ${plan.price:.4f}/h -- the cheapest that fits; "
                  "the others are the failover order")
    console.print(f"instances: {plan.instances} = min(--max-instances {plan.max_instances}, "
                  f"ceil({plan.tasks} tasks / {plan.sandboxes_per_instance} sandboxes per instance))")
    console.print(f"estimated hours: {plan.waves} wave(s) = ceil({plan.tasks} tasks / {plan.slots} slots) "
                  f"x {plan.task_minutes:g} min per task = {plan.hours:.4f} h")
    console.print(f"estimated cost: {plan.instances} instances x ${plan.price:.4f}/h x "
                  f"{plan.hours:.4f} h = ${plan.cost:.4f}"
                  + (f" (billed at least 60 s per instance: ${plan.billed_cost:.4f})"
                     if plan.hours < 1 / 60 else "")
                  + "; boot, bootstrap, EBS and data transfer not included")
    m = launch_math(plan.instances)
    req, res = _launch_rates()
    console.print(f"launch rate: RunInstances request bucket {req.burst:g} (refill {req.rate_per_s:g}/s), "
                  f"instance bucket {res.burst:g} (refill {res.rate_per_s:g}/s), at most "
                  f"{Ec2Provider.capabilities.max_batch} instances per call [dim]({DOC_THROTTLING})[/]")
    for k in sorted({plan.instances, 1000, 10_000}):
        mk = launch_math(k)
        console.print(f"  {k:>6} instances: {mk.calls} RunInstances call(s); request bucket "
                      f"max(0, {mk.calls} - {req.burst:g}) / {req.rate_per_s:g} = {mk.request_wait_s:g} s, "
                      f"instance bucket max(0, {k} - {res.burst:g}) / {res.rate_per_s:g} = "
                      f"{mk.resource_wait_s:g} s -> last call after "
                      f"{_dur(mk.seconds)}" + ("  <- this plan" if k == plan.instances else ""))
    console.print(f"plan: type={c.instance_type} count={plan.instances} market={_market(c)} "
                  f"price_per_hour={plan.price:.4f} hours={plan.hours:.4f} "
                  f"cost_usd={plan.cost:.4f} launch_s={m.seconds:g}", soft_wrap=True)


# --------------------------------------------------------------------------- #
# the run
# --------------------------------------------------------------------------- #

class RolloutEc2(Ec2Provider):
    """The ``ec2`` provider with a record of what each launch asked for (``Instance``
    carries no spot/on-demand field).  The market is the pool's spot preference."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.launched: list[tuple[Offer, tuple[Instance, ...]]] = []

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        out = await super().launch(request)
        self.launched.append((request.offer, tuple(out)))
        return out


def _is_loopback(url: str) -> bool:
    return is_loopback_host(urllib.parse.urlsplit(url).hostname or "")


def instances_table(prov: RolloutEc2, lifecycle: Mapping[str, str]) -> Table:
    t = Table(title="instances launched", title_justify="left")
    for col in ("instance", "type", "market", "$/h", "region", "vCPU", "GiB", "request", "EC2 lifecycle"):
        t.add_column(col)
    for offer, insts in prov.launched:
        for i in insts:
            t.add_row(i.id, i.instance_type, _market(offer), f"{i.price_per_hour:.4f}", i.region,
                      str(offer.cpus), f"{offer.memory_gb:g}", i.tags.get("flowmesh:request", "-"),
                      lifecycle.get(i.id, "-"))
    return t


async def run_batch(args: argparse.Namespace, plan: Plan, provider: RolloutEc2,
                    proxy: Any = None, raw_client: Any = None) -> int:
    build = swe_eval._load_image_builder()
    try:
        await asyncio.to_thread(swe_eval.ensure_base, build)
    except Exception as exc:  # noqa: BLE001 - reported plainly
        console.print(f"[bold red]image not available:[/] {escape(str(exc))}")
        return 2
    swe = swe_eval.make_tasks(args.tasks)
    console.print(f"{len(swe)} tasks ({sum(t.patch_kind == 'right' for t in swe)} right, "
                  f"{sum(t.patch_kind == 'wrong' for t in swe)} wrong patches), one image per task")
    fleet_name = f"ec2swe-{secrets.token_hex(4)}"
    ok_verdicts = False
    left: list[str] = ["(not checked)"]
    async with contextlib.AsyncExitStack() as stack:
        if args.registry:
            reg: Any = swe_eval.ExistingRegistry(args.registry, build.resolve_tls_verify(args.registry))
        else:
            try:
                reg = await stack.enter_async_context(LocalRegistry())
            except LocalRegistryError as exc:   # RegistryNotInstalled among them
                console.print(f"[bold red]cannot start a local registry:[/] {escape(str(exc))}")
                return 2
        console.print(f"registry: {reg.host}")
        built: list[str] = []
        try:
            try:
                images = await asyncio.to_thread(swe_eval.build_and_push, build, reg, swe, built)
            except Exception as exc:  # noqa: BLE001
                console.print(f"[bold red]task images not available:[/] {escape(str(exc))}")
                return 2
            catalog, _ = load_catalog(args.prices)
            fleet = Fleet(name=fleet_name, providers={"ec2": provider}, bootstrap_timeout_s=300, catalog=catalog)
            failovers = fleet.bus.subscribe(EventKind.LAUNCH_FAILOVER)
            pulled = fleet.bus.subscribe(EventKind.IMAGE_PULLED)
            try:
                ok_verdicts = await _run_pool(args, plan, fleet, provider, reg, swe, images,
                                              pulled, raw_client)
            except Exception as exc:  # noqa: BLE001 - reported; the leftovers are still swept below
                console.print(f"[bold red]the run failed:[/] {type(exc).__name__}: {escape(str(exc))}")
            finally:
                # drain every pool, then ask the provider (still open) what is alive with this
                # fleet's tag; only then close the fleet (which closes the provider)
                await asyncio.gather(*(p.drain(timeout_s=60) for p in fleet.pools.values()),
                                     return_exceptions=True)
                left = await _leftovers(provider, fleet_name)
                await fleet.close(timeout_s=60)
                print_failovers(failovers)
        finally:
            for ref in built:
                swe_eval._podman("rmi", ref)
            n = await asyncio.to_thread(swe_eval.remove_pulled, reg.host)
            console.print(f"[dim]clean-up: removed {n} image(s) pulled from {reg.host}[/]")
    if proxy is not None:
        calls = proxy.calls
        console.print("EC2 API calls of this run (counted by the proxy in front of moto): "
                      + ", ".join(f"{a} {n}" for a, n in sorted(calls.items())))
    if ok_verdicts:
        console.print("[bold green]every verdict matched its expectation[/]")
    if left:
        console.print(f"[bold red]{len(left)} instance(s) tagged {TAG_FLEET}={fleet_name} were still "
                      f"alive after the drain[/] (terminated now; `flowmesh gc --provider ec2` finds such "
                      "leftovers)")
    else:
        console.print(f"nothing left: the provider lists no live instance tagged {TAG_FLEET}={fleet_name}")
    return 0 if ok_verdicts and not left else 1


async def _run_pool(args: argparse.Namespace, plan: Plan, fleet: Fleet, provider: RolloutEc2, reg: Any,
                    swe: list[Any], images: Mapping[str, Any], pulled: Any,
                    raw_client: Any) -> bool:
    n = plan.instances
    spec = PoolSpec(name=POOL_NAME, mode="persistent", provider="ec2", instance=plan.spec,
                    min_instances=n, max_instances=n, sandboxes_per_instance=plan.sandboxes_per_instance,
                    warm_per_image=0, region=plan.region, spot="prefer" if plan.market == "spot" else "never",
                    policy="cost")
    refs = [images[t.name].image for t in swe]
    log_mark = len(reg.request_log()) if isinstance(reg, LocalRegistry) else 0
    t_pool = time.monotonic()
    pool = await fleet.pool(spec)
    run: swe_eval.ModeRun | None = None
    lifecycle: dict[str, str] = {}
    try:
        st = pool.stats()
        console.print(f"pool {pool.name} on ec2: {st.ready} instance(s) READY in "
                      f"{time.monotonic() - t_pool:.1f} s, {plan.sandboxes_per_instance} sandboxes each "
                      f"({SANDBOX_CPUS:g} cpu, {SANDBOX_MEMORY_GB:g} GB)")
        t0 = time.monotonic()
        resolved = await pool.prefetch(refs)
        prefetch_s = time.monotonic() - t0
        infos = {t.name: info for t, info in zip(swe, resolved)}
        for t in swe:
            if infos[t.name].digest != images[t.name].pushed:
                raise RuntimeError(f"{images[t.name].image} resolved to {infos[t.name].digest}, "
                                   f"but the push reported {images[t.name].pushed}")
        tasks = [Task(name=t.name, sandbox=SandboxSpec(image=images[t.name].image, cpus=SANDBOX_CPUS,
                                                       memory_gb=SANDBOX_MEMORY_GB),
                      command=swe_eval.TASK_SCRIPT, files={swe_eval.PATCH: t.patch},
                      timeout_s=swe_eval.TASK_TIMEOUT_S) for t in swe]
        t0 = time.monotonic()
        results = await pool.map(tasks)
        wall = time.monotonic() - t0
        if raw_client is not None:   # what moto itself says of each instance (not via the SDK)
            ids = [i.id for _, insts in provider.launched for i in insts]
            if ids:
                resp = await asyncio.to_thread(raw_client.describe_instances, InstanceIds=ids)
                for res in resp.get("Reservations") or []:
                    for item in res.get("Instances") or []:
                        lifecycle[item["InstanceId"]] = item.get("InstanceLifecycle") or "on-demand"
        pulls = []
        while not pulled.queue.empty():
            ev = pulled.queue.get_nowait()
            pulls.append({"instance_id": ev.instance_id, "detail": ev.detail})
        run = swe_eval.ModeRun(mode="persistent", pool=pool.name, wall_s=wall, tasks=swe, results=results,
                               images=dict(images), infos=infos, pulls=pulls, prefetch_s=prefetch_s,
                               fetched=swe_eval._fetched(reg, log_mark, infos))
    finally:
        await pool.drain(timeout_s=120)
        pulled.close()

    console.print(swe_eval.task_table(run))
    swe_eval.print_mismatches(run)
    console.print(swe_eval.summary_table([run]))
    console.print(instances_table(provider, lifecycle))
    launched = [(o, i) for o, insts in provider.launched for i in insts]
    if launched and launched[0][0].instance_type != plan.chosen.instance_type:
        console.print(f"[yellow]the plan chose {plan.chosen.instance_type}; the fleet launched "
                      f"{launched[0][0].instance_type} (see the failovers below)[/]")
    now = time.time()
    spent = sum(i.price_per_hour * max(60.0, now - i.launched_at) / 3600 for _, i in launched)
    console.print(f"these {len(launched)} instance(s) would have cost ${spent:.4f} on EC2 "
                  f"(price x time from launch to drain, 60 s minimum each); the plan estimated "
                  f"${plan.cost:.4f} for {plan.task_minutes:g}-minute tasks")
    return all(run.matched())


def print_failovers(failovers: Any) -> None:
    events = []
    while not failovers.queue.empty():
        events.append(failovers.queue.get_nowait())
    failovers.close()
    if events:
        console.print(f"[bold yellow]{len(events)} LAUNCH_FAILOVER event(s):[/]")
        for ev in events:
            console.print(f"  {ev.detail}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print("LAUNCH_FAILOVER events: none")


async def _leftovers(provider: RolloutEc2, fleet_name: str) -> list[str]:
    """What the provider still lists alive with this fleet's tag after the drain (each is
    reported and terminated); an error while listing counts as a leftover."""
    try:
        left = await provider.list_tagged({TAG_FLEET: fleet_name})
    except FlowMeshError as exc:
        console.print(f"[bold red]cannot list the fleet's instances:[/] {escape(str(exc))}")
        return [f"(unverified: {type(exc).__name__})"]
    for inst in left:
        console.print(f"[red]  still alive: {inst.id} {inst.instance_type} {inst.state.value}[/]")
    if left:
        with contextlib.suppress(FlowMeshError):
            await provider.terminate([i.id for i in left])
    return [i.id for i in left]


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ec2_swe_rollouts.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="print the plan; no API call")
    p.add_argument("--emulator", "--moto", dest="emulator", action="store_true",
                   help="run offline: start moto's EC2 server on 127.0.0.1 and run there (sandboxes on "
                        "this host); --moto is an alias")
    p.add_argument("--endpoint-url", default=os.environ.get(ENV_ENDPOINT) or None,
                   help=f"EC2 endpoint (default ${ENV_ENDPOINT}); loopback addresses only (an emulator: "
                        "sandboxes run on this host); any other is refused with exit 2 before any API "
                        "call, as this recipe does not use the provider's SSH mode")
    p.add_argument("--ami", default=os.environ.get(ENV_AMI) or None, help=f"AMI id (default ${ENV_AMI})")
    p.add_argument("--region", default=os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    p.add_argument("--tasks", type=int, default=4, metavar="N", help="SWE tasks (default 4)")
    p.add_argument("--sandboxes-per-instance", type=int, default=2, metavar="S")
    p.add_argument("--max-instances", type=int, default=2, metavar="M")
    p.add_argument("--task-minutes", type=float, default=2.0, metavar="MIN",
                   help="assumed duration of one task, for the cost estimate (default 2)")
    p.add_argument("--cpus", type=int, default=8, help="vCPUs per instance (default 8)")
    p.add_argument("--memory-gb", type=float, default=16.0, help="GiB per instance (default 16)")
    market = p.add_mutually_exclusive_group()
    market.add_argument("--spot", dest="market", action="store_const", const="spot",
                        help="spot offers (default); on-demand when the catalog has no spot price")
    market.add_argument("--on-demand", dest="market", action="store_const", const="on-demand")
    p.set_defaults(market="spot")
    p.add_argument("--prices", metavar="CSV", help="a price catalog CSV (the columns of "
                                                   "providers/ec2/catalog.csv) instead of the catalog")
    p.add_argument("--registry", metavar="HOST:PORT",
                   help="push to and pull from this running registry instead of a throw-away one")
    p.add_argument("--inject-capacity-error", action="store_true",
                   help="with --emulator: answer the first RunInstances of the chosen type with "
                        "InsufficientInstanceCapacity, to show the failover")
    args = p.parse_args(argv)
    for name in ("tasks", "sandboxes_per_instance", "max_instances", "cpus"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.task_minutes <= 0 or args.memory_gb <= 0:
        p.error("--task-minutes and --memory-gb must be positive")
    if args.inject_capacity_error and not args.emulator:
        p.error("--inject-capacity-error needs --emulator")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        plan = make_plan(args)
    except (PlanError, FlowMeshError) as exc:
        console.print(f"[bold red]no plan:[/] {escape(str(exc))}")
        return 2
    print_plan(plan)
    if args.dry_run:
        console.print("dry run: no API call was made")
        return 0

    from flowmesh_sdk.remote.local import LocalRunner
    common: dict[str, Any] = dict(regions=[args.region], runner_factory=lambda inst: LocalRunner())
    stand_in = ("[bold reverse] STAND-IN [/] the emulator has no machines: every EC2 instance of this run "
                "exists only as a record, and its sandboxes run on THIS host through LocalRunner. "
                "Real EC2 instances are reached through the provider's SSH mode (docs/ssh.md), which "
                "this recipe does not use.")
    if args.emulator:
        from flowmesh_sdk.testing.ec2fault import Ec2FaultProxy
        from flowmesh_sdk.testing.moto import MotoEc2
        with MotoEc2() as moto, Ec2FaultProxy(moto.endpoint_url) as proxy:
            console.print(f"moto EC2 at {moto.endpoint_url} (fault/counting proxy {proxy.endpoint_url}); "
                          "dummy credentials, nothing leaves 127.0.0.1")
            console.print(stand_in)
            if args.inject_capacity_error:
                target = plan.chosen.instance_type
                proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=1,
                           when=lambda p: p.get("InstanceType") == target)
                console.print(f"injected: the first RunInstances of {target} answers "
                              "InsufficientInstanceCapacity")
            provider = RolloutEc2(endpoint_url=proxy.endpoint_url, image_id=moto.a_valid_ami(args.region),
                                  session_kwargs=moto.session_kwargs, **common)
            return await run_batch(args, plan, provider, proxy, moto.client(args.region))
    if not args.endpoint_url or not args.ami:
        console.print(f"[bold red]a run needs --endpoint-url (or {ENV_ENDPOINT}) and --ami (or "
                      f"{ENV_AMI})[/]; or --emulator for an offline run, or --dry-run for the plan")
        return 2
    if not _is_loopback(args.endpoint_url):
        console.print(f"[bold red]refusing {args.endpoint_url}:[/] not a loopback address. Real EC2 "
                      "instances are reached through the provider's SSH mode (Ec2Provider(ssh=SshMode()), "
                      "docs/ssh.md), which this recipe does not use: it runs every instance's sandboxes "
                      "on this host; nothing was launched. Use an EC2 emulator on 127.0.0.1 "
                      "(moto_server) or --emulator.")
        return 2
    console.print(f"EC2 endpoint {args.endpoint_url} (loopback: an emulator); credentials from the "
                  "AWS chain (AWS_ACCESS_KEY_ID / AWS_PROFILE / instance role)")
    console.print(stand_in)
    provider = RolloutEc2(endpoint_url=args.endpoint_url, image_id=args.ami, **common)
    try:
        return await run_batch(args, plan, provider)
    except FlowMeshError as exc:
        console.print(f"[bold red]{type(exc).__name__}:[/] {escape(str(exc))}")
        return 2


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
