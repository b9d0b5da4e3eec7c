#!/usr/bin/env python3
"""Bidder-placed pools across three clouds against cheapest-first on one cloud and the
exact optimum: 2,000 tasks of 30 minutes, through the REAL fleet, pools, provisioner and
bidder, on three simulated clouds (virtual time) with different prices, capacity limits,
boot times and spot interruptions.

Runs, side by side:

* ``bidder``: one pool over all three clouds, ``sandbox_size`` 2 cpus / 4 GB and
  ``concurrency`` 2,000, ``policy="cost"``, on-demand (``spot="never"``): the bidder
  chooses the instance types (shape and slots per instance) and the clouds;
* ``bidder+spot``: the same with ``spot="prefer"`` (the spot market is interrupted, so
  work is redone: shown for its cost, not held to the makespan bound);
* ``cheapest-first``: what a user without the bidder does -- the cheapest listed
  instance type, on its one cloud, one sandbox per instance; its capacity limit makes
  the rest of the batch queue.

Against:

* the cost optimum: an integer program (``scipy.optimize.milp``) choosing how many
  instances of each on-demand type to run so that their slots hold all 2,000 sandboxes
  at once within each type's capacity, each instance billed for its cloud's median boot,
  one image pull at its NIC's speed and the task time (what any placement pays at the
  least: no instance is billed less than its boot, its pull and one task);
* the makespan bound: the work (30 min) plus the earliest time at which the instances
  the run actually launched could hold every task at once, from the boot times the
  simulated clouds drew for them (a bound given those draws; the control plane's own
  overhead is what is above it).

Targets: bidder cost within 3 % of the optimum, makespan within 5 % of the bound, 0 tasks
lost.  Last line: ``cost_over_optimal_pct=<x> makespan_over_bound_pct=<y> tasks_lost=<n>``.

    python bench/multicloud_placement.py [--tasks 2000] [--minutes 30] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowmesh_sdk.sim import GBIT, SimInstanceType, unlimited  # noqa: E402
from flowmesh_sdk.sim.loop import run  # noqa: E402
from flowmesh_sdk.sim.scenario import REGISTRY, sim_clouds_fleet  # noqa: E402
from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSize, SandboxSpec, Task, clock  # noqa: E402

IMAGE = f"{REGISTRY}/sim/base:1"
SIZES = {"sim/base:1": 500_000_000}
SANDBOX = SandboxSize(cpus=2, memory_gb=4)
IDLE_S = 30.0   # instances are released 30 s after their last task (as at the end of an RL step)


def clouds():  # type: ignore[no-untyped-def]
    """Three clouds (prices and capacities are this benchmark's assumptions, in the range
    of 2026 list prices for 2-32 vCPU general-purpose types):

    * ``north``: the cheapest small type, but only 150 of each type for us; slow boots;
    * ``east``: dearer small types, a cheaper-per-vCPU 16-vCPU type, 200 of it;
    * ``west``: dearest on-demand, plenty of capacity, a cheap spot market interrupted
      at 0.3 per instance-hour."""
    north = unlimited("north", (SimInstanceType("n.2x", 2, 4, 0.080, capacity=150, nic_gbps=0.05),
                                SimInstanceType("n.8x", 8, 16, 0.352, capacity=150, nic_gbps=0.1)),
                      region="n-1", boot_median_s=70, boot_p90_s=110)
    east = unlimited("east", (SimInstanceType("e.2x", 2, 4, 0.096, capacity=400, nic_gbps=0.05),
                              SimInstanceType("e.16x", 16, 32, 0.688, capacity=200, nic_gbps=0.2)),
                     region="e-1", boot_median_s=40, boot_p90_s=70)
    west = unlimited("west", (SimInstanceType("w.4x", 4, 8, 0.210, spot_price_per_hour=0.07, capacity=5000,
                                              nic_gbps=0.1),
                              SimInstanceType("w.32x", 32, 64, 1.60, spot_price_per_hour=0.50, capacity=5000,
                                              nic_gbps=1.0)),
                     region="w-1", boot_median_s=35, boot_p90_s=60, spot_interruptions_per_hour=0.3)
    return north, east, west


def tasks(n: int, minutes: float) -> list[Task]:
    work = minutes * 60.0
    sb = SandboxSpec(image=IMAGE, cpus=SANDBOX.cpus, memory_gb=SANDBOX.memory_gb, timeout_s=work * 3)
    return [Task(name=f"t{i}", sandbox=sb, command=f"sim-work {work:g}", timeout_s=work * 3) for i in range(n)]


def slots_of(t: SimInstanceType) -> int:
    return min(t.cpus // int(SANDBOX.cpus), int(t.memory_gb // SANDBOX.memory_gb))


async def play(spec: PoolSpec, n: int, minutes: float, seed: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="fm-bench-") as home:
        async with sim_clouds_fleet(clouds(), SIZES, home=home, seed=seed) as (fleet, provs):
            pool = await fleet.pool(spec)
            t0 = clock.monotonic()
            res = await pool.map(tasks(n, minutes))
            makespan = clock.monotonic() - t0
            await pool.drain()
            vms = [vm for p in provs.values() for vm in p.vms.values()]
            # bound: the work plus when the launched instances could first hold every task
            ready = sorted((vm.boots_at - t0, slots_of(vm.type)) for vm in vms)
            have, at = 0, math.inf
            for when, s in ready:
                have += s
                if have >= n:
                    at = when
                    break
            return {"cost": sum(p.cost() for p in provs.values()), "makespan": makespan,
                    "bound": minutes * 60.0 + at if at < math.inf else math.nan,
                    "lost": sum(not r.ok for r in res), "instances": len(vms),
                    "interrupted": sum(p.stats()["interrupted"] for p in provs.values()),
                    "types": ", ".join(f"{k}x{v}" for k, v in sorted(
                        {t: sum(vm.type.name == t for vm in vms) for t in {vm.type.name for vm in vms}}.items()))}


def optimum(n: int, minutes: float) -> tuple[float, str]:
    from scipy.optimize import Bounds, LinearConstraint, milp

    types = [(c, t) for c in clouds() for t in c.types]
    image_bytes = sum(SIZES.values())
    hours = np.array([(minutes * 60.0 + c.boot_median_s + image_bytes / (t.nic_gbps * GBIT)) / 3600.0
                      for c, t in types])
    cost = np.array([t.price_per_hour for _, t in types]) * hours
    slots = np.array([slots_of(t) for _, t in types], dtype=float)
    caps = np.array([t.capacity for _, t in types], dtype=float)
    res = milp(cost, constraints=LinearConstraint(slots[None, :], lb=n), integrality=np.ones(len(types)),
               bounds=Bounds(0, caps))
    if not res.success:
        raise RuntimeError(f"milp: {res.message}")
    x = np.round(res.x).astype(int)
    return float(cost @ x), ", ".join(f"{t.name}x{k}" for (_, t), k in zip(types, x) if k)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=2000)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    n, minutes = args.tasks, args.minutes
    base = dict(mode="persistent", infra=("north", "east", "west"), sandbox_size=SANDBOX, concurrency=n,
                policy="cost", warm_per_image=0, idle_timeout_s=IDLE_S, retry_infra_failures=9,
                instance=InstanceSpec(cpus=2, memory_gb=4, disk_gb=200))
    cheapest = min((t for c in clouds() for t in c.types), key=lambda t: t.price_per_hour)
    home_cloud = next(c for c in clouds() if cheapest in c.types)
    runs = {
        "bidder": PoolSpec(name="bidder", **base),
        "bidder+spot": PoolSpec(name="spot", spot="prefer", **base),
        "cheapest-first": PoolSpec(name="cheapest", mode="persistent", infra=(home_cloud.name,),
                                   instance=InstanceSpec(cpus=cheapest.cpus, memory_gb=cheapest.memory_gb,
                                                         disk_gb=200),
                                   sandboxes_per_instance=1, max_instances=n, warm_per_image=0,
                                   idle_timeout_s=IDLE_S, retry_infra_failures=9, policy="cost"),
    }
    opt_cost, opt_mix = optimum(n, minutes)
    out = {}
    print(f"{n} tasks x {minutes:g} min, sandboxes of {SANDBOX.cpus:g} cpus / {SANDBOX.memory_gb:g} GB, "
          f"three simulated clouds (virtual time)")
    print(f"{'run':<15} {'cost $':>9} {'vs opt':>8} {'makespan s':>11} {'bound s':>9} {'over':>7} "
          f"{'lost':>5} {'VMs':>5} {'intr':>5} {'wall s':>7}  types")
    for name, spec in runs.items():
        w0 = time.perf_counter()
        r = run(play(spec, n, minutes, args.seed))
        wall = time.perf_counter() - w0
        out[name] = r
        over = 100.0 * (r["makespan"] / r["bound"] - 1.0)
        print(f"{name:<15} {r['cost']:>9.2f} {100.0 * (r['cost'] / opt_cost - 1):>7.2f}% {r['makespan']:>11.1f} "
              f"{r['bound']:>9.1f} {over:>6.2f}% {r['lost']:>5} {r['instances']:>5} {r['interrupted']:>5} "
              f"{wall:>7.1f}  {r['types']}")
    print(f"{'optimum (milp)':<15} {opt_cost:>9.2f} {'':>8} {'':>11} {'':>9} {'':>7} {'':>5} {'':>5} {'':>5} "
          f"{'':>7}  {opt_mix}")
    b = out["bidder"]
    cost_pct = 100.0 * (b["cost"] / opt_cost - 1.0)
    mk_pct = 100.0 * (b["makespan"] / b["bound"] - 1.0)
    lost = int(sum(r["lost"] for r in out.values()))
    print(f"bidder vs cheapest-first: cost x{b['cost'] / out['cheapest-first']['cost']:.3f}, "
          f"makespan x{b['makespan'] / out['cheapest-first']['makespan']:.3f}")
    print(f"targets: cost <= 3 % over the optimum: {'MET' if cost_pct <= 3 else 'NOT MET'}; makespan <= 5 % "
          f"over the bound: {'MET' if mk_pct <= 5 else 'NOT MET'}; 0 lost: {'MET' if lost == 0 else 'NOT MET'}")
    print(f"cost_over_optimal_pct={cost_pct:.2f} makespan_over_bound_pct={mk_pct:.2f} tasks_lost={lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
