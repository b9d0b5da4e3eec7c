#!/usr/bin/env python3
"""Rent GPU offers on Vast.ai, start a vLLM worker on each, print their endpoints.

Vast instances are containers (the provider declares ``nested_containers=False``): the
worker is the instance's own process, vLLM's OpenAI-compatible server started by the
instance over SSH, not a container inside it.

``--dry-run`` prints the plan and makes no API call: the Vast.ai offers in the price
catalog (the shipped snapshot, or the cache ``flowmesh catalog refresh --provider vast``
writes) with at least ``--min-vram`` GiB per GPU, ranked by price, the ``--workers`` the
recipe would rent and what they cost an hour.

``--emulator`` runs it offline: the Vast.ai API is the emulator
(``flowmesh_sdk.testing.vast``; the real ``vastai`` client talks to it on 127.0.0.1), each
rented instance boots from its onstart as a loopback sshd host (the host key injected at
create and pinned), and the "vLLM" it starts over SSH is the named stand-in
``flowmesh_sdk.testing.fake_vllm`` (a TEST FIXTURE answering vLLM's routes; no model, no
GPU).  Offers are rented down the ranked list with failover (``--gone N`` takes the N
cheapest asks away between search and create, as another renter would), each worker is
health-checked and asked one completion, then every instance is destroyed.  Nothing leaves
this machine.

    python recipes/vast_vllm_workers.py --dry-run [--workers 4 --min-vram 24]
    python recipes/vast_vllm_workers.py --emulator [--workers 2 --gone 1]
    python recipes/vast_vllm_workers.py --emulator --elastic [--workers 2 --requests 12]

``--elastic`` runs the elastic loop (``flowmesh_sdk.workers.ElasticWorkers``) instead: a
burst of ``--requests`` makes it rent up to ``--workers`` interruptible workers by U, one is
outbid (the emulator's switch) while it holds requests and is replaced, its requests
re-dispatched, and once the queue is empty the idle workers are drained and released.

Exit status: 0 when every worker answered and nothing is left rented; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL
from flowmesh_sdk.specs import InstanceSpec

console = Console()
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def plan_rows(min_vram: float) -> list:
    rows = [r for r in Catalog.load(["vast"], warn=False).rows
            if r.gpus and r.on_demand_per_hour is not None and (r.gpu_memory_gb or 0) / r.gpus >= min_vram]
    return sorted(rows, key=lambda r: (r.on_demand_per_hour, -(r.reliability or 0)))


def dry_run(args: argparse.Namespace) -> int:
    rows = plan_rows(args.min_vram)
    t = Table(title=f"Vast.ai offers in the catalog with >= {args.min_vram:g} GiB per GPU (cheapest first)")
    for col in ("type", "region", "GPU GiB", "$/h", "source"):
        t.add_column(col)
    for r in rows[:10]:
        t.add_row(r.instance_type, r.region, f"{(r.gpu_memory_gb or 0):g}", f"{r.on_demand_per_hour:.3f}",
                  r.source[:50])
    console.print(t)
    chosen = rows[:args.workers]
    cost = sum(r.on_demand_per_hour or 0 for r in chosen)
    console.print(f"plan: rent {len(chosen)} of {len(rows)} offers, one vLLM worker ({MODEL}) each, "
                  f"${cost:.3f}/h together (storage and traffic not included)")
    console.print("dry run: no API call was made")
    return 0 if len(chosen) == args.workers else 1


async def emulator(args: argparse.Namespace) -> int:
    from flowmesh_sdk.control import InProcessBackend
    from flowmesh_sdk.provisioning import Provisioner, RetryPolicy
    from flowmesh_sdk.testing import fake_vllm
    from flowmesh_sdk.testing.vast import VastEmulator
    from flowmesh_sdk.workers import wait_until_healthy

    spec = InstanceSpec(cpus=4, memory_gb=16, gpus=1)
    fleet = f"vast-{uuid.uuid4().hex[:6]}"
    rows: list[dict[str, object]] = []
    # the emulated instances are this machine: their servers' logs go to a directory of the run's
    with tempfile.TemporaryDirectory(prefix="fm-engine-logs-") as logs, VastEmulator() as emu:
        vast = emu.provider(ssh=True, spot=False)
        try:
            offers = sorted((o for o in await vast.offers(spec)
                             if (o.gpu_memory_gb or 0) / max(1, o.gpus) >= args.min_vram),
                            key=lambda o: (o.price_per_hour or 0, -(o.reliability or 0)))
            for o in offers[:args.gone]:
                emu.gone(int(o.offer_id or 0))
            prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=3, backoff_s=0.01))
            used: set[str] = set()
            for n in range(args.workers):
                left = [o for o in offers if o.offer_id not in used]
                out = await prov.launch({"vast": vast}, left, spec, 1,
                                        {TAG_FLEET: fleet, TAG_POOL: "vllm", TAG_OWNER: "recipe"})
                (inst,) = out.instances
                used.add(str(out.offer.offer_id))
                for f in out.failovers:
                    console.print(f"[yellow]failover: {f.reason}: {f.error[:90]}[/]")
                host, _port = emu.address(inst)            # the instance's own address (loopback here)
                port = 18000 + n
                runner = vast.runner(inst)
                start = (f"nohup {sys.executable} {fake_vllm.__file__} serve {MODEL} --host {host} --port {port} "
                         f"> {logs}/vllm-{inst.id}.log 2>&1 &")
                await runner.run(["sh", "-c", start], timeout_s=30)
                base = f"http://{host}:{port}"
                async with httpx.AsyncClient() as client:
                    report = await wait_until_healthy(client, base, MODEL, timeout_s=30)
                    r = await client.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "hello",
                                                                          "max_tokens": 4})
                rows.append({"instance": inst.id, "offer": out.offer.offer_id, "gpu": out.offer.instance_type,
                             "price_per_hour": out.offer.price_per_hour, "endpoint": base,
                             "ready_s": round(report.waited_s if hasattr(report, "waited_s") else 0.0, 3),
                             "answer": r.json()["choices"][0]["text"], "failovers": len(out.failovers)})
                await runner.run(["sh", "-c", f"pkill -f 'fake_vllm.py serve {MODEL} --host {host} --port {port}'"
                                  " || true"], timeout_s=30)
            await vast.terminate([i.id for i in await vast.list_tagged({TAG_FLEET: fleet})])
            left_running = [i.id for i in await vast.list_tagged({TAG_FLEET: fleet})]
        finally:
            await vast.close()
    t = Table(title="vLLM workers on Vast.ai (emulated; the stand-in server)")
    for col in ("instance", "ask", "GPU", "$/h", "endpoint", "answer"):
        t.add_column(col)
    for row in rows:
        t.add_row(str(row["instance"]), str(row["offer"]), str(row["gpu"]), f"{row['price_per_hour']:.3f}",
                  str(row["endpoint"]), str(row["answer"]))
    console.print(t)
    ok = len(rows) == args.workers and not left_running and all(str(r["answer"]).startswith("ok:") for r in rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": ok, "workers": rows, "left_running": left_running}, indent=2))
    return 0 if ok else 1


async def elastic(args: argparse.Namespace) -> int:
    from flowmesh_sdk.bidder import ModelSpec
    from flowmesh_sdk.control.events import EventBus, EventKind
    from flowmesh_sdk.testing import fake_vllm
    from flowmesh_sdk.testing.vast import VastEmulator
    from flowmesh_sdk.workers import ClientLimits, ElasticWorkers, ScalingPolicy, ServeCommand

    bus = EventBus()
    sub = bus.subscribe()
    # the emulated instances are this machine: their engines' logs go to a directory of the run's
    logs = tempfile.TemporaryDirectory(prefix="fm-engine-logs-")
    engine = ServeCommand(("env", "FAKE_VLLM_DELAY_S=0.5", sys.executable, fake_vllm.__file__, "serve", "{model}",
                           "--host", "{host}", "--port", "{port}"), model=MODEL, port=18100, bind_host=None,
                          log_path=f"{logs.name}/engine-{{name}}.log")
    scaling = ScalingPolicy(max_workers=args.workers, target_queue_per_worker=3, scale_down_idle_s=0.5,
                            cooldown_s=0, interval_s=0.25, worker_concurrency=4, market="spot")
    lines: list[str] = []
    with logs, VastEmulator() as emu:
        vast = emu.provider(ssh=True)
        ew = ElasticWorkers(vast, InstanceSpec(cpus=4, memory_gb=16, gpus=1), ModelSpec(params_b=0.5, kv_cache_gb=4),
                            engine, scaling=scaling, bus=bus, fleet=f"vast-{uuid.uuid4().hex[:6]}", role="vllm",
                            owner="recipe", limits=ClientLimits(max_batch=1))
        try:
            await ew.start()
            calls = [asyncio.ensure_future(ew.complete(f"r{i}")) for i in range(args.requests)]
            ready = await bus.wait_for(lambda e: e.kind is EventKind.WORKER_READY, timeout_s=60)
            emu.outbid(next(w.instance.id for w in ew.workers.values() if w.name == ready.task_name and w.instance))
            answers = await asyncio.wait_for(asyncio.gather(*calls), 120)
            while ew.stats().ready or ew.stats().starting:   # the queue is empty: idle workers leave
                await bus.wait_for(lambda e: e.kind is EventKind.WORKER_RELEASED, timeout_s=60)
        finally:
            await ew.aclose()
            await vast.close()
        left_running = [r["id"] for r in emu.instances]
    while not sub.queue.empty():
        ev = sub.queue.get_nowait()
        if ev.kind in (EventKind.WORKERS_SCALED, EventKind.WORKER_RENTED, EventKind.WORKER_READY,
                       EventKind.WORKER_OUTBID, EventKind.WORKER_DRAINING, EventKind.WORKER_RELEASED):
            lines.append(f"{ev.kind.value:16} {ev.task_name or '':14} {ev.detail[:150]}")
    sub.close()
    for line in lines:
        console.print(line, markup=False, highlight=False)
    stats = ew.stats()
    ok = (all(a.text == f"ok:r{i}" for i, a in enumerate(answers)) and stats.lost >= 1 and not left_running
          and stats.answered == args.requests)
    console.print(f"answered {stats.answered}/{args.requests}, rented {stats.rented}, lost {stats.lost}, "
                  f"re-dispatched {stats.redispatched}, released {stats.released}; rent-to-ready "
                  + ", ".join(f"{lag.total_s:.2f} s" for lag in stats.lags))
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": ok, "answered": stats.answered, "rented": stats.rented,
                                               "lost": stats.lost, "redispatched": stats.redispatched,
                                               "released": stats.released, "left_running": left_running,
                                               "lags": [lag.total_s for lag in stats.lags]}, indent=2))
    return 0 if ok else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vast_vllm_workers.py", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--dry-run", action="store_true", help="print the plan; no API call")
    mode.add_argument("--emulator", action="store_true", help="rent on the Vast.ai emulator (offline)")
    p.add_argument("--workers", type=int, default=2, help="workers to rent (default 2)")
    p.add_argument("--min-vram", type=float, default=20.0, help="GiB per GPU at least (default 20)")
    p.add_argument("--gone", type=int, default=0, help="emulator: asks taken away between search and create")
    p.add_argument("--json", metavar="PATH", help="emulator: also write the workers as JSON")
    p.add_argument("--elastic", action="store_true", help="emulator: run the elastic loop (scale up, outbid, release)")
    p.add_argument("--requests", type=int, default=12, help="--elastic: requests in the burst (default 12)")
    args = p.parse_args(argv)
    if args.elastic and not args.emulator:
        p.error("--elastic needs --emulator")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    return await elastic(args) if args.elastic else await emulator(args)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
