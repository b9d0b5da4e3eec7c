#!/usr/bin/env python3
"""The main job's SWE-style batch in a persistent pool on Azure: VMs the ``azure`` provider
creates as long-running operations with deterministic names (NIC, disk and IP deleted with
the VM), reached over SSH with keys injected at launch (cloud-init ``customData``).

    python recipes/azure_persistent_pool.py --dry-run [--tasks 200 --instances 10]
    python recipes/azure_persistent_pool.py --emulator        # offline, nothing leaves this host
    AZURE_SUBSCRIPTION_ID=... python recipes/azure_persistent_pool.py --registry HOST:PORT   # a real run (billed)

``--dry-run`` makes no API call: the cheapest catalog size that fits (2 vCPUs, 4 GiB, the
``azure`` rows of ``flowmesh_sdk/catalog``), waves, hours, cost, and how long the declared
ARM write bucket takes to let the VMs through.  ``--emulator`` runs the batch against the
ARM emulator (``flowmesh_sdk.testing.azure``) with the real azure-mgmt clients: every VM
is a real OpenSSH sshd on a loopback address, booted from its customData.  A real run uses
``DefaultAzureCredential`` (docs/providers/azure.md) and needs a registry the VMs can pull
from (``--registry HOST:PORT``; without one it refuses before any API call, as a throw-away
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
    p = argparse.ArgumentParser(prog="azure_persistent_pool.py", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--location", default="eastus", help="the Azure location (default eastus)")
    p.add_argument("--resource-group", default="flowmesh", help="resource group (default flowmesh)")
    args = p.parse_args(argv)
    if args.tasks < 1 or args.instances < 1 or args.slots < 1:
        p.error("--tasks, --instances and --slots must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from flowmesh_providers.azure.client import RATES
    from flowmesh_providers.azure.provider import MAX_BATCH
    plan = make_plan("azure", args.location, tasks=args.tasks, instances=args.instances, slots=args.slots,
                     task_minutes=args.task_minutes, rates=RATES, max_batch=MAX_BATCH)
    print_plan(plan)
    if args.dry_run:
        return 0
    if args.emulator:
        from flowmesh_sdk.testing.azure import AzureEmulator
        with AzureEmulator(locations=(args.location,)) as emu, registry(args) as reg:
            provider = emu.provider(ssh=True, resource_group=args.resource_group)
            try:
                return await run_batch("azure-pool", "azure", provider, args, reg)
            finally:
                await provider.close()
    if refuse_real_run_without_registry(args, "Azure"):
        return 2
    from flowmesh_providers.azure import AzureProvider
    console.print("[yellow]a real run: VMs are billed to your subscription[/]")
    provider = AzureProvider(locations=[args.location], resource_group=args.resource_group, ssh=True)
    with registry(args) as reg:
        try:
            return await run_batch("azure-pool", "azure", provider, args, reg)
        finally:
            await provider.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
