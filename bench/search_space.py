#!/usr/bin/env python3
"""How the time to build and place a pool's search space grows with its entries: a
``PoolSpec`` with N entries, and ``fleet.pool`` over it, at N and 10 x N entries side by
side (issue 24, defect 14: 10,000 entries took 8.7 s to build and 17 s to place, 1,000
took 0.07 s).

Two search spaces, each N entries long:

* ``literal``: ``ec2/r<i>``, ``gce/r<i>/r<i>-a``, ``alibaba/cn-<i>*`` in turn (built only:
  placing it would need those clouds);
* ``wildcard``: entries that each match the one region of a simulated cloud ``alpha``
  with ``?`` in other places (``alpha/r?gion-...``), plus ``beta``; built, then placed by
  ``fleet.pool`` (an ephemeral pool: nothing is launched) on two simulated clouds
  (``providers/sim``, virtual time), so every entry is checked against the offers.

Each measurement is the median of ``--repeat`` runs.  Linear work gives a ratio near 10
(time at 10 x N over time at N); quadratic work near 100.  The wildcard space compiles one
pattern per distinct entry, so its times are larger, not steeper.

    python bench/search_space.py [--n 1000] [--repeat 3]

Last line: ``build_ratio=<literal> place_ratio=<wildcard fleet.pool>``, two decimals.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowmesh_sdk.sim import SimInstanceType, unlimited  # noqa: E402
from flowmesh_sdk.sim.loop import run  # noqa: E402
from flowmesh_sdk.sim.scenario import sim_clouds_fleet  # noqa: E402
from flowmesh_sdk import InstanceSpec, PoolSpec  # noqa: E402

REGION = "region-of-alpha-one"   # 19 characters: 2**19 distinct '?' patterns


def literal(n: int) -> tuple[str, ...]:
    return tuple(("ec2/r{0}", "gce/r{0}/r{0}-a", "alibaba/cn-{0}*")[i % 3].format(i) for i in range(n))


def wildcard(n: int) -> tuple[str, ...]:
    return tuple("alpha/" + "".join("?" if m >> i & 1 else c for i, c in enumerate(REGION))
                 for m in range(n)) + ("beta",)


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def place(infra: tuple[str, ...]) -> float:
    """Seconds (wall) inside ``fleet.pool`` for a pool over ``infra``."""
    spec = PoolSpec(name="bench", mode="ephemeral", infra=infra, instance=InstanceSpec(cpus=2, memory_gb=4),
                    max_instances=1)

    async def main() -> float:
        a = unlimited("alpha", (SimInstanceType("a.2x", 2, 4, 0.10),), region=REGION)
        b = unlimited("beta", (SimInstanceType("b.2x", 2, 4, 0.12),), region="b-1")
        with tempfile.TemporaryDirectory(prefix="fm-bench-space-") as home:
            async with sim_clouds_fleet((a, b), {}, home=home) as (fleet, _):
                t = time.perf_counter()
                pool = await fleet.pool(spec)
                took = time.perf_counter() - t
                await pool.drain()
                return took
    return run(main())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="the smaller size (the larger is 10 x N)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    small, large = args.n, 10 * args.n
    place(wildcard(10))   # imports and first-use caches
    rows = []
    for name, make in (("literal: PoolSpec", literal), ("wildcard: PoolSpec", wildcard)):
        a = timed(lambda: PoolSpec(name="p", infra=make(small)), args.repeat)
        b = timed(lambda: PoolSpec(name="p", infra=make(large)), args.repeat)
        rows.append((name, a, b))
    a = statistics.median(place(wildcard(small)) for _ in range(args.repeat))
    b = statistics.median(place(wildcard(large)) for _ in range(args.repeat))
    rows.append(("wildcard: fleet.pool", a, b))
    print(f"{'':24} {f'N={small:,}':>12} {f'N={large:,}':>12} {'ratio':>8}")
    for name, a, b in rows:
        print(f"{name:24} {a * 1000:10.1f}ms {b * 1000:10.1f}ms {b / a:8.2f}")
    print("linear work: ratio near 10; quadratic: near 100")
    print(f"build_ratio={rows[0][2] / rows[0][1]:.2f} place_ratio={rows[2][2] / rows[2][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
