#!/usr/bin/env python3
"""The main job's SWE-style batch on a Kubernetes cluster: an ephemeral pool whose every task
is a pod of the task's image (the ``k8s`` provider), optionally spilling over to a cloud or
this machine when the namespace is full.

    python recipes/k8s_eval.py --dry-run [--tasks 200 --instances 20]     # the plan; no API call
    python recipes/k8s_eval.py --emulator                                   # offline, nothing leaves this host
    python recipes/k8s_eval.py --emulator --quota-pods 1 --spill ec2        # a full namespace spills to EC2
    python recipes/k8s_eval.py --emulator --quota-pods 1 --spill local      # ... or to this machine
    python recipes/k8s_eval.py --context prod --namespace rl --registry HOST:PORT   # a real cluster

``--emulator`` runs the batch against the Kubernetes API emulator
(``flowmesh_sdk.testing.k8s``, pods as podman containers pulled from a throw-away registry
on 127.0.0.1) with the official client, through a kubeconfig of its own.  ``--quota-pods N``
gives the emulator's namespace a ResourceQuota of N pods; with ``--spill ec2`` the pool's
search space is the namespace, then EC2's us-east-1 (moto's server on 127.0.0.1: the
instances exist only as records, and their sandboxes run on this host, a stand-in said so
when it runs), and with ``--spill local`` this machine; the bidder's decisions are printed
(the free cluster first while it has room, the priced cloud when the quota is full).  A
real run reads your kubeconfig (``KUBECONFIG``, ``--context``, ``--namespace``) and needs a
registry its nodes can pull from (``--registry HOST:PORT``).

Exits 0 only when every verdict matches its expectation; 2 when a real run has no
``--registry``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cloud_recipe import (SPEC, add_common_args, console, launch_seconds,  # noqa: E402
                           refuse_real_run_without_registry, registry, run_batch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="k8s_eval.py", description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--context", default=None, help="the kubeconfig context (default: every context)")
    p.add_argument("--namespace", default=None, help="the namespace (default: the context's own)")
    p.add_argument("--price-per-cpu-hour", type=float, default=0.0,
                   help="what a vCPU-hour on the cluster costs you (default 0: your own cluster)")
    p.add_argument("--quota-pods", type=int, default=None,
                   help="with --emulator: a ResourceQuota of this many pods on the namespace")
    p.add_argument("--spill", choices=("ec2", "local"), default=None,
                   help="where the batch goes when the namespace is full: EC2 (with --emulator: moto) "
                        "or this machine")
    args = p.parse_args(argv)
    if args.tasks < 1 or args.instances < 1:
        p.error("--tasks and --instances must be at least 1")
    if args.quota_pods is not None and (args.quota_pods < 0 or not args.emulator):
        p.error("--quota-pods is for --emulator and must be >= 0")
    if args.spill == "ec2" and not args.emulator:
        p.error("--spill ec2 is for --emulator (EC2 on moto); a real run names its clouds with --spill local "
                "or its own pool")
    if args.price_per_cpu_hour < 0:
        p.error("--price-per-cpu-hour must be >= 0")
    return args


def print_plan(args: argparse.Namespace) -> None:
    from flowmesh_providers.k8s.client import RATES
    waves = math.ceil(args.tasks / args.instances)
    hours = waves * args.task_minutes / 60
    price = SPEC.cpus * args.price_per_cpu_hour
    console.print("dry run (k8s): no API call was made")
    console.print(f"{args.instances} pod(s) of {SPEC.cpus} vCPUs / {SPEC.memory_gb:g} GiB at a time; "
                  f"{args.tasks} tasks of {args.task_minutes:g} min -> {waves} wave(s) = {hours:.3f} h")
    console.print(f"estimated cost: {args.tasks} pod(s) x ${price:.4f}/h x {args.task_minutes / 60:.4f} h = "
                  f"${args.tasks * price * args.task_minutes / 60:.4f} (the price you configured per vCPU-hour)")
    console.print(f"launch: the client's buckets let {args.instances} pod(s) through in "
                  f"{launch_seconds(RATES, args.instances, 16):g} s")


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print_plan(args)
    if args.dry_run:
        return 0
    from flowmesh_providers.k8s import K8sProvider
    options = {"price_per_cpu_hour": args.price_per_cpu_hour}
    more = {}
    if args.spill == "local":
        from flowmesh_providers.local import LocalProvider
        more["local"] = LocalProvider()
    if args.emulator:
        from flowmesh_sdk.testing.k8s import KubeEmulator
        with contextlib.ExitStack() as stack:
            emu, reg = stack.enter_context(KubeEmulator()), stack.enter_context(registry(args))
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="fm-k8s-recipe-"))
            if args.spill == "ec2":
                from flowmesh_sdk.remote.local import LocalRunner
                from flowmesh_sdk.testing.moto import MotoEc2
                moto = stack.enter_context(MotoEc2())
                more["ec2"] = moto.provider(runner_factory=lambda inst: LocalRunner())
                console.print(f"EC2: moto at {moto.endpoint_url}. [bold reverse] STAND-IN [/] its instances exist "
                              "only as records; their sandboxes run on THIS host through LocalRunner")
            namespace = args.namespace or "default"
            if args.quota_pods is not None:
                from kubernetes import client
                client.CoreV1Api(emu.api_client()).create_namespaced_resource_quota(
                    namespace, {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": str(args.quota_pods)}}})
            provider = K8sProvider(kubeconfig=str(emu.kubeconfig(Path(tmp) / "kubeconfig", namespace=namespace)),
                                   **options)
            infra = [f"k8s/emu/{namespace}"] + [f"{n}/us-east-1" if n == "ec2" else n for n in more]
            try:
                return await run_batch("k8s-eval", "k8s", provider, args, reg, mode="ephemeral", infra=infra,
                                       more=more)
            finally:
                for prov in (provider, *more.values()):
                    await prov.close()
    if refuse_real_run_without_registry(args, "Kubernetes"):
        return 2
    console.print("[yellow]a real run: pods are created in your cluster[/]")
    provider = K8sProvider(contexts=[args.context] if args.context else None,
                           namespaces=[args.namespace] if args.namespace else None, **options)
    with registry(args) as reg:
        try:
            return await run_batch("k8s-eval", "k8s", provider, args, reg, mode="ephemeral",
                                   infra=["k8s"] + list(more), more=more)
        finally:
            await provider.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
