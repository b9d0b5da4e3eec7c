#!/usr/bin/env python3
"""Result reuse on one RL step: how many reward evaluations really run when many rollouts
end in the same patch.

The step has MegaFlow's shape: 64 tasks x 16 rollouts = 1,024 reward evaluations
(MegaFlow, Appendix D: "1,024 parallel SWE environments per training step (64 distinct
instances x 16 independent rollout replicas)"; summarised in shared/seeds/000_*.txt).
Each rollout ends in a patch; a reward evaluation runs the task's test on it.  A seeded
share of the rollouts (``--dup-share``, default 0.5 -- an assumption, not a measured
figure) ends in one of two patches common to its task (the right fix, a common wrong
fix); the others end in a patch of their own (``--unique-right`` of those fix the bug
another way).  Every evaluation is a deterministic task (same image digest, patch and
command -> same verdict), and a failing test is a verdict, so ``cache_failures`` is on.

1. **Real, reduced size** (``--tasks 8 --rollouts 4``): on the local provider, a
   persistent pool of busybox sandboxes.  (a) every evaluation run through the pool
   (no reuse); (b) the same evaluations, all at once, through ``ResultReuse`` over a
   fresh local CAS.  Every result (b) got by reuse (a hit or a join) is compared with
   the fresh run (a) of the same evaluation: exit code, stdout and stderr must be
   byte-identical.
2. **Full size on the fleet simulator** (64 x 16): the same generator through the real
   reuse layer and a real local CAS over a real persistent pool on simulated EC2
   (``providers/sim``, virtual time: each evaluation runs ``--eval-minutes`` simulated
   minutes and exits with the verdict its patch earns).  The step runs twice, without
   and with reuse, so the dollars both cost are printed side by side, and every reused
   result is compared with the fresh run of the same evaluation.

The target is executions = distinct tasks, and no wrong reuse.  The last line is exactly
``executions_saved_pct=<x> wrong_reuse=<n>``: x is the share of the 1,024 evaluations
that did not run (full size), n the reused results that differ from a fresh run (both
parts).  The exit status is 1 if executions != distinct tasks or n > 0.

    python bench/dedup_rl_step.py [--tasks 8] [--rollouts 4] [--full-tasks 64]
                                  [--full-rollouts 16] [--dup-share 0.5] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from _common import busybox_image  # bench/_common.py (the script's folder is on sys.path)

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task, TaskResult
from flowmesh_sdk.cas import LocalDirStore
from flowmesh_sdk.identity import task_identity
from flowmesh_sdk.reuse import ResultReuse, ReusePolicy
from flowmesh_sdk.specs import ExecResult, ReuseKind
from flowmesh_providers.local import LocalProvider
from flowmesh_providers.sim import ec2
from flowmesh_sdk.sim import SimInstanceType
from flowmesh_sdk.sim import loop as sim_loop
from flowmesh_sdk.sim.scenario import REGISTRY, SimResolver, sim_fleet

console = Console()
if not console.is_terminal:
    console = Console(width=150)

TEST_SH = b"""cp -r /work/repo /tmp/r && sed -i -f /work/patch.sed /tmp/r/fn.sh && . /tmp/r/fn.sh \\
  && [ "$(f 3)" = "$(cat /work/expect)" ] && echo PASS && exit 0
echo FAIL; exit 1
"""
RIGHT = "s/ - 1 ))/ ))/\n"
COMMON_WRONG = "s/ - 1 ))/ + 1 ))/\n"
#: the evaluation image in the simulated registry (the full-size part)
SIM_IMAGE = "sim/swe-eval:1"
SIM_IMAGE_BYTES = 2 * 10**9


# --------------------------------------------------------------------------- #
# the step
# --------------------------------------------------------------------------- #

@dataclass(frozen=True)
class Evaluation:
    task: int
    rollout: int
    patch: str
    expect_pass: bool


def make_step(tasks: int, rollouts: int, dup_share: float, unique_right: float, seed: int) -> list[Evaluation]:
    """The patches a step's rollouts end in, from a seeded generator."""
    rng = random.Random(seed)
    out = []
    for t in range(tasks):
        for r in range(rollouts):
            if rng.random() < dup_share:
                right = rng.random() < 0.5
                patch = RIGHT if right else COMMON_WRONG
            else:
                right = rng.random() < unique_right
                tag = f"# rollout {t}.{r} {rng.getrandbits(32):08x}\n"
                patch = ("s/ - 1 ))/ - 0 ))/\n" if right else "s/ - 1 ))/ - 2 ))/\n") + tag
            out.append(Evaluation(t, r, patch, right))
    return out


def evaluation_task(ev: Evaluation, image: str) -> Task:
    fn = f"f() {{ echo $(( $1 * 2 + {ev.task} - 1 )); }}\n".encode()
    return Task(name=f"reward-{ev.task}-{ev.rollout}",
                sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.25),
                command="sh /work/test.sh",
                files={"/work/repo/fn.sh": fn, "/work/test.sh": TEST_SH,
                       "/work/expect": f"{6 + ev.task}".encode(), "/work/patch.sed": ev.patch.encode()},
                timeout_s=60, deterministic=True)


def same_bytes(a: ExecResult | None, b: ExecResult | None) -> bool:
    return (a is not None and b is not None and (a.exit_code, a.stdout, a.stderr, a.timed_out)
            == (b.exit_code, b.stdout, b.stderr, b.timed_out))


def distinct(tasks: list[Task], digest: str) -> int:
    return len({task_identity(t, digest).h_task for t in tasks})


# --------------------------------------------------------------------------- #
# 1. real, reduced size
# --------------------------------------------------------------------------- #

async def real_part(args: argparse.Namespace, image: str) -> dict[str, float]:
    step = make_step(args.tasks, args.rollouts, args.dup_share, args.unique_right, args.seed)
    tasks = [evaluation_task(ev, image) for ev in step]
    with tempfile.TemporaryDirectory(prefix="fm-dedup-") as tmp:
        home = Path(tmp)
        provider = LocalProvider(state_dir=home / "local" / "instances")
        async with Fleet("dedup-bench", home=home, providers={"local": provider}) as fleet:
            pool = await fleet.pool(PoolSpec(name="rewards", instance=InstanceSpec(cpus=2, memory_gb=2),
                                             min_instances=1, max_instances=1,
                                             sandboxes_per_instance=4, warm_per_image=0))
            digest = (await fleet.images.resolve(image)).digest
            t0 = time.monotonic()
            fresh = await pool.map(tasks)
            t_fresh = time.monotonic() - t0
            reuse = ResultReuse(LocalDirStore(home / "cas"), resolver=fleet.images, bus=fleet.bus,
                                fleet=fleet.name, policy=ReusePolicy(cache_failures=True))
            t0 = time.monotonic()
            reused = await asyncio.gather(*(reuse.run(t, pool) for t in tasks))
            t_reuse = time.monotonic() - t0
    bad_verdicts = sum((r.result is None or (r.result.exit_code == 0) != ev.expect_pass)
                       for r, ev in zip(fresh, step))
    shared = [(f, r) for f, r in zip(fresh, reused) if r.reuse in (ReuseKind.HIT, ReuseKind.JOINED)]
    wrong = sum(not same_bytes(f.result, r.result) for f, r in shared)
    c = reuse.counts()
    n_distinct = distinct(tasks, digest)
    table = Table(title=f"1. real: {args.tasks} tasks x {args.rollouts} rollouts on the local provider "
                        f"({image})")
    for col in ("", "requested", "executed", "hits", "joins", "distinct tasks", "wall s"):
        table.add_column(col, justify="right")
    table.add_row("(a) no reuse", str(len(tasks)), str(len(fresh)), "-", "-", str(n_distinct), f"{t_fresh:.2f}")
    table.add_row("(b) ResultReuse", str(len(tasks)), str(c.executions), str(c.hits), str(c.joins),
                  str(n_distinct), f"{t_reuse:.2f}")
    console.print(table)
    console.print(f"reused results checked against a fresh run: {len(shared)}, byte-identical: "
                  f"{len(shared) - wrong}; verdicts as expected: {len(fresh) - bad_verdicts}/{len(fresh)}")
    console.print(f"real: executions {c.executions} of {len(tasks)} requested "
                  f"(saved {100 * (1 - c.executions / len(tasks)):.1f}%), wall time ratio "
                  f"reuse/no-reuse = {t_reuse / t_fresh:.3f}")
    return {"requested": len(tasks), "executed": c.executions, "distinct": n_distinct, "wrong": wrong,
            "bad_verdicts": bad_verdicts}


# --------------------------------------------------------------------------- #
# 2. counted, full size
# --------------------------------------------------------------------------- #

def sim_task(ev: Evaluation, eval_s: float) -> Task:
    """The evaluation as a simulated machine runs it: the same files (so the same H_task
    for the same patch), and a command that runs ``eval_s`` simulated seconds and exits
    with the verdict the patch earns (0: the test passes)."""
    real = evaluation_task(ev, f"{REGISTRY}/{SIM_IMAGE}")
    return Task(name=real.name, sandbox=SandboxSpec(image=real.sandbox.image, cpus=1, memory_gb=1),
                command=f"sim-work {eval_s:g} {0 if ev.expect_pass else 1}", files=real.files,
                timeout_s=eval_s * 2, deterministic=True)


async def _sim_step(tasks: list[Task], reuse_on: bool, home: str) -> tuple[list[TaskResult], float, int, object]:
    """One RL step's evaluations in a persistent pool on simulated EC2 (8 sandboxes per
    c5.2xlarge), with or without the reuse layer: (results, dollars, executions, counts)."""
    cloud = ec2((SimInstanceType("c5.2xlarge", 8, 16, 0.34, nic_gbps=0.1),))
    async with sim_fleet(cloud, {SIM_IMAGE: SIM_IMAGE_BYTES}, home=home) as (fleet, prov):
        pool = await fleet.pool(PoolSpec(name="rewards", provider="ec2", mode="persistent",
                                         instance=InstanceSpec(cpus=8, memory_gb=16),
                                         max_instances=-(-len(tasks) // 8), sandboxes_per_instance=8,
                                         warm_per_image=0))
        if reuse_on:
            reuse = ResultReuse(LocalDirStore(f"{home}/cas"), resolver=fleet.images, bus=fleet.bus, fleet="sim",
                                policy=ReusePolicy(cache_failures=True))
            results = list(await asyncio.gather(*(reuse.run(t, pool) for t in tasks)))
            counts: object = reuse.counts()
            executed = reuse.counts().executions
        else:
            results = await pool.map(tasks)
            counts, executed = None, len(tasks)
        await pool.drain()
        return results, prov.cost(), executed, counts


def counted_part(args: argparse.Namespace) -> dict[str, float]:
    """Full size on the fleet simulator: the real reuse layer over a real persistent pool on
    simulated EC2 (virtual time), once without reuse and once with it."""
    step = make_step(args.full_tasks, args.full_rollouts, args.dup_share, args.unique_right, args.seed)
    tasks = [sim_task(ev, args.eval_minutes * 60) for ev in step]
    with tempfile.TemporaryDirectory(prefix="fm-dedup-sim-") as tmp:
        fresh, cost_fresh, _, _ = sim_loop.run(_sim_step(tasks, False, f"{tmp}/a"))
        reused, cost_reuse, executed, c = sim_loop.run(_sim_step(tasks, True, f"{tmp}/b"))
    wrong = sum(not same_bytes(r.result, f.result) for r, f in zip(reused, fresh)
                if r.reuse in (ReuseKind.HIT, ReuseKind.JOINED))
    digest = SimResolver.digest(SIM_IMAGE)
    n_distinct = distinct(tasks, digest)
    table = Table(title=f"2. full size on the fleet simulator: {args.full_tasks} tasks x {args.full_rollouts} "
                        f"rollouts, {args.eval_minutes:g}-minute evaluations, persistent pool on simulated EC2")
    for col in ("requested", "executed", "hits", "joins", "distinct tasks", "executions = distinct",
                "$ without reuse", "$ with reuse"):
        table.add_column(col, justify="right")
    table.add_row(str(len(tasks)), str(executed), str(c.hits), str(c.joins), str(n_distinct),  # type: ignore[attr-defined]
                  "yes" if executed == n_distinct else "NO", f"{cost_fresh:.2f}", f"{cost_reuse:.2f}")
    console.print(table)
    console.print(f"reused results compared with the fresh run of the same evaluation: "
                  f"{c.hits + c.joins}, wrong: {wrong}")  # type: ignore[attr-defined]
    return {"requested": len(tasks), "executed": executed, "distinct": n_distinct, "wrong": wrong}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dedup_rl_step.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=8, help="real part: tasks (default 8)")
    p.add_argument("--rollouts", type=int, default=4, help="real part: rollouts per task (default 4)")
    p.add_argument("--full-tasks", type=int, default=64, help="counted part: tasks (default 64)")
    p.add_argument("--full-rollouts", type=int, default=16, help="counted part: rollouts (default 16)")
    p.add_argument("--dup-share", type=float, default=0.5,
                   help="share of rollouts ending in one of their task's two common patches")
    p.add_argument("--unique-right", type=float, default=0.3,
                   help="share of the other rollouts whose own patch fixes the bug")
    p.add_argument("--eval-minutes", type=float, default=5.0,
                   help="simulated part: minutes one reward evaluation runs (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image", default=None, help="sandbox image (default: busybox, built if missing)")
    p.add_argument("--skip-real", action="store_true", help="only the counted part")
    args = p.parse_args(argv)
    for name in ("dup_share", "unique_right"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            p.error(f"--{name.replace('_', '-')} must be in [0, 1]")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ok = True
    wrong = 0
    if not args.skip_real:
        real = await real_part(args, args.image or busybox_image())
        wrong += int(real["wrong"])
        ok &= real["executed"] == real["distinct"] and real["bad_verdicts"] == 0
    counted = await asyncio.to_thread(counted_part, args)   # its own virtual-time loop
    wrong += int(counted["wrong"])
    ok &= counted["executed"] == counted["distinct"]
    saved = 100.0 * (1 - counted["executed"] / counted["requested"])
    console.print(f"executions: {counted['executed']} performed of {counted['requested']} requested "
                  f"({counted['distinct']} distinct); target executions = distinct, wrong_reuse = 0: "
                  f"{'MET' if ok and wrong == 0 else 'NOT MET'}")
    print(f"executions_saved_pct={saved:.1f} wrong_reuse={wrong}")
    return 0 if ok and wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
