#!/usr/bin/env python3
"""Two tenants run variants of one RL step that share steps: each shared step runs once.

Each tenant's step is a workflow of operators (``flowmesh_sdk.workflows``)::

    rollout-T-S  (sandbox, pool "rollouts", seeded)   -> a patch on stdout
        -> test-T-S   (sandbox, pool "tests", deterministic) -> PASS / FAIL
            -> reward-T-S   (in-process call, the tenant's reward function)
                -> advantages-T  (in-process call: the task's group of rewards, GRPO-style)

* The rollout is a POLICY STAND-IN, not a model: a shell script in the sandbox picks one
  of the task's candidate patches from (task, seed), so different seeds often end in
  the same patch, as rollouts of a real policy do.  A real loop would make the rollout
  an inference operator (``wf.inference``) calling the policy's GPU endpoint; the seed
  would pin its sampling.
* The test applies the patch (a sed script) to the task's code and runs its check, in a
  busybox sandbox; the verdict is known in advance, so the run checks itself.
* alice runs ``grpo-binary`` (reward 1 / 0) with 4 rollouts per task; bob runs
  ``grpo-shaped`` (reward 1 / -0.5) with 6: bob's first 4 rollouts per task are alice's
  (same policy, same seeds), and every test of a patch already tested is shared too.
  Rewards and advantages differ by variant, so they run for each tenant.

Both workflows run at once through the fleet's reuse layer (``fleet.results``): work in
flight is joined, work already done is a hit.  The run succeeds when every verdict is the
expected one, no identical work ran twice, and bob's shared steps were reused.  Results
go to a throw-away content-addressable store unless ``--cas DIR`` names one (then a second
run is all hits).  ``flowmesh status`` shows the hits, joins and executions afterwards.

    python recipes/rl_reuse_two_tenants.py [--tasks 4] [--rollouts-a 4] [--rollouts-b 6]
                                          [--sequential] [--cas DIR] [--image REF] [--json PATH]

Importable too: ``await main(["--tasks", "2"])`` returns the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec
from flowmesh_sdk.cas import LocalDirStore
from flowmesh_sdk.identity import label_digest
from flowmesh_sdk.reuse import ResultReuse, ReusePolicy
from flowmesh_sdk.specs import ReuseKind
from flowmesh_sdk.workflows import Workflow, WorkflowRun

console = Console()
if not console.is_terminal:
    console = Console(width=160)

# one task: f(x) = 2x + t - 1 has a stray "- 1"; the check wants f(3) = 6 + t
CANDIDATES = (                       # (sed script, fixes the bug?)
    ("s/ - 1 ))/ ))/", True),
    ("s/ - 1 ))/ + 0 ))/", True),
    ("s/ - 1 ))/ + 1 ))/", False),
    ("s/ \\* 2 / * 3 /", False),
    ("s/x/x/", False),               # changes nothing
)
POLICY_SH = """# POLICY STAND-IN: pick candidate number hash(TASK, SEED) mod N
i=$(( (SEED * 40503 + TASK * 977 + 11) % 65521 % $(wc -l < /work/candidates) + 1 ))
sed -n "${i}p" /work/candidates
"""
TEST_SH = """cp -r /work/repo /tmp/r && sed -i -f /work/patch.sed /tmp/r/fn.sh && . /tmp/r/fn.sh \\
  && [ "$(f 3)" = "$(cat /work/expect)" ] && echo PASS && exit 0
echo FAIL
"""
REWARD_IMPL = label_digest("rl-reuse-two-tenants/reward@1")
ADVANTAGE_IMPL = label_digest("rl-reuse-two-tenants/advantages@1")
VARIANTS = {"binary": (1.0, 0.0), "shaped": (1.0, -0.5)}   # reward on PASS, on FAIL


def picked(task: int, seed: int) -> int:
    """The candidate POLICY_SH picks (the same arithmetic, in Python), for the checks."""
    return (seed * 40503 + task * 977 + 11) % 65521 % len(CANDIDATES)


def reward(variant: str):
    on_pass, on_fail = VARIANTS[variant]

    def fn(inputs) -> bytes:
        return json.dumps(on_pass if inputs["verdict"].strip() == b"PASS" else on_fail).encode()
    return fn


def advantages(inputs) -> bytes:
    rewards = [json.loads(inputs[k]) for k in sorted(inputs, key=lambda k: int(k.split("-")[1]))]
    mean = sum(rewards) / len(rewards)
    return json.dumps([round(r - mean, 6) for r in rewards]).encode()


def rl_step(name: str, tenant: str, variant: str, tasks: int, rollouts: int, image: str) -> Workflow:
    wf = Workflow(name, tenant=tenant)
    candidates = "".join(c + "\n" for c, _ in CANDIDATES).encode()
    sandbox = SandboxSpec(image=image, cpus=1, memory_gb=0.25)
    for t in range(tasks):
        repo = {"/work/repo/fn.sh": f"f() {{ echo $(( $1 * 2 + {t} - 1 )); }}\n".encode(),
                "/work/expect": f"{6 + t}".encode(), "/work/test.sh": TEST_SH.encode()}
        rewards = {}
        for s in range(rollouts):
            roll = wf.sandbox(f"rollout-{t}-{s}", pool="rollouts", sandbox=sandbox, seed=s,
                              command=f"TASK={t} SEED={s} sh /work/policy.sh",
                              files={"/work/policy.sh": POLICY_SH.encode(), "/work/candidates": candidates})
            test = wf.sandbox(f"test-{t}-{s}", pool="tests", sandbox=sandbox, deterministic=True,
                              command="sh /work/test.sh", files=repo, inputs={"/work/patch.sed": roll})
            rewards[f"r-{s}"] = wf.call(f"reward-{t}-{s}", reward(variant), image_or_model=REWARD_IMPL,
                                        params={"variant": variant}, inputs={"verdict": test},
                                        deterministic=True)
        wf.call(f"advantages-{t}", advantages, image_or_model=ADVANTAGE_IMPL, inputs=rewards,
                deterministic=True)
    return wf


def check(run: WorkflowRun, variant: str, tasks: int, rollouts: int) -> list[str]:
    """What is wrong with a run, against the verdicts known in advance."""
    problems = [f"{n}: {o.state} ({o.error})" for n, o in run.ops.items() if o.state != "succeeded"]
    if problems:
        return problems
    on_pass, on_fail = VARIANTS[variant]
    for t in range(tasks):
        for s in range(rollouts):
            script, fixes = CANDIDATES[picked(t, s)]
            if run.output(f"rollout-{t}-{s}").decode().strip() != script:
                problems.append(f"rollout-{t}-{s}: policy stand-in picked {run.output(f'rollout-{t}-{s}')!r}")
            verdict = run.output(f"test-{t}-{s}").decode().strip()
            if verdict != ("PASS" if fixes else "FAIL"):
                problems.append(f"test-{t}-{s}: {verdict} for {script!r}")
            if json.loads(run.output(f"reward-{t}-{s}")) != (on_pass if fixes else on_fail):
                problems.append(f"reward-{t}-{s}: wrong reward")
    return problems


def load_busybox() -> str:
    from flowmesh_sdk.imagebuild import build_busybox
    return build_busybox()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rl_reuse_two_tenants.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=4, help="tasks in the step (default 4)")
    p.add_argument("--rollouts-a", type=int, default=4, help="alice's rollouts per task (default 4)")
    p.add_argument("--rollouts-b", type=int, default=6, help="bob's rollouts per task (default 6)")
    p.add_argument("--sequential", action="store_true",
                   help="run bob after alice (hits) instead of at the same time (joins)")
    p.add_argument("--cas", type=Path, default=None,
                   help="content-addressable store directory (default: a throw-away one)")
    p.add_argument("--image", default=None, help="sandbox image (default: busybox, built if missing)")
    p.add_argument("--json", type=Path, default=None, help="also write the outcome of every operator")
    args = p.parse_args(argv)
    for name in ("tasks", "rollouts_a", "rollouts_b"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    image = args.image or load_busybox()
    steps = [("grpo-binary", "alice", "binary", args.rollouts_a),
             ("grpo-shaped", "bob", "shaped", args.rollouts_b)]
    with contextlib.ExitStack() as stack:
        cas_dir = args.cas or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fm-rl-cas-")))
        async with Fleet("rl-reuse") as fleet:
            fleet.results = ResultReuse(LocalDirStore(cas_dir), resolver=fleet.images, bus=fleet.bus,
                                        fleet=fleet.name, policy=ReusePolicy(cache_failures=True))
            spec = dict(instance=InstanceSpec(cpus=1, memory_gb=1), min_instances=1, max_instances=1,
                        sandboxes_per_instance=2, warm_per_image=0)
            pools = {"rollouts": await fleet.pool(PoolSpec(name="rollouts", **spec)),
                     "tests": await fleet.pool(PoolSpec(name="tests", **spec))}
            wfs = [rl_step(n, t, v, args.tasks, k, image) for n, t, v, k in steps]
            console.print(f"image {image}; {args.tasks} tasks; alice {args.rollouts_a} rollouts/task, "
                          f"bob {args.rollouts_b}; CAS {cas_dir}; "
                          f"{'one after the other' if args.sequential else 'at the same time'}")
            if args.sequential:
                runs = [await wf.run(fleet.results, pools) for wf in wfs]
            else:
                runs = list(await asyncio.gather(*(wf.run(fleet.results, pools) for wf in wfs)))
            counts = fleet.results.counts()
            lineage = fleet.results.lineage()

    problems = [f"{run.workflow}: {p}" for run, (_, _, v, k) in zip(runs, steps)
                for p in check(run, v, args.tasks, k)]
    executed = Counter(e.h_task for e in lineage if e.outcome is ReuseKind.EXECUTED)
    twice = [h for h, n in executed.items() if n > 1]
    if twice and args.cas is None:
        problems.append(f"{len(twice)} identical works ran more than once")
    shared_b = sum(o.reuse in (ReuseKind.HIT, ReuseKind.JOINED) for o in runs[1].ops.values())
    if shared_b == 0:
        problems.append("bob's variant reused nothing")

    table = Table(title="one RL step, two tenants")
    for col in ("workflow", "tenant", "operators", "executed", "joined", "hit", "sandbox runs", "reward mean"):
        table.add_column(col, justify="right")
    for run in runs:
        kinds = Counter(o.reuse for o in run.ops.values())
        sandbox_runs = sum(o.reuse is ReuseKind.EXECUTED and not n.startswith(("reward", "advantages"))
                           for n, o in run.ops.items())
        rewards = [json.loads(o.output) for n, o in run.ops.items()
                   if n.startswith("reward") and o.output is not None]
        table.add_row(run.workflow, run.tenant, str(len(run.ops)), str(kinds[ReuseKind.EXECUTED]),
                      str(kinds[ReuseKind.JOINED]), str(kinds[ReuseKind.HIT]), str(sandbox_runs),
                      f"{sum(rewards) / len(rewards):+.3f}" if rewards else "-")
    console.print(table)
    sandbox_requested = sum(1 for run in runs for n in run.ops if n.startswith(("rollout", "test")))
    sandbox_done = sum(1 for run in runs for n, o in run.ops.items()
                       if n.startswith(("rollout", "test")) and o.reuse is ReuseKind.EXECUTED)
    console.print(f"sandbox tasks: {sandbox_done} run of {sandbox_requested} requested; reuse layer: "
                  f"{counts.executions} executions, {counts.joins} joins, {counts.hits} hits, "
                  f"{counts.compute_saved_s:.1f} sandbox-seconds saved")
    shared = runs[1].ops["test-0-0"].provenance
    if shared is not None:
        console.print(f"bob's test-0-0 got result {shared.result_digest[:19]}... computed by "
                      f"{shared.tenant}/{shared.workflow} (task {shared.task_id}) on {shared.pool}")
    if args.json:
        args.json.write_text(json.dumps({run.workflow: {
            n: {"state": o.state, "reuse": o.reuse.value if o.reuse else None, "h_task": o.h_task,
                "output": o.output.decode(errors="replace") if o.output is not None else None,
                "computed_by": ({"tenant": o.provenance.tenant, "workflow": o.provenance.workflow,
                                 "task_id": o.provenance.task_id} if o.provenance else None)}
            for n, o in run.ops.items()} for run in runs}, indent=2))
    for p in problems:
        console.print(f"[bold red]problem:[/] {p}")
    console.print("[bold green]OK[/]" if not problems else "[bold red]FAILED[/]")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
