"""What the integration recipes that solve the main job's tasks share (swerex_backend.py,
mini_swe_agent_eval.py): their command line, the tasks each built into its own image,
the pool they run in, and the verdict summary."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec

from _main_job import load_main_job

job = load_main_job()
console = job.console


def parse_args(prog: str, doc: str, argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=4, metavar="N", help="number of tasks (default 4)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = p.parse_args(argv)
    if args.tasks < 1:
        p.error("--tasks must be at least 1")
    return args


async def task_images(n: int) -> tuple[list[Any], dict[str, str]]:
    """The main job's first ``n`` tasks and an image per task (swe-base plus the repository
    committed at /work/repo; ``build_task_image`` caches them by content)."""
    build = job._load_image_builder()
    await asyncio.to_thread(job.ensure_base, build)
    tasks = job.make_tasks(n)
    return tasks, {t.name: await asyncio.to_thread(build.build_task_image, t.name, t.repo_files) for t in tasks}


@contextlib.asynccontextmanager
async def task_pool(fleet_name: str) -> AsyncIterator[Any]:
    """A persistent pool on this host: one 2-cpu instance, two sandboxes at a time, no warm
    containers (a warm container of one task's image cannot serve another task)."""
    async with Fleet(name=fleet_name) as fleet:
        yield await fleet.pool(PoolSpec(name="tasks", mode="persistent", instance=InstanceSpec(cpus=2, memory_gb=4),
                                        min_instances=1, max_instances=1, sandboxes_per_instance=2,
                                        warm_per_image=0))


async def run_recipe(args: argparse.Namespace, fleet_name: str, intro: str,
                     one: Callable[[Any, Any, str], Awaitable[dict[str, Any]]],
                     show: Callable[[list[dict[str, Any]]], None]) -> int:
    """Build the images, run ``one(pool, task, image)`` for every task at once, ``show`` the
    rows, write ``--json``; 0 when every row's verdict ``matched``."""
    try:
        tasks, images = await task_images(args.tasks)
    except Exception as exc:  # noqa: BLE001 - ImageBuildError and friends, reported plainly
        console.print(f"[bold red]images not available:[/] {exc}")
        return 2
    console.print(f"{len(tasks)} tasks, one image each FROM {job.BASE_IMAGE}; {intro}")
    async with task_pool(fleet_name) as pool:
        rows = list(await asyncio.gather(*(one(pool, t, images[t.name]) for t in tasks)))
    show(rows)
    ok = all(r["matched"] for r in rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"ok": ok, "results": rows}, indent=2) + "\n")
        console.print(f"results written to {args.json}")
    console.print("[bold green]every verdict matched its expectation[/]" if ok else
                  f"[bold red]{sum(not r['matched'] for r in rows)} verdict(s) did not match[/]")
    return 0 if ok else 1
