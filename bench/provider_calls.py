#!/usr/bin/env python3
"""EC2 API calls per instance: launching, describing and terminating many instances
through the SDK against a naive loop, counted call by call against moto.

moto's EC2 server (``MotoEc2``, on 127.0.0.1) sits behind ``Ec2FaultProxy``, which
injects nothing here and counts the requests of each EC2 Action.  Both paths go through
the proxy, one after the other, and the counts of each phase are the difference of the
proxy's counters across it.

SDK path (the ``ec2`` provider under the core's ``Provisioner``, with its token buckets
from the provider's declared rates: RunInstances 5 calls burst, 2/s; 1000 instances
burst, 2/s):

1. launch: ``Provisioner.launch`` in batches of up to ``max_batch`` (1000), until
   ``--instances`` run.  Each batch is ONE ``RunInstances`` (MinCount = MaxCount = batch),
   preceded by the provider's idempotency check (one ``DescribeInstances`` filtered on
   the request tag) and, once per run, ``DescribeImages`` for the AMI;
2. describe: one ``list_tagged`` on the run's fleet tag (``DescribeInstances``, filtered,
   1000 per page);
3. teardown: ``terminate`` in chunks of 1000 ids (one ``TerminateInstances`` each),
   confirmed by one more ``list_tagged``.

The offers (``DescribeInstanceTypes``, cached per region) are fetched once before the
counts start; they are shown apart as setup.

Naive path (plain boto3, no SDK): per instance one ``RunInstances`` (MinCount = MaxCount
= 1), one ``DescribeInstances`` of its id, and one ``TerminateInstances`` of its id --
on ``--naive-instances`` instances (default 100, or ``--instances`` if fewer), and
extrapolated to ``--instances`` (they are one call of each Action per instance by
construction).  Why not all 1000 by default: each naive call goes through the counting
proxy, which stalls about 45 ms per request on a kept-alive connection (its handler
writes headers and body in two TCP segments with Nagle on, and the client delays its
ACK), so 3,000 naive calls would take about three minutes; ``--naive-instances 1000``
measures them all.

It prints the calls per Action of each phase, then calls per instance side by side, SDK
against naive, with the ratio, and what EC2's published RunInstances buckets would make
each path wait for the same number of instances.  The last line is exactly
``api_calls_per_instance=<x>``: (RunInstances + DescribeInstances calls) / instances
launched on the SDK path, launch and describe phases, three decimals.  Target <= 0.05.
It counts calls; the wall times are moto's and shown only for information.

    python bench/provider_calls.py [--instances 1000] [--naive-instances 100] [--batch 1000]

More than 1000 instances is refused: on EC2 each further 1000 waits 500 s for the
instance bucket to refill (2/s), and the SDK's buckets reproduce that wait faithfully.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from flowmesh_sdk.control.backend import InProcessBackend
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL
from flowmesh_sdk.provisioning import Provisioner
from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.ec2fault import Ec2FaultProxy
from flowmesh_sdk.testing.moto import MotoEc2
from flowmesh_providers.ec2 import Ec2Provider
from flowmesh_providers.ec2.client import DOC_THROTTLING

REGION = "us-east-1"
TARGET = 0.05
MAX_INSTANCES = 1000          # the RunInstances instance bucket (see the docstring)
NAIVE_DEFAULT = 100           # naive instances measured by default (see the docstring)
KEY_ACTIONS = ("RunInstances", "DescribeInstances", "TerminateInstances")

console = Console()
if not console.is_terminal:
    console = Console(width=160)


@dataclass
class Phase:
    name: str
    calls: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def n(self, *actions: str) -> int:
        return sum(self.calls[a] for a in actions)


class Meter:
    """Calls per Action across a block, from the proxy's counters."""

    def __init__(self, proxy: Ec2FaultProxy) -> None:
        self.proxy = proxy

    def phase(self, name: str) -> _Measure:
        return _Measure(self.proxy, Phase(name))


class _Measure:
    def __init__(self, proxy: Ec2FaultProxy, phase: Phase) -> None:
        self.proxy = proxy
        self.phase = phase

    def __enter__(self) -> Phase:
        self._before = self.proxy.calls
        self._t0 = time.monotonic()
        return self.phase

    def __exit__(self, *exc: object) -> None:
        self.phase.seconds = time.monotonic() - self._t0
        after = self.proxy.calls
        self.phase.calls = Counter({a: after[a] - self._before[a] for a in after
                                    if after[a] - self._before[a] > 0})


def _chunks(items: list[str], size: int) -> list[list[str]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


# --------------------------------------------------------------------------- #
# the two paths
# --------------------------------------------------------------------------- #

async def sdk_path(provider: Ec2Provider, meter: Meter, n: int, batch: int) -> tuple[Phase, ...]:
    spec = InstanceSpec(cpus=8, memory_gb=16)
    provisioner = Provisioner(InProcessBackend())
    fleet = f"bench-{uuid.uuid4().hex[:8]}"
    tags = {TAG_FLEET: fleet, TAG_POOL: "calls", TAG_OWNER: "bench"}
    with meter.phase("setup: offers") as setup:
        offers = await provider.offers(spec)
    with meter.phase("launch") as launch:
        ids: list[str] = []
        while len(ids) < n:
            out = await provisioner.launch({provider.name: provider}, offers, spec,
                                           min(batch, n - len(ids)), tags, request_prefix="bench")
            ids += [i.id for i in out.instances]
    with meter.phase("describe") as describe:
        listed = await provisioner.call(provider, REGION, "list",
                                        lambda: provider.list_tagged({TAG_FLEET: fleet}))
    if sorted(i.id for i in listed) != sorted(ids):
        raise SystemExit(f"list_tagged found {len(listed)} instances, launched {len(ids)}")
    with meter.phase("teardown") as teardown:
        for chunk in _chunks(ids, provider.capabilities.max_batch):
            await provisioner.call(provider, REGION, "terminate",
                                   lambda c=chunk: provider.terminate(c), instances=len(chunk))
        left = await provisioner.call(provider, REGION, "list",
                                      lambda: provider.list_tagged({TAG_FLEET: fleet}))
    if left:
        raise SystemExit(f"{len(left)} instances still alive after the SDK's teardown")
    return setup, launch, describe, teardown


def naive_path(moto: MotoEc2, proxy: Ec2FaultProxy, meter: Meter, n: int,
               instance_type: str) -> tuple[Phase, Phase]:
    client = moto.client(REGION, endpoint_url=proxy.endpoint_url)
    ami = moto.a_valid_ami(REGION)
    tag = [{"ResourceType": "instance", "Tags": [{"Key": TAG_FLEET, "Value": "bench-naive"}]}]
    ids: list[str] = []
    with meter.phase("launch + describe") as launch:
        for _ in range(n):
            resp = client.run_instances(ImageId=ami, InstanceType=instance_type, MinCount=1, MaxCount=1,
                                        TagSpecifications=tag)
            iid = resp["Instances"][0]["InstanceId"]
            client.describe_instances(InstanceIds=[iid])
            ids.append(iid)
    with meter.phase("teardown") as teardown:
        for iid in ids:
            client.terminate_instances(InstanceIds=[iid])
    return launch, teardown


# --------------------------------------------------------------------------- #
# reporting
# --------------------------------------------------------------------------- #

def calls_table(title: str, phases: tuple[Phase, ...], n: int) -> Table:
    actions = sorted({a for p in phases for a in p.calls})
    t = Table(title=title, title_justify="left")
    t.add_column("phase")
    for a in actions:
        t.add_column(a, justify="right")
    t.add_column("wall s (moto)", justify="right")
    for p in phases:
        t.add_row(p.name, *(str(p.calls[a]) for a in actions), f"{p.seconds:.1f}")
    t.caption = f"{n} instances"
    return t


def _ratio(naive: float, sdk: float) -> str:
    return f"{naive / sdk:.0f}x" if sdk > 0 else "-"


def _run_instances_wait(calls: int, instances: int) -> float:
    """Seconds EC2's RunInstances buckets (request 5 / 2 per s, instances 1000 / 2 per s,
    both full at the start) make the last of ``calls`` calls wait."""
    rates = Ec2Provider.capabilities.rates
    req = next(r for r in rates if r.api == "launch" and not r.per_instance)
    res = next(r for r in rates if r.api == "launch" and r.per_instance)
    return max(max(0.0, calls - req.burst) / req.rate_per_s, max(0.0, instances - res.burst) / res.rate_per_s)


def report(n: int, sdk: tuple[Phase, ...], naive_n: int, naive: tuple[Phase, Phase]) -> float:
    setup, launch, describe, teardown = sdk
    console.print(calls_table("SDK path: calls per Action", sdk, n))
    console.print(calls_table("naive path: calls per Action", naive, naive_n))
    sdk_ld = launch.n("RunInstances", "DescribeInstances") + describe.n("RunInstances", "DescribeInstances")
    sdk_ld_all = sum(launch.calls.values()) + sum(describe.calls.values())
    sdk_td = teardown.n("TerminateInstances", "DescribeInstances")
    nv_launch, nv_td = naive
    nv_ld = nv_launch.n("RunInstances", "DescribeInstances")
    nv_tdn = nv_td.n("TerminateInstances")
    x = sdk_ld / n
    per = Table(title="calls per instance, side by side", title_justify="left")
    for col in ("", "SDK", "naive", "naive / SDK"):
        per.add_column(col, justify="right" if col else "left")
    per.add_row("launch + describe (RunInstances + DescribeInstances)", f"{sdk_ld / n:.4f}",
                f"{nv_ld / naive_n:.4f}", _ratio(nv_ld / naive_n, sdk_ld / n))
    per.add_row("  every Action of launch + describe (incl. DescribeImages)", f"{sdk_ld_all / n:.4f}",
                f"{sum(nv_launch.calls.values()) / naive_n:.4f}",
                _ratio(sum(nv_launch.calls.values()) / naive_n, sdk_ld_all / n))
    per.add_row("teardown (TerminateInstances + DescribeInstances)", f"{sdk_td / n:.4f}",
                f"{nv_tdn / naive_n:.4f}", _ratio(nv_tdn / naive_n, sdk_td / n))
    per.add_row("RunInstances calls for the same number of instances",
                str(launch.calls["RunInstances"]), str(n * nv_launch.calls["RunInstances"] // naive_n), "")
    sdk_wait = _run_instances_wait(launch.calls["RunInstances"], n)
    nv_wait = _run_instances_wait(n * nv_launch.calls["RunInstances"] // naive_n, n)
    per.add_row("RunInstances wait on EC2's buckets (5 burst, 2 calls/s)", f"{sdk_wait:.1f} s",
                f"{nv_wait:.1f} s", "")
    console.print(per)
    if naive_n < n:
        console.print(f"naive path measured on {naive_n} instances and extrapolated to {n} "
                      "(one RunInstances, DescribeInstances and TerminateInstances per instance)")
    else:
        console.print(f"naive path measured on all {n} instances")
    console.print(f"setup (not counted above): {dict(setup.calls)} for the offers "
                  f"(DescribeInstanceTypes, cached per region)")
    console.print(f"SDK launch + describe: {launch.calls['RunInstances']} RunInstances + "
                  f"{launch.calls['DescribeInstances']} DescribeInstances (idempotency check per launch "
                  f"call) + {describe.calls['DescribeInstances']} DescribeInstances (list_tagged) = "
                  f"{sdk_ld} calls for {n} instances; rate limits from {DOC_THROTTLING}", soft_wrap=True)
    verdict = "MET" if x <= TARGET else "NOT MET"
    console.print(f"api_calls_per_instance = {sdk_ld} / {n} = {x:.3f} (target <= {TARGET}): {verdict}")
    return x


async def run(args: argparse.Namespace) -> float:
    with MotoEc2() as moto, Ec2FaultProxy(moto.endpoint_url) as proxy:
        console.print(f"moto EC2 at {moto.endpoint_url}, counting proxy at {proxy.endpoint_url}")
        provider = moto.provider(regions=[REGION], endpoint_url=proxy.endpoint_url)
        meter = Meter(proxy)
        try:
            t0 = time.monotonic()
            sdk = await sdk_path(provider, meter, args.instances, args.batch)
            console.print(f"SDK path: {args.instances} instances launched, listed and terminated in "
                          f"{time.monotonic() - t0:.1f} s")
            offer = (await provider.offers(InstanceSpec(cpus=8, memory_gb=16)))[0]
        finally:
            await provider.close()
        naive_n = args.naive_instances if args.naive_instances is not None else min(NAIVE_DEFAULT,
                                                                                         args.instances)
        t0 = time.monotonic()
        naive = await asyncio.to_thread(naive_path, moto, proxy, meter, naive_n, offer.instance_type)
        console.print(f"naive path: {naive_n} instances in {time.monotonic() - t0:.1f} s "
                      f"({offer.instance_type})")
        return report(args.instances, sdk, naive_n, naive)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=1000, help="SDK path instances (default 1000, "
                                                                f"at most {MAX_INSTANCES})")
    p.add_argument("--naive-instances", type=int, default=None,
                   help=f"naive path instances (default {NAIVE_DEFAULT}, or --instances if fewer); "
                        "extrapolated to --instances")
    p.add_argument("--batch", type=int, default=None,
                   help="instances per launch call (default and maximum: the provider's max_batch, 1000)")
    args = p.parse_args(argv)
    max_batch = Ec2Provider.capabilities.max_batch
    args.batch = args.batch or max_batch
    if not 1 <= args.instances <= MAX_INSTANCES:
        p.error(f"--instances must be in [1, {MAX_INSTANCES}]: beyond {MAX_INSTANCES} EC2's instance "
                "bucket refills at 2/s, so each further 1000 waits 500 s")
    if not 1 <= args.batch <= max_batch:
        p.error(f"--batch must be in [1, {max_batch}]")
    if args.naive_instances is not None and not 1 <= args.naive_instances <= args.instances:
        p.error("--naive-instances must be in [1, --instances]")
    if math.ceil(args.instances / args.batch) > 5:
        console.print(f"note: {math.ceil(args.instances / args.batch)} launch calls exceed the RunInstances "
                      "burst of 5; the SDK's bucket spaces the rest 0.5 s apart")
    x = asyncio.run(run(args))
    print(f"api_calls_per_instance={x:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
