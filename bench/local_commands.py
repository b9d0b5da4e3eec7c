#!/usr/bin/env python3
"""The local runner's commands at concurrency: what each costs this process, and how long
the event loop is held, with the SDK's child watcher (a pidfd in the loop per child:
flowmesh_sdk.remote.children) beside Python 3.11's own (a thread per child, whose start the
loop waits for), in one run.

Every podman call of the local provider is such a command (a cold sandbox's ``run -i``, a
warm refill, a removal batch, an image check), so a burst of sandboxes makes dozens at
once.  Each round runs ``--concurrency`` commands (``true``) at once; the sides alternate,
each round in an interpreter of its own (the watcher is the process's), ``--rounds`` each.
Per side: this process's CPU per command (both sides' children cost the same), wall time
per command, and the p99 and largest lag of a 1 ms ticker in the same loop.

    python bench/local_commands.py [--concurrency 64] [--rounds 5]

Last line: ``local_cmd_cpu_ratio=<sdk over thread per child> local_cmd_wall_ratio=<the same>
loop_lag_max_ratio=<the same>`` (below 1: the SDK's costs less).  On Python 3.12 and later
both sides are asyncio's own pidfd watcher and the ratios are about 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

from rich.table import Table

from _common import console as bench_console

from flowmesh_sdk.remote.local import LocalRunner

SIDES = ("sdk", "thread")


async def _round(side: str, n: int) -> dict[str, float]:
    if side == "thread" and sys.version_info < (3, 12):
        asyncio.set_child_watcher(asyncio.ThreadedChildWatcher())   # chosen: the SDK keeps it
    runner = LocalRunner()
    await runner.run(["true"], timeout_s=30)   # unmeasured: imports, the watcher's set-up
    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    ticker = asyncio.ensure_future(tick())
    await asyncio.sleep(0.01)
    c0, t0 = time.process_time(), time.perf_counter()
    results = await asyncio.gather(*(runner.run(["true"], timeout_s=60) for _ in range(n)))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    done.set()
    await ticker
    if any(r.exit_code != 0 for r in results):
        raise SystemExit(f"a command failed: {next(r for r in results if r.exit_code)}")
    lags.sort()
    return {"cpu_ms": cpu * 1e3 / n, "wall_ms": wall * 1e3 / n,
            "lag_p99_ms": lags[int(0.99 * (len(lags) - 1))] * 1e3, "lag_max_ms": lags[-1] * 1e3}


def _in_own_process(side: str, n: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--side", side, "--concurrency", str(n)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"the {side} round failed: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)   # one round, as JSON (internal)
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.rounds < 1:
        p.error(f"--concurrency and --rounds must be 1 or more, got {args.concurrency} and {args.rounds}")
    if args.side:
        print(json.dumps(asyncio.run(_round(args.side, args.concurrency))))
        return 0
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            runs[side].append(_in_own_process(side, args.concurrency))
    med = {s: {k: statistics.median(r[k] for r in runs[s]) for k in runs[s][0]} for s in SIDES}
    console = bench_console()
    table = Table(title=f"{args.concurrency} local commands at once, median of {args.rounds} rounds "
                        f"(Python {sys.version.split()[0]})")
    for col in ("side", "host CPU ms/command", "wall ms/command", "loop lag p99 ms", "loop lag max ms"):
        table.add_column(col, justify="right")
    names = {"sdk": "SDK (pidfd in the loop)", "thread": "a thread per child"}
    for s in SIDES:
        m = med[s]
        table.add_row(names[s], f"{m['cpu_ms']:.3f}", f"{m['wall_ms']:.3f}", f"{m['lag_p99_ms']:.1f}",
                      f"{m['lag_max_ms']:.1f}")
    console.print(table)

    def ratio(k: str) -> float:
        return med["sdk"][k] / med["thread"][k]
    print(f"local_cmd_cpu_ratio={ratio('cpu_ms'):.3f} local_cmd_wall_ratio={ratio('wall_ms'):.3f} "
          f"loop_lag_max_ratio={ratio('lag_max_ms'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
