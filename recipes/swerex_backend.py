#!/usr/bin/env python3
"""FlowMesh as a SWE-ReX backend: the main job's SWE-style tasks driven through SWE-ReX's
own API -- ``deployment.start()``, ``runtime.create_session``, ``run_in_session`` with
``BashAction``, ``write_file``, ``execute`` and ``read_file`` -- on
``FlowMeshDeployment``, i.e. the calls SWE-agent makes, in sandboxes of a FlowMesh pool.

Each task (``recipes/local_swe_eval.py``'s: a tiny git repository with one bug, a failing
pytest test and a candidate patch, right or wrong) runs in its own image (swe-base plus the
repository committed at ``/work/repo``, built by ``build_task_image`` and cached by
content).  In one bash session: ``cd`` into the repository, run the test (it must fail),
write the patch with ``write_file``, ``git apply`` it, restore ``tests/``, run the test
again; the verdict must be the task's expected one.  Prints each task's verdict and the
p50 of each SWE-ReX call.

    python recipes/swerex_backend.py [--tasks N] [--json PATH]

Offline: the local provider, images built on this host.  Importable: ``await main([...])``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the sibling _swe_tasks, _main_job

from rich.table import Table  # noqa: E402

from flowmesh_sdk.errors import IntegrationMissingError  # noqa: E402
from flowmesh_sdk.integrations import require  # noqa: E402
import _swe_tasks as recipe  # noqa: E402

job = recipe.job
console = recipe.console
PYTEST = "python3 -m pytest -q -p no:cacheprovider"


async def solve(pool: Any, task: Any, image: str) -> dict[str, Any]:
    """One task through SWE-ReX's calls, as SWE-agent makes them."""
    # the [swerex] extra, imported here so that --help needs only the base install
    from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest, ReadFileRequest, WriteFileRequest

    from flowmesh_sdk.integrations.swerex import FlowMeshDeployment

    calls: dict[str, list[float]] = defaultdict(list)

    async def call(name: str, coro: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await coro
        finally:
            calls[name].append(time.perf_counter() - t0)

    deployment = FlowMeshDeployment(pool, image=image, name=f"swerex-{task.name}")   # was: DockerDeployment(image=...)
    await call("start", deployment.start())
    try:
        rt = deployment.runtime
        await call("create_session", rt.create_session(CreateBashSessionRequest(startup_timeout=10)))

        async def bash(cmd: str) -> Any:
            return await call("run_in_session", rt.run_in_session(BashAction(command=cmd, timeout=job.TASK_TIMEOUT_S,
                                                                             check="silent")))

        await bash(f"cd {job.REPO} && export PYTHONDONTWRITEBYTECODE=1")
        clean = (await bash("git status --porcelain")).output.strip() == ""
        before = await bash(PYTEST)
        await call("write_file", rt.write_file(WriteFileRequest(path=job.PATCH, content=task.patch.decode())))
        applied = await bash(f"git apply --whitespace=nowarn {job.PATCH}")
        await bash("git checkout -q HEAD -- tests")
        after = await bash(PYTEST)
        head = await call("execute", rt.execute(Command(command=["git", "-C", job.REPO, "rev-parse", "HEAD"],
                                                        check=True)))
        shipped = await call("read_file", rt.read_file(ReadFileRequest(path=job.PATCH)))
    finally:
        await call("stop", deployment.stop())
    if not clean or before.exit_code == 0 or applied.exit_code != 0 or shipped.content != task.patch.decode():
        got = "error"
    else:
        got = "pass" if after.exit_code == 0 else "fail"
    return {"task": task.name, "patch": task.patch_kind, "how": task.how, "expected": task.expected, "got": got,
            "matched": got == task.expected, "commit": head.stdout.strip()[:12],
            "pytest_tail": after.output.strip().splitlines()[-1:] or [""], "calls_s": dict(calls)}


def tables(rows: list[dict[str, Any]]) -> tuple[Table, Table]:
    t = Table(title="SWE-ReX calls on FlowMesh sandboxes", title_justify="left")
    for col in ("task", "patch", "expected", "got", "verdict", "commit", "pytest"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        t.add_row(r["task"], r["patch"] + ("" if r["patch"] == "right" else f": {r['how']}"), r["expected"], r["got"],
                  "[green]✓[/]" if r["matched"] else "[bold red]✗[/]", r["commit"], r["pytest_tail"][0])
    lat = Table(title="per call, over every task (ms)", title_justify="left")
    for col in ("call", "n", "p50", "max"):
        lat.add_column(col, justify="left" if col == "call" else "right")
    merged: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r["calls_s"].items():
            merged[k].extend(v)
    for k, v in merged.items():
        lat.add_row(k, str(len(v)), f"{statistics.median(v) * 1e3:.1f}", f"{max(v) * 1e3:.1f}")
    return t, lat


async def main(argv: list[str] | None = None) -> int:
    args = recipe.parse_args("swerex_backend.py", __doc__, argv)
    try:
        require("swerex", package="swe-rex", extra="swerex")
    except IntegrationMissingError as exc:
        console.print(f"[bold red]{exc}[/]")
        return 2

    def show(rows: list[dict[str, Any]]) -> None:
        for t in tables(rows):
            console.print(t)

    return await recipe.run_recipe(args, "swerex-backend", "each driven through SWE-ReX's calls on "
                                   "FlowMeshDeployment", solve, show)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
