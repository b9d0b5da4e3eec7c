"""What the one-cloud recipes (``gce_eval.py``, ``azure_persistent_pool.py``, ``k8s_eval.py``) share: the
``--dry-run`` plan (offers and prices from the catalog, no API call; how long the
provider's declared launch buckets take), the registry (``--registry`` or a throw-away one on
127.0.0.1) and the main job's batch in a persistent pool on one provider.  A script helper,
not a package."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec
from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.provider import ApiRate

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _main_job import load_main_job  # noqa: E402

job = load_main_job()
console = job.console
SPEC = InstanceSpec(cpus=2, memory_gb=4)


@dataclass(frozen=True)
class Plan:
    provider: str
    region: str
    instance_type: str
    price: float
    source: str
    tasks: int
    instances: int
    slots_per_instance: int
    task_minutes: float
    launch_s: float

    @property
    def waves(self) -> int:
        return math.ceil(self.tasks / (self.instances * self.slots_per_instance))

    @property
    def hours(self) -> float:
        return self.waves * self.task_minutes / 60

    @property
    def cost(self) -> float:
        return self.instances * self.price * self.hours


def launch_seconds(rates: Sequence[ApiRate], instances: int, max_batch: int) -> float:
    """How long the declared launch buckets take to let ``instances`` through in calls of
    at most ``max_batch`` (a full bucket at the start)."""
    calls = math.ceil(instances / max_batch)
    worst = 0.0
    for r in rates:
        if r.api != "launch":
            continue
        need = instances if r.per_instance else calls
        worst = max(worst, max(0.0, need - r.burst) / r.rate_per_s)
    return worst


def make_plan(provider: str, region: str, *, tasks: int, instances: int, slots: int, task_minutes: float,
              rates: Sequence[ApiRate], max_batch: int, spec: InstanceSpec = SPEC) -> Plan:
    catalog = Catalog.load([provider], warn=False)
    rows = sorted((r for r in catalog.rows if r.provider == provider and r.region == region
                   and r.on_demand_per_hour is not None and r.cpus >= spec.cpus and r.memory_gb >= spec.memory_gb
                   and not r.gpus), key=lambda r: (r.on_demand_per_hour, r.instance_type))
    if not rows:
        raise SystemExit(f"the {provider} catalog has no priced shape of {spec.cpus} vCPUs / {spec.memory_gb:g} GiB "
                         f"in {region}")
    best = rows[0]
    return Plan(provider, region, best.instance_type, float(best.on_demand_per_hour or 0.0), best.source, tasks,
                instances, slots, task_minutes, launch_seconds(rates, instances, max_batch))


def print_plan(plan: Plan) -> None:
    console.print(f"dry run ({plan.provider}): no API call was made")
    console.print(f"cheapest offer that fits {SPEC.cpus} vCPUs / {SPEC.memory_gb:g} GiB in {plan.region}: "
                  f"{plan.instance_type} at ${plan.price:.4f}/h (catalog: {plan.source.split(':', 1)[0]})")
    console.print(f"{plan.instances} instance(s) x {plan.slots_per_instance} sandboxes; {plan.tasks} tasks of "
                  f"{plan.task_minutes:g} min -> {plan.waves} wave(s) = {plan.hours:.3f} h")
    console.print(f"estimated cost: {plan.instances} x ${plan.price:.4f}/h x {plan.hours:.4f} h = ${plan.cost:.4f} "
                  "(disks, IPs and egress not included)")
    console.print(f"launch: the declared API buckets let {plan.instances} instance(s) through in "
                  f"{plan.launch_s:g} s")
    console.print(f"PLAN provider={plan.provider} region={plan.region} type={plan.instance_type} "
                  f"instances={plan.instances} waves={plan.waves} cost_usd={plan.cost:.4f} launch_s={plan.launch_s:g}",
                  soft_wrap=True)


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan and its cost; no API call")
    p.add_argument("--emulator", action="store_true", help="run offline against the package's emulator")
    p.add_argument("--tasks", type=int, default=4, help="SWE tasks in the batch (default 4)")
    p.add_argument("--instances", type=int, default=1, help="warm instances in the pool (default 1)")
    p.add_argument("--slots", type=int, default=2, help="sandboxes per instance (default 2)")
    p.add_argument("--task-minutes", type=float, default=2.0, help="assumed minutes per task, for the plan")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--registry", metavar="HOST:PORT",
                   help="push to and pull from this running registry; a real run needs one its VMs can "
                        "reach (default with --emulator: a throw-away docker-registry on 127.0.0.1)")


def registry(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """``--registry HOST:PORT`` (a registry already running), else a throw-away
    ``LocalRegistry`` on 127.0.0.1 (reachable from the emulators' loopback VMs only)."""
    if args.registry:
        host = args.registry.strip().rstrip("/")
        return contextlib.nullcontext(job.ExistingRegistry(host, job._load_image_builder().resolve_tls_verify(host)))
    from flowmesh_sdk.registry.local import LocalRegistry
    return LocalRegistry()


def refuse_real_run_without_registry(args: argparse.Namespace, cloud: str) -> bool:
    """True (after saying why) when a real run has no ``--registry``: a registry on this
    machine's 127.0.0.1 is out of the VMs' reach, so nothing is launched."""
    if args.registry:
        return False
    console.print(f"[bold red]a real run needs --registry HOST:PORT[/], a registry the {cloud} VMs can pull "
                  "from (a throw-away one on 127.0.0.1 is out of their reach); nothing was launched. "
                  "--emulator runs offline, --dry-run prints the plan")
    return True


async def run_batch(name: str, provider_name: str, provider: Any, args: argparse.Namespace,
                    registry_stack: Any, *, mode: str = "persistent", infra: Sequence[str] | None = None,
                    more: dict[str, Any] | None = None) -> int:
    """The main job's batch in one pool on ``provider`` (already built): persistent
    (``--instances`` warm instances x ``--slots``), or ephemeral (a fresh instance per task,
    ``--instances`` at a time).  ``infra``: the pool's search space (default the provider);
    ``more``: other providers it names (a pool that spills from a cluster to a cloud)."""
    import asyncio
    build = job._load_image_builder()
    await asyncio.to_thread(job.ensure_base, build)
    swe = job.make_tasks(args.tasks)
    reg = registry_stack
    built: list[str] = []
    try:
        images = await asyncio.to_thread(job.build_and_push, build, reg, swe, built)
    finally:
        for ref in built:
            job._podman("rmi", ref)
    where = tuple(infra or (provider_name,))
    if mode == "persistent":
        spec = PoolSpec(name=name, mode="persistent", infra=where, instance=SPEC,
                        min_instances=args.instances, max_instances=args.instances,
                        sandboxes_per_instance=args.slots, warm_per_image=0, policy="cost")
    else:
        spec = PoolSpec(name=name, mode="ephemeral", infra=where, instance=SPEC, max_instances=args.instances,
                        policy="cost")
    async with Fleet(name=name, providers={provider_name: provider, **(more or {})}) as fleet:
        placement: list[Any] = []
        fleet.bus.on(placement.append, EventKind.LAUNCH_DECIDED, EventKind.LAUNCH_FAILOVER)
        result = await job.run_mode(fleet, reg, mode, swe, images, spec=spec)
        spend = fleet.ledger.by_provider(spec.name)
    for e in placement:   # where the bidder put each launch, and each failover with its reason
        line = str(e.detail or "")
        if e.kind is EventKind.LAUNCH_DECIDED and line:
            d = json.loads(line)
            line = f"{d['count']} x {d['winner']['offer']}" + (
                f" (runner-up {d['runner_up']['offer']})" if d.get("runner_up") else "")
        console.print(f"[dim]{e.kind.value}: {line[:300]}[/]", soft_wrap=True)
    console.print(job.task_table(result))
    job.print_mismatches(result)
    t = Table(title=f"{provider_name}: what the batch cost")
    for col in ("provider", "spent $", "burn $/h"):
        t.add_column(col)
    for k, v in spend.items():
        t.add_row(k, f"{v.spent:.6f}", f"{v.burn_per_hour:.4f}")
    console.print(t)
    ok = all(result.matched())
    if args.json:
        data = job.to_json(reg.host, [result], ok)
        data["spend"] = {k: {"spent": v.spent} for k, v in spend.items()}
        data["placement"] = [{"kind": e.kind.value, "detail": e.detail} for e in placement]
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    console.print("[bold green]every verdict matched[/]" if ok else "[bold red]a verdict did not match[/]")
    return 0 if ok else 1
