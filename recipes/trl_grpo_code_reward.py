#!/usr/bin/env python3
"""TRL's GRPOTrainer with its reward computed in FlowMesh sandboxes: real GRPO steps on
the CPU, every completion's code graded by its task's tests in a sandbox of a pool.

The policy is a tiny randomly initialised causal LM built here
(``flowmesh_sdk.testing.tiny_model``: STANDS IN FOR A REAL CODE MODEL, nothing is
downloaded) whose vocabulary is the tokens of a few arithmetic answers; it answers with
one token (``2``, ``3``, ``*``, ``=`` or nothing), so each group of 8 completions holds
duplicates.  Each prompt carries its tests (the answer must evaluate to N);
``code_reward`` writes a
completion to ``/work/answer.py`` and the tests next to it, runs them in a fresh sandbox
under a per-completion timeout, and rewards 1.0 when they pass.  Identical completions of
the same task run once (the fleet's result reuse: joined in flight, answered from the
store in later steps); one task's tests hang on purpose, so its completions time out and
get reward 0 with a logged reason while the steps go on.

    python recipes/trl_grpo_code_reward.py [--steps N] [--json PATH]

Needs the ``[train]`` extra (trl, transformers, torch, accelerate, datasets).  Offline:
the local provider, the swe-base image, HF_HUB_OFFLINE.  Importable: ``await main([...])``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling _main_job

from rich.table import Table  # noqa: E402

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec  # noqa: E402
from flowmesh_sdk.integrations.trl import code_reward  # noqa: E402
from _main_job import load_main_job  # noqa: E402

job = load_main_job()
console = job.console
ANSWERS = ["2", "3 * 2", "2 * 3", "3", "2 * 2"]


def _tests(want: int) -> str:
    return (f"expr = open('/work/answer.py').read().strip()\n"
            f"assert eval(expr, {{}}) == {want}, expr\n")


TASKS = [("2 =", _tests(2)), ("3 =", _tests(3)),
         ("3 * 2 =", "import time\ntime.sleep(60)   # these tests hang: every completion times out\n")]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trl_grpo_code_reward.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2, help="GRPO steps (default 2)")
    p.add_argument("--timeout", type=float, default=3.0, help="per-completion timeout in s (default 3)")
    p.add_argument("--json", metavar="PATH", help="also write every scored completion as JSON to PATH")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    return args


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the tiny model stands in for a code model; imported once the options are read
    from flowmesh_sdk.testing.tiny_model import OFFLINE_ENV, build_tiny_lm

    os.environ.update(OFFLINE_ENV)
    try:
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        console.print(f"[bold red]needs the train extra:[/] pip install 'flowmesh-sdk[train]' ({exc})")
        return 2
    build = job._load_image_builder()
    await asyncio.to_thread(job.ensure_base, build)
    # the tiny model and the trainer's output live only as long as the run
    with tempfile.TemporaryDirectory(prefix="flowmesh-grpo-") as tmp:
        work = Path(tmp)
        lm = await asyncio.to_thread(build_tiny_lm, work / "tiny", texts=ANSWERS + [p for p, _ in TASKS])
        ds = Dataset.from_list([{"prompt": p, "tests": t} for p, t in TASKS])   # each step: all three
        async with Fleet(name="grpo-reward") as fleet:
            pool = await fleet.pool(PoolSpec(name="rewards", mode="persistent", instance=InstanceSpec(cpus=2, memory_gb=4),
                                             min_instances=1, max_instances=1, sandboxes_per_instance=4))
            reward = code_reward(fleet, pool, spec=SandboxSpec(image=job.BASE_IMAGE, cpus=0.5, memory_gb=0.5),
                                 timeout_s=args.timeout, history=args.steps)
            config = GRPOConfig(output_dir=str(work / "out"), max_steps=args.steps, per_device_train_batch_size=24,
                                num_generations=8, max_completion_length=1, learning_rate=1e-3, logging_steps=1,
                                report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no", seed=0)
            trainer = GRPOTrainer(model=str(lm.model), reward_funcs=[reward], args=config, train_dataset=ds)
            await asyncio.to_thread(trainer.train)   # the reward hops back to this loop for each step
            steps = trainer.state.global_step
    batches = list(reward.history)
    table = Table(title="GRPO rewards from FlowMesh sandboxes", title_justify="left")
    for col in ("step", "completion", "reward", "reason", "reuse", "ran on"):
        table.add_column(col, no_wrap=True)
    for step, batch in enumerate(batches, 1):
        for o in batch:
            table.add_row(str(step), repr(o.answer), f"{o.reward:g}", o.reason,
                          o.reuse.value if o.reuse else "-", o.instance_id or "-")
    console.print(table)
    st = reward.stats
    console.print(f"{steps} GRPO steps; {st.completions} completions scored: {st.executed} sandbox runs, "
                  f"{st.reused} answered by reuse (identical completions), {st.timeouts} timed out, "
                  f"{st.infra_failures} infrastructure failures; reasons {dict(Counter(st.reasons))}")
    means = [h["rewards/flowmesh_code_reward/mean"] for h in trainer.state.log_history
             if "rewards/flowmesh_code_reward/mean" in h]
    console.print(f"TRL's logged reward mean per step: {[round(m, 3) for m in means]}")
    if args.json:
        rows = [{"step": i, **{k: (v.value if hasattr(v, "value") else v) for k, v in vars(o).items()}}
                for i, b in enumerate(batches, 1) for o in b]
        Path(args.json).write_text(json.dumps({"steps": steps, "stats": vars(st), "scored": rows}, indent=2) + "\n")
        console.print(f"results written to {args.json}")
    # 8 one-token completions per prompt: every group holds a duplicate, answered by reuse
    ok = steps == args.steps and st.executed + st.reused + st.infra_failures == st.completions and st.reused > 0
    console.print("[bold green]every step ran; every reward came from a sandbox run or its reuse[/]" if ok else
                  "[bold red]a step did not run, or a reward came from nowhere[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
