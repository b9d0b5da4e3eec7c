#!/usr/bin/env python3
"""MegaFlow's setting on Alibaba Cloud ECS: a persistent pool of 8-core / 16 GB instances
(the ``ecs.c8a.2xlarge`` class) running the main job's SWE-style batch.

``--dry-run`` prints the plan and makes no API call: the ECS shapes of that class in the
price catalog (the shipped snapshot has the shapes MegaFlow names at the prices **implied by
the paper's totals**, labelled so -- Alibaba publishes no dated price list this repository
could cite; ``flowmesh catalog refresh --provider alibaba`` fills list prices from
``DescribePrice``, or pass ``--price TYPE=USD``), how
many instances the batch needs, the RunInstances calls (``Amount`` 1..100 per call) and how
long the client-side buckets the ``alibaba`` provider declares take to let them through
(10 calls at 1/s; 5,000 instances a minute, ECS's account-wide creation limit), and the
cost when a price is known.

``--emulator`` runs the batch offline: the tasks, task images and throw-away registry of
``recipes/local_swe_eval.py`` (loaded as a module), on a persistent pool of provider
``alibaba`` whose API is the ECS emulator (``flowmesh_sdk.testing.ecs``; the real
``alibabacloud-ecs20140526`` client talks to it on 127.0.0.1).  Each instance it launches
boots from its user-data as a loopback sshd host with its own container storage (SSH mode:
the host key injected at launch and pinned), so bootstrap, image pulls and sandboxes run for
real.  Offers are priced from a catalog fetched from the emulator's ``DescribePrice`` with
the real price adapter: the fixture's made-up prices, never Alibaba's.  Nothing leaves this
machine.  A real ECS run is not wired into this recipe: it has no options for one, and
without ``--dry-run`` or ``--emulator`` it exits 2 (argparse) before any API call.  What a
real run needs (region, a vSwitch per zone, a security group, credentials in
``ALIBABA_CLOUD_ACCESS_KEY_ID``/``_SECRET``) is in docs/providers/alibaba.md.

    python recipes/ecs_persistent_pool.py --dry-run [--tasks 10000 --sandboxes-per-instance 8]
    python recipes/ecs_persistent_pool.py --emulator [--tasks 6 --instances 2]

Launch-time arithmetic (also printed): K instances need ``calls = ceil(K / 100)``
RunInstances calls; with both buckets full the last call can go after
``max(calls - 10, (K - 5000) / 83.3)`` seconds (0 while K <= 5,000 and calls <= 10).

Exit status: 0 when every verdict matched and nothing tagged with the run's fleet is left;
1 otherwise; 2 when the run cannot start.  Importable: ``await main(["--dry-run"])``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec
from flowmesh_sdk.catalog import Catalog, CatalogRow

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _main_job import load_main_job  # noqa: E402

job = load_main_job()
console = job.console

SHAPE = InstanceSpec(cpus=8, memory_gb=16)
BATCH = 100                 # RunInstances Amount
CALL_BUCKET = (10, 1.0)     # the provider's declared launch request bucket
CREATE_BUCKET = (5000, 5000 / 60.0)


@dataclass(frozen=True)
class Plan:
    tasks: int
    per_instance: int
    instances: int
    rows: tuple[CatalogRow, ...]
    chosen: CatalogRow | None
    price: float | None
    task_minutes: float

    @property
    def calls(self) -> int:
        return math.ceil(self.instances / BATCH)

    @property
    def launch_s(self) -> float:
        return max(max(0.0, self.calls - CALL_BUCKET[0]) / CALL_BUCKET[1],
                   max(0.0, self.instances - CREATE_BUCKET[0]) / CREATE_BUCKET[1])

    @property
    def hours(self) -> float:
        waves = math.ceil(self.tasks / (self.instances * self.per_instance))
        return waves * self.task_minutes / 60.0

    @property
    def cost(self) -> float | None:
        return None if self.price is None else self.instances * self.price * self.hours


def make_plan(args: argparse.Namespace) -> Plan:
    prices = dict(args.price or [])
    rows = tuple(r for r in Catalog.load(["alibaba"], warn=False).rows
                 if r.cpus >= SHAPE.cpus and r.memory_gb >= SHAPE.memory_gb and r.gpus == 0
                 and r.cpus <= 2 * SHAPE.cpus)
    def price_of(r: CatalogRow) -> float | None:
        return prices.get(r.instance_type, r.on_demand_per_hour)
    priced = sorted((r for r in rows if price_of(r) is not None), key=lambda r: price_of(r) or 0)
    chosen = priced[0] if priced else (rows[0] if rows else None)
    instances = min(args.max_instances, math.ceil(args.tasks / args.sandboxes_per_instance))
    return Plan(args.tasks, args.sandboxes_per_instance, instances, rows, chosen,
                price_of(chosen) if chosen else None, args.task_minutes)


def print_plan(plan: Plan) -> None:
    t = Table(title="ECS shapes of the 8 vCPU / 16 GB class in the catalog")
    for col in ("type", "region", "vCPU", "GiB", "$/h", "source"):
        t.add_column(col)
    for r in plan.rows:
        t.add_row(r.instance_type, r.region, f"{r.cpus:g}", f"{r.memory_gb:g}",
                  "unknown" if r.on_demand_per_hour is None else f"{r.on_demand_per_hour:.4f}", r.source[:60])
    console.print(t)
    chosen = plan.chosen.instance_type if plan.chosen else "none"
    console.print(f"plan: {plan.tasks} tasks, {plan.per_instance} sandboxes per instance -> {plan.instances} x "
                  f"{chosen} in {plan.calls} RunInstances call(s) of at most {BATCH}; the provider's buckets let "
                  f"the last call go after {plan.launch_s:.1f} s")
    if plan.price is None:
        console.print("price: unknown -- the shipped snapshot has no Alibaba prices (no dated public source is "
                      "cited); run `flowmesh catalog refresh --provider alibaba` (DescribePrice) or pass "
                      "--price TYPE=USD")
    else:
        console.print(f"price: ${plan.price:.4f}/h per instance; {plan.hours:.2f} h of tasks -> estimated "
                      f"${plan.cost:.2f} (boot, disks and traffic not included)")
        if plan.chosen is not None and plan.price == plan.chosen.on_demand_per_hour:
            console.print(f"price source: {plan.chosen.source}; `flowmesh catalog refresh --provider alibaba` "
                          "(DescribePrice) fetches list prices, --price TYPE=USD sets one", soft_wrap=True)


def pool_spec(registry: str, instances: int, per_instance: int) -> PoolSpec:
    return PoolSpec(name="ecs-megaflow", mode="persistent", infra=("alibaba",), instance=SHAPE,
                    min_instances=instances, max_instances=instances, sandboxes_per_instance=per_instance,
                    warm_per_image=0, policy="cost",
                    warm_images=(f"{registry}/{job.BASE_IMAGE.removeprefix('localhost/')}",))


async def run_emulator(args: argparse.Namespace) -> int:
    from flowmesh_sdk.testing.ecs import EcsEmulator
    from flowmesh_sdk.registry.local import LocalRegistry

    build = job._load_image_builder()
    await asyncio.to_thread(job.ensure_base, build)
    swe = job.make_tasks(args.tasks)
    fleet_name = f"ecs-{secrets.token_hex(3)}"
    async with contextlib.AsyncExitStack() as stack:
        reg = await stack.enter_async_context(LocalRegistry())
        registry_host = reg.host
        built: list[str] = []
        try:
            images = await asyncio.to_thread(job.build_and_push, build, reg, swe, built)
        finally:
            for ref in built:
                job._podman("rmi", ref)
        emu = await stack.enter_async_context(EcsEmulator())
        ecs = emu.provider(ssh=True, instance_types=["ecs.c8a.", "ecs.c8i."], spot=False)
        stack.push_async_callback(ecs.close)
        catalog = Catalog(await emu.price_rows())
        spec = pool_spec(reg.host, args.instances, args.sandboxes_per_instance)
        async with Fleet(name=fleet_name, providers={"alibaba": ecs}, catalog=catalog) as fleet:
            decisions: list[Any] = []
            fleet.bus.on(decisions.append, EventKind.LAUNCH_DECIDED, EventKind.LAUNCH_FAILOVER)
            result = await job.run_mode(fleet, reg, "persistent", swe, images, spec=spec)
            spend = fleet.ledger.by_provider(spec.name)
        left = [i.id for i in await ecs.list_tagged({"flowmesh:fleet": fleet_name})]
        calls = {a: emu.count(a) for a in ("DescribeAvailableResource", "RunInstances", "DescribeInstances",
                                            "DeleteInstances")}
    for ev in decisions:
        console.print(f"[dim]{ev.kind.value}: {ev.detail}[/]")
    console.print(job.task_table(result))
    job.print_mismatches(result)
    console.print(f"ECS API calls: {calls}; spent ${sum(s.spent for s in spend.values()):.6f} (fixture prices)")
    ok = all(result.matched()) and not left
    if args.json:
        data = job.to_json(registry_host, [result], ok)
        data["ecs_calls"] = calls
        data["left_running"] = left
        data["instances"] = sorted({r.instance_id for r in result.results if r.instance_id})
        data["decisions"] = [{"kind": e.kind.value, "detail": e.detail} for e in decisions]
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    console.print("[bold green]every verdict matched on ECS (emulated); nothing left running[/]" if ok else
                  f"[bold red]a verdict did not match, or {len(left)} instance(s) are left[/]")
    return 0 if ok else 1


def _price(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--price takes TYPE=USD, got {text!r}") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ecs_persistent_pool.py", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="print the plan; no API call")
    mode.add_argument("--emulator", action="store_true", help="run the batch on the ECS emulator (offline)")
    p.add_argument("--tasks", type=int, default=None, help="tasks in the batch (dry run: 10000; emulator: 6)")
    p.add_argument("--sandboxes-per-instance", type=int, default=None, help="dry run: 8; emulator: 2")
    p.add_argument("--instances", type=int, default=2, help="emulator: warm instances (default 2)")
    p.add_argument("--max-instances", type=int, default=10_000, help="dry run: the fleet's cap (default 10000)")
    p.add_argument("--task-minutes", type=float, default=10.0, help="dry run: minutes per task (default 10)")
    p.add_argument("--price", type=_price, action="append", metavar="TYPE=USD", help="dry run: a $/h to use")
    p.add_argument("--json", metavar="PATH", help="emulator: also write the results as JSON")
    args = p.parse_args(argv)
    args.tasks = args.tasks or (10_000 if args.dry_run else 6)
    args.sandboxes_per_instance = args.sandboxes_per_instance or (8 if args.dry_run else 2)
    if args.tasks < 1 or args.sandboxes_per_instance < 1 or args.instances < 1:
        p.error("--tasks, --sandboxes-per-instance and --instances must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print_plan(make_plan(args))
        console.print("dry run: no API call was made")
        return 0
    return await run_emulator(args)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
