#!/usr/bin/env python3
"""The main job's SWE-style batch in ONE pool that spans two providers: this host
(``local``) and EC2, placed by the bidder.

The pool's search space is ``("local", "ec2/us-east-1")``.  Offers from both are priced
from the catalog (``local`` costs nothing: the machine is yours) and ranked by
U = w_t*T - w_c*C + w_l*G_loc; the pool keeps two instances warm.  This host holds one
instance of the pool's size, so the launch fills it and fails over (the reason and the
price delta are published) to the best EC2 offer for the other, and the batch runs on
both.  It prints every launch decision with the winner's and runner-up's terms, which
tasks ran where, and what the run cost per provider.

    python recipes/multicloud_eval.py --emulator            # offline: EC2 is moto on 127.0.0.1

``--emulator`` is the only mode: EC2 is moto's server (the real boto3 talks to it) and
each instance it launches is backed by a real OpenSSH ``sshd`` on a loopback address
(the test fixture ``LoopbackSshd``, with its own container storage), so bootstrap, image
pulls and sandboxes run for real there.  Images go to a throw-away ``docker-registry``
on 127.0.0.1.  Nothing leaves this machine.

Exits 0 only when every verdict matches its expectation and both providers ran tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _main_job import load_main_job  # noqa: E402

job = load_main_job()
console = job.console


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="multicloud_eval.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--emulator", action="store_true", required=True,
                   help="EC2 on moto with loopback sshd machines (the only mode)")
    p.add_argument("--tasks", type=int, default=6, help="SWE tasks in the batch (default 6)")
    p.add_argument("--budget-per-hour", type=float, default=5.0, help="the pool's $/h cap (default 5)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.tasks < 2:
        p.error("--tasks must be at least 2")
    return args


def pool_spec(registry: str, budget_per_hour: float) -> PoolSpec:
    # two warm 2-cpu instances, two sandboxes each: this host holds one, EC2 the other
    return PoolSpec(name="swe-multi", mode="persistent", infra=("local", "ec2/us-east-1"),
                    instance=InstanceSpec(cpus=2, memory_gb=4), min_instances=2, max_instances=2,
                    sandboxes_per_instance=2, warm_per_image=0, policy="cost",
                    budget_per_hour=budget_per_hour, warm_images=(f"{registry}/{job.BASE_IMAGE.removeprefix('localhost/')}",))


def decisions_table(events: list[Any]) -> Table:
    t = Table(title="placement: launch decisions and failovers")
    for col in ("what", "detail"):
        t.add_column(col)
    for ev in events:
        if ev.kind is EventKind.LAUNCH_DECIDED:
            d = json.loads(ev.detail)
            w, r = d["winner"], d["runner_up"]
            text = (f"{d['count']} x {w['offer']} ${w['price_per_hour']:.4f}/h U={w['U']:.3f}"
                    + (f"; runner-up {r['offer']} ${r['price_per_hour']:.4f}/h U={r['U']:.3f}" if r else ""))
            t.add_row("decided", text)
        else:
            t.add_row(ev.kind.value.split(".")[1], ev.detail)
    return t


async def run(args: argparse.Namespace) -> int:
    from flowmesh_providers.local import LocalProvider
    from flowmesh_sdk.remote.ssh import SshRunner, SshTarget
    from flowmesh_sdk.testing.moto import MotoEc2
    from flowmesh_sdk.registry.local import LocalRegistry
    from flowmesh_sdk.testing.sshd import LoopbackSshd

    build = job._load_image_builder()
    await asyncio.to_thread(job.ensure_base, build)
    swe = job.make_tasks(args.tasks)
    async with contextlib.AsyncExitStack() as stack:
        reg = await stack.enter_async_context(LocalRegistry())
        registry_host = reg.host
        built: list[str] = []
        try:
            images = await asyncio.to_thread(job.build_and_push, build, reg, swe, built)
        finally:
            for ref in built:
                job._podman("rmi", ref)
        moto = stack.enter_context(MotoEc2())
        machines = [stack.enter_context(LoopbackSshd(f"127.0.0.{41 + i}")) for i in range(2)]
        runners: dict[str, SshRunner] = {}

        def runner_for(inst: Any) -> SshRunner:
            # each EC2 instance is the next loopback sshd machine
            if inst.id not in runners:
                d = machines[len(runners) % len(machines)]
                runners[inst.id] = SshRunner(SshTarget(d.host, d.port, d.user, d.client_key_path,
                                                       d.host_public_key))
            return runners[inst.id]

        ec2 = moto.provider(runner_factory=runner_for)
        stack.push_async_callback(ec2.close)
        local = LocalProvider(cpus=2, memory_gb=4, state_dir=None)   # room for one 2-cpu instance
        stack.push_async_callback(local.close)

        async def close_runners() -> None:
            for r in runners.values():
                await r.close()
        stack.push_async_callback(close_runners)
        spec = pool_spec(registry_host, args.budget_per_hour)
        async with Fleet(name="multicloud", providers={"local": local, "ec2": ec2}) as fleet:
            placement: list[Any] = []
            fleet.bus.on(placement.append, EventKind.LAUNCH_DECIDED, EventKind.LAUNCH_FAILOVER,
                         EventKind.LAUNCH_REFUSED)
            where: dict[str, str] = {}
            fleet.bus.on(lambda e: where.__setitem__(e.instance_id, json.loads(e.detail)["provider"]),
                         EventKind.INSTANCE_REQUESTED)
            result = await job.run_mode(fleet, reg, "persistent", swe, images, spec=spec)
            spend = fleet.ledger.by_provider(spec.name)
    console.print(decisions_table(placement))
    console.print(job.task_table(result))
    job.print_mismatches(result)
    by_provider: dict[str, list[str]] = {}
    for r in result.results:
        by_provider.setdefault(where.get(r.instance_id or "", "?"), []).append(r.name)
    st = Table(title="where the batch ran, and what it cost")
    for col in ("provider", "tasks", "spent $", "instances"):
        st.add_column(col)
    for name in sorted(set(by_provider) | set(spend)):
        s = spend.get(name)
        st.add_row(name, ", ".join(by_provider.get(name, [])), f"{s.spent:.6f}" if s else "-",
                   str(sum(1 for p in where.values() if p == name)))
    console.print(st)
    ok = all(result.matched()) and {"local", "ec2"} <= set(by_provider)
    if args.json:
        data = job.to_json(registry_host, [result], ok)
        data["where"] = where
        data["tasks_by_provider"] = by_provider
        data["spend"] = {k: {"spent": v.spent, "burn_per_hour": v.burn_per_hour} for k, v in spend.items()}
        data["placement"] = [{"kind": e.kind.value, "detail": e.detail} for e in placement]
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if ok:
        console.print("[bold green]every verdict matched; the pool ran on local and on EC2[/]")
    else:
        console.print("[bold red]a verdict did not match, or one provider ran nothing[/]")
    return 0 if ok else 1


async def main(argv: list[str] | None = None) -> int:
    return await run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
