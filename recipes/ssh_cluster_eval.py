#!/usr/bin/env python3
"""The main job's SWE-style batch on your own machines, over SSH.

The same tasks as ``recipes/local_swe_eval.py`` (a tiny git repo with one bug per task,
one image per task FROM swe-base, pushed to a registry, run by digest; right patches
must pass and wrong ones fail) run in a persistent pool on the ``ssh`` provider: each
machine of the inventory is bootstrapped (reach, runtime, registry login, prefetch,
agent -- timed, printed per machine), pulls the images into its own store, and runs
sandboxes over one multiplexed SSH connection with its host key pinned.

    python recipes/ssh_cluster_eval.py --inventory hosts.json --registry HOST:PORT
    python recipes/ssh_cluster_eval.py                     # a demo cluster of 2 on this machine
    python recipes/ssh_cluster_eval.py --loopback 4        # ... of 4

``--inventory`` is the ``ssh`` provider's JSON file (see docs/ssh.md); the registry must
be reachable from every machine.  Without it the recipe runs offline: ``--loopback N``
(default 2) starts N OpenSSH ``sshd`` daemons on 127.0.0.21, 127.0.0.22, ... (the test
fixture ``LoopbackSshd``: each with its own host key and its own container storage, so
every "machine" really pulls; it needs ``/usr/sbin/sshd``, from openssh-server) and a
throw-away ``docker-registry`` on 127.0.0.1: everything stays on this machine.

Exits 0 only when every verdict matches its expectation and every machine bootstrapped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from rich.table import Table

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec
from flowmesh_sdk.specs import BootstrapReport

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _main_job import load_main_job  # noqa: E402

job = load_main_job()
console = job.console
DEFAULT_LOOPBACK = 2   # machines of the demo cluster when no --inventory is given


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="ssh_cluster_eval.py", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--inventory", metavar="PATH", help="the ssh provider's inventory (JSON)")
    where.add_argument("--loopback", type=int, metavar="N",
                       help=f"start N sshd hosts on 127.0.0.21.. as a demo cluster on this machine "
                            f"(the default without --inventory, N={DEFAULT_LOOPBACK})")
    p.add_argument("--registry", metavar="HOST:PORT",
                   help="a registry every machine can reach (needed with --inventory; on the "
                        "loopback hosts the default is a throw-away docker-registry on 127.0.0.1)")
    p.add_argument("--tasks", type=int, default=8, metavar="N", help="number of tasks (default 8)")
    p.add_argument("--cpus", type=int, default=2, help="cpus of each instance carved from a machine (default 2)")
    p.add_argument("--sandboxes-per-instance", type=int, default=2, metavar="S", help="default 2")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.inventory is None and args.loopback is None:
        args.loopback = DEFAULT_LOOPBACK
    if args.tasks < 1:
        p.error("--tasks must be at least 1")
    if args.loopback is not None and not 1 <= args.loopback <= 8:
        p.error("--loopback must be between 1 and 8")
    if args.inventory and not args.registry:
        p.error("--inventory needs --registry HOST:PORT (a registry the machines can reach)")
    return args


def bootstrap_table(reports: list[BootstrapReport]) -> Table:
    steps = [s.name for s in reports[0].steps] if reports else []
    t = Table(title="bootstrap per machine (seconds; * = changed something)")
    t.add_column("machine")
    for name in steps:
        t.add_column(name, justify="right")
    t.add_column("total", justify="right")
    for r in reports:
        t.add_row(r.instance_id,
                  *(f"{s.seconds:.2f}{'*' if s.changed else ''}" for s in r.steps), f"{r.total_s:.2f}")
    return t


async def run(args: argparse.Namespace) -> int:
    from flowmesh_providers.ssh import SshHost, SshProvider, load_inventory

    build = job._load_image_builder()
    await asyncio.to_thread(job.ensure_base, build)
    swe = job.make_tasks(args.tasks)
    async with contextlib.AsyncExitStack() as stack:
        if args.loopback:
            from flowmesh_sdk.testing.sshd import LoopbackSshd
            try:
                sshds = [stack.enter_context(LoopbackSshd(f"127.0.0.{21 + i}")) for i in range(args.loopback)]
            except RuntimeError as exc:   # no sshd / ssh-keygen here: say so, and what else to pass
                console.print(f"[bold red]cannot start the loopback sshd hosts:[/] {exc}; or run on your "
                              "own machines with --inventory PATH --registry HOST:PORT")
                return 2
            hosts = [SshHost(name=f"box{i + 1}", host=d.host, port=d.port, user=d.user,
                             key_path=d.client_key_path, host_key=d.host_public_key,
                             cpus=args.cpus, memory_gb=4) for i, d in enumerate(sshds)]
            console.print(f"started {len(hosts)} sshd hosts: "
                          + ", ".join(f"{h.name}={h.host}:{h.port}" for h in hosts))
        else:
            hosts = load_inventory(args.inventory)
        if args.registry:
            host = args.registry.strip().rstrip("/")
            reg = job.ExistingRegistry(host, build.resolve_tls_verify(host))
        else:
            from flowmesh_sdk.registry.local import LocalRegistry
            reg = await stack.enter_async_context(LocalRegistry())
            console.print(f"started docker-registry at {reg.host} (throw-away)")
        registry_host = reg.host   # a LocalRegistry forgets its port once stopped
        built: list[str] = []
        try:
            images = await asyncio.to_thread(job.build_and_push, build, reg, swe, built)
        finally:
            for ref in built:
                job._podman("rmi", ref)
        prov = SshProvider(hosts, state_dir=None)
        stack.push_async_callback(prov.close)
        spec = PoolSpec(name="swe-ssh", provider="ssh", instance=InstanceSpec(cpus=args.cpus, memory_gb=4),
                        min_instances=len(hosts), max_instances=len(hosts),
                        sandboxes_per_instance=args.sandboxes_per_instance, warm_per_image=0,
                        warm_images=(f"{reg.host}/{job.BASE_IMAGE.removeprefix('localhost/')}",))
        async with Fleet(name="swe-ssh", providers={"ssh": prov}) as fleet:
            reports: list[BootstrapReport] = []
            fleet.bus.on(lambda e: e.bootstrap and reports.append(e.bootstrap), EventKind.INSTANCE_READY)
            fleet.bus.on(lambda e: console.print(f"[red]{e.instance_id} failed: {e.detail}[/]"),
                         EventKind.INSTANCE_FAILED)
            result = await job.run_mode(fleet, reg, "persistent", swe, images, spec=spec)
    console.print(bootstrap_table(reports))
    console.print(job.task_table(result))
    job.print_mismatches(result)
    console.print(job.summary_table([result]))
    ok = all(result.matched()) and len(reports) == len(hosts)
    if args.json:
        data = job.to_json(registry_host, [result], ok)
        data["bootstrap"] = [{"instance_id": r.instance_id, "total_s": r.total_s,
                              "steps": [{"name": s.name, "seconds": s.seconds, "changed": s.changed,
                                         "detail": s.detail} for s in r.steps]} for r in reports]
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if ok:
        console.print(f"[bold green]every verdict matched its expectation on {len(hosts)} machine(s)[/]")
    else:
        console.print("[bold red]a verdict did not match, or a machine did not bootstrap[/]")
    return 0 if ok else 1


async def main(argv: list[str] | None = None) -> int:
    return await run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
