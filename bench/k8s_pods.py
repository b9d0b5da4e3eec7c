#!/usr/bin/env python3
"""Sandboxes as pods, against kubectl on the same emulated cluster, side by side in one run.

On the Kubernetes API emulator (``flowmesh_sdk.testing.k8s``: pods are podman containers of
the project's busybox image, pulled once from a throw-away registry on 127.0.0.1), with an
ephemeral pool of the ``k8s`` provider (the official client) and kubectl (1.31 or newer: its
exec speaks WebSocket) through the same kubeconfig:

(a) API requests per sandbox: every request the emulator served (``emu.counts()``) while the
    pool ran ``--n`` sandboxes of one command each, divided by ``--n`` (the namespace's watch
    and its NetworkPolicies, made once, are in it);
(b) a command round trip: ``sandbox.exec("true")`` over the sandbox's held exec stream,
    against ``kubectl exec POD -- true`` on the same pod (a process, a TLS handshake and one
    API exec each);
(c) time to first command: ``pool.sandbox(...)`` until its first ``exec("true")`` returns,
    against ``kubectl run --rm -i --restart=Never --image IMAGE -- true`` (kubectl's own
    create, attach and delete): from a persistent pool of warm pods (``warm_images``: the
    pod stocked READY with its stream open before the task, replaced after it;
    ``flowmesh_sdk.pools.warm_pods``) and, beside it, a fresh pod of the ephemeral pool
    (create, schedule, run, the exec stream);
(d) ``--burst`` sandboxes asked for at once (default 256): p50 and p99 of each one's time
    to first command, on nodes big enough to take them all.

Samples alternate between the two sides.  Last line: ``k8s_api_calls_per_sandbox=<a>
k8s_exec_ratio=<b> k8s_ttfc_ratio=<c, warm> k8s_cold_ttfc_ratio=<c, fresh>
burst256_p50_s=... burst256_p99_s=<d>`` (ratios: FlowMesh p50 / kubectl p50), against the
targets 3, 0.05, 0.05 and none.

    python bench/k8s_pods.py [--n 10] [--burst 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import busybox_image, console, pct  # noqa: E402

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec  # noqa: E402


def _kubectl(env: dict[str, str], *args: str) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"kubectl {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=10, help="samples per measurement (default 10)")
    p.add_argument("--burst", type=int, default=256, help="sandboxes asked for at once (default 256)")
    args = p.parse_args(argv)
    if args.n < 1 or args.burst < 1:
        p.error("--n and --burst must be at least 1")
    if shutil.which("kubectl") is None:
        raise SystemExit("kubectl is not installed (apt-get install -y kubernetes-client, or kubectl >= 1.31)")
    from flowmesh_providers.k8s import K8sProvider
    from flowmesh_sdk.registry.local import LocalRegistry
    from flowmesh_sdk.testing.k8s import KubeEmulator, Node

    out = console()
    big = tuple(Node(f"bench-node-{i}", cpu="256", memory="512Gi", pods=str(args.burst + 16)) for i in (1, 2))
    with LocalRegistry() as reg, KubeEmulator(nodes=big) as emu, \
            tempfile.TemporaryDirectory(prefix="fm-k8s-bench-") as tmp:
        image = reg.push(busybox_image(), "flowmesh/busybox:bench")
        kubeconfig = emu.kubeconfig(Path(tmp) / "kubeconfig")
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), HOME=tmp, KUBECACHEDIR=str(Path(tmp) / "cache"),
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        spec = SandboxSpec(image=image, cpus=0.1, memory_gb=0.0625)
        prov = K8sProvider(kubeconfig=str(kubeconfig), schedule_timeout_s=300)
        async with Fleet("k8s-bench", home=Path(tmp) / "home", providers={"k8s": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="bench", mode="ephemeral", provider="k8s",
                                             instance=InstanceSpec(cpus=1, memory_gb=1), max_instances=args.burst,
                                             heartbeat_s=None))
            async with pool.sandbox(spec) as sb:      # unmeasured: the image pulled, the watch up
                await sb.exec("true")
            _kubectl(env, "run", "fm-warmup", "--rm", "-i", "--restart=Never", f"--image={image}", "--", "true")

            # (a) and (c): fresh sandboxes, one command each, counted; kubectl run alternating
            ttfc, ttfc_kubectl, per_sandbox = [], [], []
            for i in range(args.n):
                emu.reset_counts()
                t0 = time.perf_counter()
                async with pool.sandbox(spec) as sb:
                    await sb.exec("true")
                    ttfc.append(time.perf_counter() - t0)
                per_sandbox.append(float(sum(emu.counts().values())))   # its delete included
                ttfc_kubectl.append(_kubectl(env, "run", f"fm-run-{i}", "--rm", "-i", "--restart=Never",
                                             f"--image={image}", "--", "true"))
            calls = pct(per_sandbox, 50)

            # (c) warm pods: a stocked pod per sample (its replacement made unmeasured)
            warm_pool = await fleet.pool(PoolSpec(name="warm", mode="persistent", provider="k8s",
                                                  instance=InstanceSpec(cpus=1, memory_gb=1), max_instances=2,
                                                  warm_images=(image,), heartbeat_s=None))
            ttfc_warm = []
            for i in range(args.n):
                while warm_pool.stats().warm < 1:
                    await asyncio.sleep(0.01)
                t0 = time.perf_counter()
                async with warm_pool.sandbox(image=image) as sb:
                    await sb.exec("true")
                    ttfc_warm.append(time.perf_counter() - t0)
                ttfc_kubectl.append(_kubectl(env, "run", f"fm-warm-{i}", "--rm", "-i", "--restart=Never",
                                             f"--image={image}", "--", "true"))
            await warm_pool.drain()

            # (b) a command round trip on one pod
            async with pool.sandbox(spec) as sb:
                pod = pool.instances[sb.instance_id].instance.address
                rtt, rtt_kubectl = [], []
                for _ in range(args.n):
                    t0 = time.perf_counter()
                    await sb.exec("true")
                    rtt.append(time.perf_counter() - t0)
                    rtt_kubectl.append(_kubectl(env, "exec", str(pod), "--", "true"))

            # (d) the burst
            firsts: list[float] = []

            async def one() -> None:
                t0 = time.perf_counter()
                async with pool.sandbox(spec) as sb:
                    await sb.exec("true")
                    firsts.append(time.perf_counter() - t0)

            t_burst = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(args.burst)))
            burst_wall = time.perf_counter() - t_burst
        await prov.close()

    exec_ratio = pct(rtt, 50) / pct(rtt_kubectl, 50)
    ttfc_ratio = pct(ttfc_warm, 50) / pct(ttfc_kubectl, 50)
    cold_ratio = pct(ttfc, 50) / pct(ttfc_kubectl, 50)
    out.print(f"API requests per sandbox (p50 of {args.n}): {calls:g} (target <= 3)")
    out.print(f"command round trip: held stream p50 {pct(rtt, 50) * 1e3:.2f} ms, kubectl exec p50 "
              f"{pct(rtt_kubectl, 50) * 1e3:.1f} ms -> {exec_ratio:.4f} (target <= 0.05)")
    out.print(f"time to first command: warm pod p50 {pct(ttfc_warm, 50) * 1e3:.1f} ms, fresh pod p50 "
              f"{pct(ttfc, 50):.3f} s, kubectl run --rm -i p50 {pct(ttfc_kubectl, 50):.3f} s -> warm "
              f"{ttfc_ratio:.4f} (target <= 0.05), fresh {cold_ratio:.3f}")
    out.print(f"burst of {args.burst}: time to first command p50 {pct(firsts, 50):.2f} s, p99 {pct(firsts, 99):.2f} s, "
              f"all done in {burst_wall:.1f} s")
    out.print(f"k8s_api_calls_per_sandbox={calls:g} k8s_exec_ratio={exec_ratio:.4f} k8s_ttfc_ratio={ttfc_ratio:.4f} "
              f"k8s_cold_ttfc_ratio={cold_ratio:.3f} "
              f"burst{args.burst}_p50_s={pct(firsts, 50):.2f} burst{args.burst}_p99_s={pct(firsts, 99):.2f}",
              soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
