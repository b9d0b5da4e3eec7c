#!/usr/bin/env python3
"""The main job's SWE-style batch on Google Compute Engine: one persistent pool of VMs that
the ``gce`` provider launches with ``instances.bulkInsert`` and reaches over SSH with keys it
injected at launch (cloud-init ``user-data``), sandboxes run there.

    python recipes/gce_eval.py --dry-run [--tasks 200 --instances 10]   # the plan and its cost
    python recipes/gce_eval.py --emulator                               # offline, nothing leaves this host
    FLOWMESH_GCE_PROJECT=my-project python recipes/gce_eval.py --registry HOST:PORT   # a real run (billed)

``--dry-run`` makes no API call: the cheapest catalog shape that fits (2 vCPUs, 4 GiB, the
``gce`` rows of ``flowmesh_sdk/catalog``), the waves and hours the batch takes at
``--task-minutes`` per task, the cost, and how long the provider's declared launch bucket
takes.  ``--emulator`` runs the batch against the Compute Engine emulator
(``flowmesh_sdk.testing.gce``) with the real google-cloud-compute client: every VM it
creates is a real OpenSSH sshd on a loopback address, booted from the user-data the
provider sent.  A real run uses Application Default Credentials and needs an image with
podman (``--image``; docs/providers/gce.md) and a registry the VMs can pull from
(``--registry HOST:PORT``; without one it refuses before any API call, as a throw-away
registry on this machine's 127.0.0.1 is out of their reach).

Exits 0 only when every verdict matches its expectation; 2 when a real run has no
``--registry``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cloud_recipe import (add_common_args, console, make_plan, print_plan,  # noqa: E402
                           refuse_real_run_without_registry, registry, run_batch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gce_eval.py", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--zone", default="us-central1-a", help="the zone to launch in (default us-central1-a)")
    p.add_argument("--image", default=None, help="boot image for a real run (must have podman)")
    args = p.parse_args(argv)
    if args.tasks < 1 or args.instances < 1 or args.slots < 1:
        p.error("--tasks, --instances and --slots must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from flowmesh_providers.gce.client import MAX_LAUNCH_BATCH, RATES
    plan = make_plan("gce", args.zone.rsplit("-", 1)[0], tasks=args.tasks, instances=args.instances,
                     slots=args.slots, task_minutes=args.task_minutes, rates=RATES, max_batch=MAX_LAUNCH_BATCH)
    print_plan(plan)
    if args.dry_run:
        return 0
    if args.emulator:
        from flowmesh_sdk.testing.gce import GceEmulator
        with GceEmulator(zones=(args.zone,)) as emu, registry(args) as reg:
            provider = emu.provider(ssh=True)
            try:
                return await run_batch("gce-eval", "gce", provider, args, reg)
            finally:
                await provider.close()
    if refuse_real_run_without_registry(args, "GCE"):
        return 2
    from flowmesh_providers.gce import GceProvider
    console.print("[yellow]a real run: instances are billed to your project[/]")
    provider = GceProvider(zones=[args.zone], ssh=True, **({"image": args.image} if args.image else {}))
    with registry(args) as reg:
        try:
            return await run_batch("gce-eval", "gce", provider, args, reg)
        finally:
            await provider.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
