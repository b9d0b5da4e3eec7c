#!/usr/bin/env python3
"""mini-swe-agent's own agent loop on FlowMesh sandboxes: the main job's SWE-style tasks
solved step by step through ``FlowMeshEnvironment``, and each submitted patch graded in a
fresh sandbox.

Each task (``recipes/local_swe_eval.py``'s: a tiny git repository with one bug, a pytest
test failing because of it, and a candidate patch, right or wrong) gets its image
(``build_task_image``: swe-base plus the repository committed at ``/work/repo``; cached
by content).  In a sandbox of that image mini-swe-agent's ``DefaultAgent`` -- with the
package's own ``default.yaml`` prompts -- runs until it submits: the model is
mini-swe-agent's ``DeterministicModel`` fed a SCRIPTED POLICY that STANDS IN FOR AN LLM
(look at the repository and run the tests, apply the task's candidate patch, run the tests
again, submit ``git diff``), so every action goes through the environment and the sandbox
for real.  The submission (the agent's ``git diff``, read from the sandbox) is then graded
like the main job grades a patch (the test must fail before, ``git apply``, ``tests/``
restored, pytest) in a fresh sandbox of the same image; right patches must pass and wrong
ones fail.

    python recipes/mini_swe_agent_eval.py [--tasks N] [--json PATH]

Offline: the local provider, images built on this host, nothing downloaded.  Importable:
``await main(["--tasks", "2"])`` returns the exit status.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling _swe_tasks, _main_job

from rich.table import Table  # noqa: E402

from flowmesh_sdk import Task  # noqa: E402
from flowmesh_sdk.errors import IntegrationMissingError  # noqa: E402
from flowmesh_sdk.integrations import require  # noqa: E402
import _swe_tasks as recipe  # noqa: E402

# mini-swe-agent (the [minisweagent] extra) and its yaml are imported where they are used,
# so that --help needs only the base install

job = recipe.job
console = recipe.console
STEP_TIMEOUT_S = 120
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"


def scripted_policy(task: Any) -> list[dict]:
    """A SCRIPTED POLICY STANDING IN FOR AN LLM: the actions a model would take, as
    mini-swe-agent's DeterministicModel outputs (one bash action each)."""
    from minisweagent.models.test_models import make_output

    patch = task.patch.decode()
    steps = [
        ("Look at the repository and run its tests.",
         "git status --short && ls -R && python3 -m pytest -q -p no:cacheprovider"),
        (f"The test fails; apply my fix ({task.how}).", f"git apply --whitespace=nowarn <<'FM_PATCH'\n{patch}FM_PATCH"),
        ("Run the tests again.", "python3 -m pytest -q -p no:cacheprovider"),
        ("Submit the change.", SUBMIT),
    ]
    return [make_output(f"THOUGHT: {thought}\n\n```mswea_bash_command\n{cmd}\n```", [{"command": cmd}])
            for thought, cmd in steps]


def agent_config() -> dict[str, Any]:
    """mini-swe-agent's own default agent config (prompts and limits)."""
    import yaml   # a dependency of mini-swe-agent
    from minisweagent.config import builtin_config_dir

    cfg = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
    agent = dict(cfg["agent"])
    agent.update(step_limit=10, cost_limit=0.0)
    return agent


def task_text(task: Any) -> str:
    return (f"`python3 -m pytest -q` fails in {job.REPO} ({task.bug}). Fix the code, not the test, "
            "and submit your change.")


async def solve(pool: Any, task: Any, image: str) -> dict[str, Any]:
    """mini-swe-agent's agent loop on a sandbox of the task's image; its submission."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.test_models import DeterministicModel

    from flowmesh_sdk.integrations.minisweagent import FlowMeshEnvironment

    t0 = time.monotonic()
    async with pool.sandbox(pool.default_sandbox(image), name=f"agent-{task.name}") as sb:
        env = FlowMeshEnvironment(sandbox=sb, cwd=job.REPO, timeout=STEP_TIMEOUT_S,
                                  env={"PYTHONDONTWRITEBYTECODE": "1", "PAGER": "cat"})
        agent = DefaultAgent(DeterministicModel(outputs=scripted_policy(task)), env, **agent_config())
        info = await asyncio.to_thread(agent.run, task_text(task))   # the agent is synchronous
        traj = agent.serialize()
    # the exit code of each action, as the agent saw it (rendered into its observations)
    codes = [int(c) for m in agent.messages if m.get("role") == "user"
             for c in re.findall(r"<returncode>(-?\d+)</returncode>", str(m.get("content", "")))]
    return {"exit_status": info.get("exit_status", ""), "submission": info.get("submission", ""),
            "model_calls": agent.n_calls, "step_exit_codes": codes,
            "sandbox": traj["info"]["config"]["sandbox"]["name"], "agent_s": time.monotonic() - t0}


async def grade(pool: Any, task: Any, image: str, patch: str) -> str:
    """The main job's verdict on ``patch`` in a fresh sandbox of the task's image."""
    res = await pool.run_task(Task(name=f"grade-{task.name}", sandbox=pool.default_sandbox(image),
                                   command=job.TASK_SCRIPT, files={job.PATCH: patch.encode()},
                                   timeout_s=job.TASK_TIMEOUT_S))
    return job.verdict_of(res)


async def run_one(pool: Any, task: Any, image: str) -> dict[str, Any]:
    row = {"task": task.name, "patch": task.patch_kind, "how": task.how, "expected": task.expected}
    row.update(await solve(pool, task, image))
    row["got"] = (await grade(pool, task, image, row["submission"])
                  if row["exit_status"] == "Submitted" and row["submission"].strip() else "no-submission")
    row["matched"] = row["got"] == task.expected
    return row


def table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="mini-swe-agent on FlowMesh sandboxes", title_justify="left")
    for col in ("task", "patch", "expected", "exit status", "model calls", "step exits", "patch lines", "got",
                "verdict", "agent s"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        t.add_row(r["task"], r["patch"] + ("" if r["patch"] == "right" else f": {r['how']}"), r["expected"],
                  r["exit_status"], str(r["model_calls"]), ",".join(map(str, r["step_exit_codes"])),
                  str(len(r["submission"].splitlines())), r["got"],
                  "[green]✓[/]" if r["matched"] else "[bold red]✗[/]", f"{r['agent_s']:.1f}")
    return t


async def main(argv: list[str] | None = None) -> int:
    args = recipe.parse_args("mini_swe_agent_eval.py", __doc__, argv)
    try:
        require("minisweagent", package="mini-swe-agent", extra="minisweagent")
    except IntegrationMissingError as exc:
        console.print(f"[bold red]{exc}[/]")
        return 2
    return await recipe.run_recipe(args, "mini-swe-agent", "the model is a scripted policy standing in for "
                                   "an LLM (mini-swe-agent's DeterministicModel)", run_one,
                                   lambda rows: console.print(table(rows)))


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
